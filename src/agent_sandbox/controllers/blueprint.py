"""The Sandbox blueprint of a SandboxTemplate: what the warm pool builds and the claim adopts or creates.

Owns the pieces of controllers spec §3.8 that the warm pool and the claim controller must compute the same
way, so they can never disagree:

* the secure pod defaults (`apply_secure_defaults`), shared with the claim's cold path (§4.7);
* the template blueprint, its two hashes (§3.8.1) and the blueprint comparison (§3.8.2);
* "semantic" equality (§0.5: a missing map/list equals an empty one, quantities compare by value).

Pure functions over raw wire dicts (no I/O).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Final

import orjson

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming

__all__ = [
    "PUBLIC_NAMESERVERS",
    "apply_secure_defaults",
    "blueprint",
    "blueprint_hash",
    "blueprint_matches",
    "is_secure_by_default",
    "pod_template_hash",
    "semantic_equal",
]

PUBLIC_NAMESERVERS: Final = ("8.8.8.8", "1.1.1.1")


# --------------------------------------------------------------------------- secure defaults (§3.8)


def is_secure_by_default(template_spec: Mapping[str, Any]) -> bool:
    """Management empty or `Managed`, and no custom `networkPolicy`."""
    management = template_spec.get("networkPolicyManagement") or c.NetworkPolicyManagement.MANAGED
    return management == c.NetworkPolicyManagement.MANAGED and template_spec.get("networkPolicy") is None


def apply_secure_defaults(template_spec: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `pod_spec` with the secure defaults applied (the input is not modified).

    1. `automountServiceAccountToken` unset -> false (explicit values kept).
    2. Secure-by-default templates with no `dnsPolicy`: `dnsPolicy: None` and public nameservers, so
       the default egress policy (which blocks cluster DNS) still resolves public names.
    """
    out = dict(pod_spec)
    if out.get("automountServiceAccountToken") is None:
        out["automountServiceAccountToken"] = False
    if not out.get("dnsPolicy") and is_secure_by_default(template_spec):
        out["dnsPolicy"] = "None"
        out["dnsConfig"] = {"nameservers": list(PUBLIC_NAMESERVERS)}
    return out


# --------------------------------------------------------------------------- blueprint and hashes (§3.8.1)


def blueprint(template_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The Sandbox blueprint part of a template spec: podTemplate, volumeClaimTemplates, service.

    Empty/unset members are omitted, as Go's `omitempty` does, so hashes do not depend on them.
    """
    out: dict[str, Any] = {"podTemplate": template_spec.get("podTemplate") or {}}
    if template_spec.get("volumeClaimTemplates"):
        out["volumeClaimTemplates"] = template_spec["volumeClaimTemplates"]
    if template_spec.get("service") is not None:
        out["service"] = template_spec["service"]
    return out


def _hash_json(value: Any) -> str:
    # Sorted keys make the encoding deterministic within this implementation; byte equality with Go's
    # struct-order encoding is not required (a mismatch falls back to the semantic comparison).
    return naming.name_hash(orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode())


def pod_template_hash(template_spec: Mapping[str, Any]) -> str:
    """`NameHash(JSON(spec.podTemplate))` (deprecated label, kept for external consumers)."""
    return _hash_json(template_spec.get("podTemplate") or {})


def blueprint_hash(template_spec: Mapping[str, Any]) -> str:
    """`NameHash(JSON(blueprint))`: the `sandbox-template-hash` label value."""
    return _hash_json(blueprint(template_spec))


# --------------------------------------------------------------------------- semantic equality (§0.5)

_QUANTITY_PARENTS: Final = frozenset({"limits", "requests", "capacity", "overhead"})
_QUANTITY_KEYS: Final = frozenset({"sizeLimit"})
_QUANTITY_RE: Final = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?$")
_SUFFIX: Final[Mapping[str, Fraction]] = {
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


def _quantity(value: Any) -> Fraction | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Fraction(value)
    if not isinstance(value, str):
        return None
    m = _QUANTITY_RE.match(value.strip())
    if m is None:
        return None
    try:
        number = Fraction(m.group(1))
    except (ValueError, ZeroDivisionError):
        return None
    if m.group(2):
        return number * Fraction(10) ** int(m.group(2)[1:])
    return number * _SUFFIX[m.group(3)] if m.group(3) else number


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def semantic_equal(a: Any, b: Any, *, _key: str = "", _parent: str = "") -> bool:
    """apimachinery `equality.Semantic.DeepEqual` over decoded JSON.

    Missing, null, empty map and empty list are all equal; resource quantities (values under
    `limits`/`requests`/`capacity`/`overhead`, and `sizeLimit`) compare by value ("1" == "1000m").
    Scalars otherwise compare strictly (a missing `false` is not `false`).
    """
    if a is b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return all(semantic_equal(a.get(k), b.get(k), _key=k, _parent=_key) for k in a.keys() | b.keys())
    if _empty(a) and _empty(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(semantic_equal(x, y, _parent=_key) for x, y in zip(a, b, strict=True))
    if type(a) is type(b) and a == b:
        return True
    if _parent in _QUANTITY_PARENTS or _key in _QUANTITY_KEYS:
        qa, qb = _quantity(a), _quantity(b)
        return qa is not None and qa == qb
    return False


# --------------------------------------------------------------------------- blueprint comparison (§3.8.2)


def blueprint_matches(template_spec: Mapping[str, Any], sandbox_spec: Mapping[str, Any]) -> bool:
    """True if a Sandbox's blueprint is semantically the template's (metadata never counts).

    * pod spec: the template's pod spec after the secure defaults equals the Sandbox's pod spec;
    * volumeClaimTemplates: same length, and index by index the same name and spec (order matters);
    * service: equal, with unset and false being different.
    """
    tmpl_pod = (template_spec.get("podTemplate") or {}).get("spec") or {}
    member_pod = (sandbox_spec.get("podTemplate") or {}).get("spec") or {}
    if not semantic_equal(apply_secure_defaults(template_spec, tmpl_pod), member_pod):
        return False
    tmpl_vcts: Sequence[Mapping[str, Any]] = template_spec.get("volumeClaimTemplates") or ()
    member_vcts: Sequence[Mapping[str, Any]] = sandbox_spec.get("volumeClaimTemplates") or ()
    if len(tmpl_vcts) != len(member_vcts):
        return False
    for want, have in zip(tmpl_vcts, member_vcts, strict=True):
        if (want.get("metadata") or {}).get("name", "") != (have.get("metadata") or {}).get("name", ""):
            return False
        if not semantic_equal(want.get("spec"), have.get("spec")):
            return False
    return template_spec.get("service") == sandbox_spec.get("service")
