"""SandboxClaim logic without I/O: argument validation, the manifest, reading claim/Sandbox status.

`ClaimView.failure()` is the one place where claim condition reasons map to exceptions (spec §0.2).
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ._checks import check_timeout
from .constants import (
    AUTO_RESUME_ANNOTATION,
    CLAIM_API_GROUP,
    CLAIM_API_VERSION,
    CLAIM_KIND,
    CLIENT_REQUEST_TIME_ANNOTATION,
    CREATED_BY_LABEL,
    CREATED_BY_VALUE,
    POD_NAME_ANNOTATION,
    REASON_RECONCILER_ERROR,
    REASON_TEMPLATE_NOT_FOUND,
    REASON_WARM_POOL_NOT_FOUND,
    SANDBOX_NAME_HASH_LABEL,
    SANDBOX_TEMPLATE_REF_ANNOTATION,
    TERMINAL_CLAIM_READY_REASONS,
)
from .exceptions import (
    SandboxClaimFailedError,
    SandboxError,
    SandboxNotFoundError,
    SandboxTemplateNotFoundError,
    SandboxWarmPoolNotFoundError,
)
from .models import AdditionalPodMetadata, SandboxClaimEnvVar

__all__ = [
    "MAX_SHUTDOWN_AFTER_SECONDS",
    "ClaimView",
    "SandboxView",
    "build_claim",
    "check_adoption",
    "new_claim_name",
    "select_pod_ip",
    "validate_claim_name",
    "validate_create_args",
    "validate_labels",
]

_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def new_claim_name() -> str:
    """`sandbox-claim-<8 lowercase hex>`: a DNS label, so it can also name the Sandbox (X-Sandbox-ID)."""
    return f"sandbox-claim-{secrets.token_hex(4)}"


def _check_label_key(key: str, what: str) -> None:
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise ValueError(f"{what} key {key!r}: the prefix must be a DNS subdomain of at most 253 characters")
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        raise ValueError(
            f"{what} key {key!r}: the name must be 1-63 characters of [A-Za-z0-9-_.], "
            "starting and ending with an alphanumeric"
        )


def validate_labels(labels: Mapping[str, str], what: str = "label") -> None:
    """`ValueError` naming the first key or value that breaks Kubernetes label syntax."""
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"{what} {key!r}: keys and values must be strings")
        _check_label_key(key, what)
        if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
            raise ValueError(
                f"{what} {key!r}: value {value!r} must be at most 63 characters of [A-Za-z0-9-_.], "
                "starting and ending with an alphanumeric"
            )


def _check_str_mapping(name: str, mapping: object) -> None:
    if mapping is None:
        return
    if not isinstance(mapping, Mapping):
        raise ValueError(f"{name} must be a dict of strings to strings, got {type(mapping).__name__}")
    for key, value in mapping.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"{name} {key!r}: keys and values must be strings, got {value!r}")


def validate_claim_name(name: str) -> None:
    """An explicit claim name must be a DNS-1123 subdomain of at most 253 characters."""
    if not name or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise ValueError(
            f"claim_name {name!r} must be a DNS-1123 subdomain (lowercase, at most 253 characters)"
        )


def validate_create_args(
    *,
    warmpool: str,
    namespace: str,
    labels: Mapping[str, str] | None,
    pod_labels: Mapping[str, str] | None,
    pod_annotations: Mapping[str, str] | None,
    shutdown_after_seconds: int | None,
    claim_name: str | None,
    adopt_existing: bool,
    sandbox_ready_timeout: float,
    env: Mapping[str, str] | None = None,
    volume_claim_templates: Sequence[Mapping[str, Any]] | None = None,
) -> None:
    """Check `create_sandbox` arguments before any request (spec §3.7 step 1). Each message names the
    parameter: a list where a dict belongs failed deep inside with `'list' object has no attribute 'items'`
    (until December 6)."""
    for name, mapping in (
        ("labels", labels),
        ("pod_labels", pod_labels),
        ("pod_annotations", pod_annotations),
        ("env", env),
    ):
        _check_str_mapping(name, mapping)
    if volume_claim_templates is not None and (
        isinstance(volume_claim_templates, str | bytes | Mapping)
        or not isinstance(volume_claim_templates, Sequence)
        or not all(isinstance(t, Mapping) for t in volume_claim_templates)
    ):
        raise ValueError(
            "volume_claim_templates must be a list of PersistentVolumeClaim templates (dicts), got "
            f"{type(volume_claim_templates).__name__}"
        )
    if not isinstance(warmpool, str) or not warmpool:
        raise ValueError("warmpool must be a non-empty warm pool name")
    if not _DNS_SUBDOMAIN.match(warmpool) or len(warmpool) > 253:
        raise ValueError(f"warmpool {warmpool!r} is not a valid object name (DNS-1123 subdomain)")
    if not namespace or not _DNS_LABEL.match(namespace) or len(namespace) > 63:
        raise ValueError(f"namespace {namespace!r} is not a valid namespace name (DNS-1123 label)")
    if labels:
        validate_labels(labels, "label")
    if pod_labels:
        validate_labels(pod_labels, "pod label")
    if pod_annotations is not None:
        for key in pod_annotations:
            _check_label_key(key, "pod annotation")
    if shutdown_after_seconds is not None and (
        isinstance(shutdown_after_seconds, bool)
        or not isinstance(shutdown_after_seconds, int)
        or shutdown_after_seconds <= 0
        or shutdown_after_seconds > MAX_SHUTDOWN_AFTER_SECONDS
    ):
        raise ValueError(
            f"shutdown_after_seconds must be a positive integer up to {MAX_SHUTDOWN_AFTER_SECONDS} (100 years), "
            f"got {shutdown_after_seconds!r}"
        )
    if claim_name is not None:
        validate_claim_name(claim_name)
    if adopt_existing and claim_name is None:
        raise ValueError("adopt_existing=True requires an explicit claim_name")
    check_timeout(sandbox_ready_timeout, "sandbox_ready_timeout")
    if sandbox_ready_timeout is None:
        raise ValueError("sandbox_ready_timeout must be a positive number of seconds, got None")


#: A shutdown this far ahead is "never"; beyond it the timestamp no longer fits (OverflowError from datetime).
MAX_SHUTDOWN_AFTER_SECONDS = 100 * 365 * 86400
"""The largest `shutdown_after_seconds` (100 years): the CLI checks `--shutdown-after` against it."""


def build_claim(
    *,
    name: str,
    warmpool: str,
    labels: Mapping[str, str] | None = None,
    shutdown_after_seconds: int | None = None,
    volume_claim_templates: Sequence[Mapping[str, Any]] | None = None,
    pod_labels: Mapping[str, str] | None = None,
    pod_annotations: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The SandboxClaim manifest `create_sandbox` POSTs (spec §3.7 step 3)."""
    now = now or datetime.now(UTC)
    spec: dict[str, Any] = {"warmPoolRef": {"name": warmpool}}
    if shutdown_after_seconds is not None:
        shutdown = (now + timedelta(seconds=shutdown_after_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
        spec["lifecycle"] = {"shutdownTime": shutdown, "shutdownPolicy": "Delete"}
    if volume_claim_templates:
        spec["volumeClaimTemplates"] = [dict(t) for t in volume_claim_templates]
    if pod_labels or pod_annotations:
        meta = AdditionalPodMetadata(
            labels=dict(pod_labels) if pod_labels else None,
            annotations=dict(pod_annotations) if pod_annotations else None,
        )
        spec["additionalPodMetadata"] = meta.model_dump(exclude_none=True)
    if env:
        spec["env"] = [
            SandboxClaimEnvVar(name=k, value=v).model_dump(by_alias=True, exclude_none=True)
            for k, v in env.items()
        ]
    return {
        "apiVersion": f"{CLAIM_API_GROUP}/{CLAIM_API_VERSION}",
        "kind": CLAIM_KIND,
        "metadata": {
            "name": name,
            "labels": {**(labels or {}), CREATED_BY_LABEL: CREATED_BY_VALUE},
            "annotations": {CLIENT_REQUEST_TIME_ANNOTATION: now.isoformat()},
        },
        "spec": spec,
    }


def select_pod_ip(ips: Sequence[object] | None) -> str | None:
    """The first IPv4 address (IPv4-mapped IPv6 converted), else the first valid address, else None."""
    valid: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for raw in ips or ():
        if isinstance(raw, Mapping):  # core/v1 PodIP objects: {"ip": ...}
            raw = raw.get("ip")
        if not isinstance(raw, str):
            continue
        try:
            ip = ipaddress.ip_address(raw.strip())
        except ValueError:
            continue
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        valid.append(ip)
    for ip in valid:
        if ip.version == 4:
            return str(ip)
    return str(valid[0]) if valid else None


def _conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    conds = (obj.get("status") or {}).get("conditions") or []
    return [c for c in conds if isinstance(c, Mapping)]


def _ready_condition(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((c for c in _conditions(obj) if c.get("type") == "Ready"), None)


@dataclass(frozen=True, slots=True)
class ClaimView:
    """What the SDK reads from a SandboxClaim object."""

    name: str
    namespace: str
    uid: str | None
    resource_version: str | None
    deleting: bool
    warmpool: str | None
    sandbox_name: str | None
    pod_ip: str | None
    ready: bool
    reason: str | None
    message: str | None
    warm_pool_missing: bool

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ClaimView:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        ref = status.get("sandbox") or {}
        ready = _ready_condition(obj)
        return cls(
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or ""),
            uid=meta.get("uid"),
            resource_version=meta.get("resourceVersion"),
            deleting=bool(meta.get("deletionTimestamp")),
            warmpool=((obj.get("spec") or {}).get("warmPoolRef") or {}).get("name"),
            sandbox_name=ref.get("name") or ref.get("Name") or None,
            pod_ip=select_pod_ip(ref.get("podIPs")),
            ready=ready is not None and ready.get("status") == "True",
            reason=ready.get("reason") if ready else None,
            message=ready.get("message") if ready else None,
            warm_pool_missing=any(c.get("reason") == REASON_WARM_POOL_NOT_FOUND for c in _conditions(obj)),
        )

    @property
    def bound_and_ready(self) -> bool:
        """Usable: a Sandbox is bound and the claim is `Ready=True` (spec §3.7 step 6)."""
        return bool(self.sandbox_name) and self.ready

    @property
    def untouched(self) -> bool:
        """No Ready condition and no binding: no controller has written this claim's status."""
        return self.reason is None and self.message is None and not self.ready and not self.sandbox_name

    def describe(self) -> str:
        """`Ready=False, reason X: message` (or `no Ready condition yet`), for error messages."""
        if self.reason is None and self.message is None and not self.ready:
            return "no Ready condition yet"
        state = "True" if self.ready else "False"
        text = f"Ready={state}, reason {self.reason or '(none)'}"
        return f"{text}: {self.message}" if self.message else text

    def failure(self) -> SandboxError | None:
        """The exception a waiting client raises for this state, or None to keep waiting (spec §0.2)."""
        where = f"SandboxClaim {self.namespace}/{self.name}"
        kw: dict[str, Any] = {"reason": self.reason, "condition_message": self.message}
        if self.warm_pool_missing:
            return SandboxWarmPoolNotFoundError(
                f"{where}: warm pool {self.warmpool!r} not found ({self.describe()})",
                reason=REASON_WARM_POOL_NOT_FOUND,
                condition_message=self.message,
            )
        if self.ready:
            return None
        if self.reason == REASON_TEMPLATE_NOT_FOUND:
            return SandboxTemplateNotFoundError(
                f"{where}: sandbox template not found ({self.describe()})", **kw
            )
        if self.reason in TERMINAL_CLAIM_READY_REASONS:
            return SandboxClaimFailedError(f"{where} failed: {self.describe()}", **kw)
        if self.reason == REASON_RECONCILER_ERROR and any(
            r in (self.message or "") for r in _REJECTED_FOR_GOOD
        ):
            # Ours (upstream keeps waiting): the API server refused a child object as invalid (`Pod "x" is
            # invalid: spec.containers[0].name: ...`, HTTP 422) or against the namespace's Pod Security level
            # (`pods "x" is forbidden: violates PodSecurity "restricted:latest": ...`). Neither changes on a
            # retry, so the claim cannot become Ready: say so now, naming the field, not after the timeout.
            return SandboxClaimFailedError(f"{where} failed: {self.describe()}", **kw)
        return None


#: What the API server's refusals that no retry heals say, in a controller's `Error seen: ...` message: a
#: 422 (`Invalid`), and Pod Security admission's 403 (a quota's 403, "exceeded quota", can heal: not here).
_REJECTED_FOR_GOOD = (" is invalid: ", " is forbidden: violates PodSecurity ")


def check_adoption(obj: Mapping[str, Any] | None, claim_name: str, warmpool: str) -> ClaimView:
    """An existing claim may be adopted only if it is alive, complete and draws from the same pool."""
    if obj is None:
        raise SandboxNotFoundError(f"SandboxClaim {claim_name!r} to adopt does not exist")
    view = ClaimView.of(obj)
    if view.deleting:
        raise SandboxNotFoundError(f"SandboxClaim {claim_name!r} is being deleted; it cannot be adopted")
    if not view.uid or not view.resource_version:
        raise SandboxNotFoundError(f"SandboxClaim {claim_name!r} has no uid/resourceVersion; cannot adopt it")
    if view.warmpool != warmpool:
        raise ValueError(
            f"SandboxClaim {claim_name!r} exists with warm pool {view.warmpool!r}, not {warmpool!r}; "
            "choose another claim_name"
        )
    return view


@dataclass(frozen=True, slots=True)
class SandboxView:
    """What the SDK reads from a Sandbox object."""

    name: str
    ready: bool
    reason: str | None
    message: str | None
    pod_ip: str | None
    service_fqdn: str | None
    pod_name: str
    name_hash: str | None
    operating_mode: str | None
    #: Ours: the Sandbox's own `lifecycle.agents.x-k8s.io/auto-resume` value (None: not set on it).
    auto_resume: str | None = None
    #: Ours: the SandboxTemplate it was made from (`agents.x-k8s.io/sandbox-template-ref`), if any.
    template: str | None = None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> SandboxView:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        status = obj.get("status") or {}
        ready = _ready_condition(obj)
        name = str(meta.get("name") or "")
        name_hash = None
        for part in str(status.get("selector") or "").split(","):
            key, _, value = part.strip().partition("=")
            if key == SANDBOX_NAME_HASH_LABEL and value:
                name_hash = value
        return cls(
            name=name,
            ready=ready is not None and ready.get("status") == "True",
            reason=ready.get("reason") if ready else None,
            message=ready.get("message") if ready else None,
            pod_ip=select_pod_ip(status.get("podIPs")),
            service_fqdn=status.get("serviceFQDN") or None,
            pod_name=annotations.get(POD_NAME_ANNOTATION) or name,
            name_hash=name_hash,
            operating_mode=(obj.get("spec") or {}).get("operatingMode"),
            auto_resume=annotations.get(AUTO_RESUME_ANNOTATION),
            template=annotations.get(SANDBOX_TEMPLATE_REF_ANNOTATION) or None,
        )

    @classmethod
    def from_claim(cls, claim: ClaimView) -> SandboxView:
        """What the claim's status says of its Sandbox, for credentials that may not read Sandboxes: the
        claim's Ready mirrors the Sandbox's and `status.sandbox.podIPs` copies its pod IPs; the pod is taken
        to be named after the Sandbox, and the operating mode is unknown."""
        name = claim.sandbox_name or ""
        return cls(
            name=name,
            ready=claim.ready,
            reason=claim.reason,
            message=claim.message,
            pod_ip=claim.pod_ip,
            service_fqdn=None,
            pod_name=name,
            name_hash=None,
            operating_mode=None,
        )

    def status_pair(self) -> tuple[str, str]:
        """`Sandbox.status()`'s answer: (`SandboxReady`|`SandboxNotReady`, message)."""
        if self.ready:
            return "SandboxReady", self.message or ""
        return "SandboxNotReady", self.message or "Unknown message"
