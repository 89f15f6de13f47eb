"""Claim `additionalPodMetadata`: validation against the label-domain allow-list, and the no-override merge.

Implements controllers spec §4.7.1 (validation) and §4.7.2 (merge), api spec §5.6. Pure functions.

Validation order per key follows upstream: qualified-name syntax, router spoofing, domain prefix required,
domain allowed, value syntax. Keys are checked in sorted order so the reported key is deterministic
(upstream leaves it unspecified).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from agent_sandbox.api import constants as c

from .errors import InvalidMetadata, ReconcilerError

__all__ = [
    "DEFAULT_ALLOWED_LABEL_DOMAINS",
    "additional_metadata",
    "has_additional_metadata",
    "merge_no_override",
    "qualified_name_errors",
    "validate_additional_metadata",
]

DEFAULT_ALLOWED_LABEL_DOMAINS: Final = ("sandbox.users.io",)
_RESTRICTED_ANNOTATION_DOMAINS: Final = ("kubernetes.io", "k8s.io", "agents.x-k8s.io")

_NAME_RE: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE_RE: Final = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS1123_SUBDOMAIN_RE: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def qualified_name_errors(key: str) -> list[str]:
    """apimachinery `IsQualifiedName`: optional DNS-subdomain prefix + '/' + a name of <= 63 chars."""
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ["prefix part must be non-empty"]
        if len(prefix) > 253:
            return ["prefix part must be no more than 253 characters"]
        if not _DNS1123_SUBDOMAIN_RE.match(prefix):
            return ["prefix part must be a lowercase RFC 1123 subdomain"]
    else:
        return [
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and "
            "end with an alphanumeric character with an optional DNS subdomain prefix and '/'"
        ]
    if not name:
        return ["name part must be non-empty"]
    if len(name) > 63:
        return ["name part must be no more than 63 characters"]
    if not _NAME_RE.match(name):
        return [
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character"
        ]
    return []


def _label_value_errors(value: str) -> list[str]:
    if len(value) > 63:
        return ["must be no more than 63 characters"]
    if not _LABEL_VALUE_RE.match(value):
        return [
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character"
        ]
    return []


def _in_domains(prefix: str, domains: Iterable[str]) -> bool:
    prefix = prefix.lower()
    return any(prefix == d or prefix.endswith("." + d) for d in domains)


def _label_error(key: str, value: str, domains: Sequence[str]) -> str | None:
    errs = qualified_name_errors(key)
    if errs:
        return "; ".join(errs)
    if key.lower() == c.LABEL_APP and value.lower() == c.SANDBOX_ROUTER_APP:
        return f"label {c.LABEL_APP}={c.SANDBOX_ROUTER_APP} is reserved for the sandbox router"
    prefix, sep, _ = key.rpartition("/")
    if not sep:
        return "domain prefix required"
    if not _in_domains(prefix, domains):
        return f"domain {prefix.lower()!r} is not in the allowed label domains {list(domains)}"
    errs = _label_value_errors(value)
    return "; ".join(errs) if errs else None


def _annotation_error(key: str) -> str | None:
    errs = qualified_name_errors(key)
    if errs:
        return "; ".join(errs)
    prefix, sep, _ = key.rpartition("/")
    if sep and key != c.ANNOTATION_SAFE_TO_EVICT and _in_domains(prefix, _RESTRICTED_ANNOTATION_DOMAINS):
        return f"domain {prefix.lower()!r} is restricted"
    return None


def additional_metadata(claim: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The claim's `spec.additionalPodMetadata` (labels, annotations), empty when unset."""
    meta = (claim.get("spec") or {}).get("additionalPodMetadata") or {}
    return dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})


def has_additional_metadata(claim: Mapping[str, Any]) -> bool:
    labels, annotations = additional_metadata(claim)
    return bool(labels or annotations)


def validate_additional_metadata(claim: Mapping[str, Any], allowed_domains: Sequence[str]) -> None:
    """Check every key/value of `spec.additionalPodMetadata` (§4.7.1).

    Args:
        allowed_domains: the allow-list read at start-up; empty means `sandbox.users.io`.

    Raises:
        InvalidMetadata: `invalid additionalPodMetadata: failed to validate label|annotation "<k>": <detail>`.
    """
    domains = tuple(allowed_domains) or DEFAULT_ALLOWED_LABEL_DOMAINS
    labels, annotations = additional_metadata(claim)
    for key in sorted(labels):
        detail = _label_error(key, labels[key], domains)
        if detail:
            raise InvalidMetadata(
                f'invalid additionalPodMetadata: failed to validate label "{key}": {detail}'
            )
    for key in sorted(annotations):
        detail = _annotation_error(key)
        if detail:
            raise InvalidMetadata(
                f'invalid additionalPodMetadata: failed to validate annotation "{key}": {detail}'
            )


def merge_no_override(target: dict[str, str], extra: Mapping[str, str], *, what: str) -> None:
    """Copy `extra` into `target` in place; a key already there with a different value is an error (§4.7.2).

    Args:
        what: "label" or "annotation" (for the message).

    Raises:
        ReconcilerError: `metadata override conflict: ...` (backoff, Ready reason ReconcilerError).
    """
    for key in sorted(extra):
        value = extra[key]
        have = target.get(key)
        if have is not None and have != value:
            raise ReconcilerError(
                f'metadata override conflict: {what} "{key}" is defined in template with value "{have}", '
                f'but claim requests "{value}"'
            )
        target[key] = value
