"""v1alpha1 <-> v1beta1 conversion of the four kinds, as pure functions on wire dicts (api spec §8).

Hub-and-spoke: v1beta1 is the hub, v1alpha1 the only spoke. Functions take and return
plain JSON dicts (exactly what a ``ConversionReview`` carries) so that fields this code
does not know about pass through untouched; the API server prunes whatever the target
schema lacks.

Lossless round trips (§8.2): converting v1alpha1 -> v1beta1 stores a JSON snapshot of the
v1alpha1 object in ``api.agents.x-k8s.io/v1alpha1-<kind>-state``; converting back strips
the snapshot and, for Sandbox and SandboxClaim, restores what v1beta1 cannot represent.
Deliberate differences from upstream are listed in ``docs/design/api-quirks.md``:
the snapshot holds ``apiVersion``/``kind``/``spec`` only. Metadata is copied verbatim both
ways, so storing it again would only double the object size and change on every write;
status is excluded because v1alpha1 ``status.replicas`` is synthesised from the mode, and a
snapshotted copy (taken from whatever a v1alpha1 client echoed back, e.g. on ``/scale``)
would pin it to a stale value. Snapshots written by upstream do carry ``status``; their
``status.replicas`` is still honoured on the way back, as upstream does.

Failure modes: :class:`ConversionError` for an unknown kind/version, a malformed snapshot
(as upstream: the object is then unreadable as v1alpha1 until the annotation is fixed
through v1beta1) or an invalid ``v1beta1-volume-claim-templates-policy`` annotation.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api.kinds import KINDS_BY_NAME, ResourceKind

Obj = dict[str, Any]

__all__ = [
    "ConversionError",
    "convert",
    "convert_review",
    "is_specific_pool",
    "strip_random_suffix",
    "to_hub",
    "to_spoke",
]


class ConversionError(ValueError):
    """A single object could not be converted; the message is returned to the API server."""


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------


def is_specific_pool(policy: str | None) -> bool:
    """True if a v1alpha1 ``warmpool`` value names a pool (not ``none``/``default``/empty)."""
    return policy not in (None, "", c.WARMPOOL_POLICY_NONE, c.WARMPOOL_POLICY_DEFAULT)


def strip_random_suffix(name: str) -> str:
    """``name`` without its last ``-suffix`` (a warm Sandbox name minus its random part)."""
    head, sep, _ = name.rpartition("-")
    return head if sep else name


def _annotations(obj: Obj) -> dict[str, str]:
    meta: dict[str, Any] = obj.setdefault("metadata", {})
    annotations: dict[str, str] = meta.setdefault("annotations", {})
    return annotations


def _tidy_annotations(obj: Obj) -> None:
    """Drop an empty annotations map, as Go's ``omitempty`` would."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and meta.get("annotations") == {}:
        del meta["annotations"]


def _tidy_status(obj: Obj) -> None:
    if "status" in obj and not obj["status"]:
        del obj["status"]


def _write_snapshot(src: Obj, dst: Obj, kind: str) -> None:
    """Store the v1alpha1 ``src`` (minus metadata and status) on the v1beta1 ``dst``."""
    snapshot = {k: src[k] for k in ("apiVersion", "kind", "spec") if k in src}
    # sort_keys: an unchanged v1alpha1 update must produce a byte-identical annotation, or
    # the API server would see a change and bump resourceVersion on every no-op apply.
    text = json.dumps(snapshot, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    _annotations(dst)[c.STATE_ANNOTATIONS[kind]] = text


def _pop_snapshot(obj: Obj, kind: str) -> Obj | None:
    """Remove the state annotation from ``obj`` and return the parsed snapshot, if it is a JSON object.

    Ours (a deliberate difference, docs/design/api-quirks.md): upstream's webhook fails the conversion on a
    snapshot it cannot unmarshal. The annotation is writable by anyone who may edit the v1beta1 object, and one
    bad value failed every v1alpha1 LIST of the namespace (each object of a list is converted) and kept the API
    server's v1alpha1 watch cache retrying - a warning in the controller's log per retry. A snapshot is only an
    aid for lossless round trips, so an unusable one is ignored: the object converts as if it had none.
    """
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    raw = annotations.pop(c.STATE_ANNOTATIONS[kind], None)
    _tidy_annotations(obj)
    if raw is None:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _replicas(value: object, *, most: int | None) -> bool:
    """A snapshot's replicas count is usable: an integer (not a bool) within the v1alpha1 schema's range."""
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= 0
        and (most is None or value <= most)
    )


def _start(obj: Obj, group: str, version: str) -> tuple[Obj, Obj, Obj]:
    """Deep-copy ``obj`` with a new apiVersion; return it and its spec and status dicts."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{group}/{version}"
    spec = out.setdefault("spec", {})
    status = out.get("status")
    if not isinstance(status, dict):
        status = {}
    out["status"] = status
    return out, spec, status


# ---------------------------------------------------------------------------
# Sandbox (§8.3)
# ---------------------------------------------------------------------------


def _sandbox_to_hub(obj: Obj) -> Obj:
    out, spec, status = _start(obj, c.GROUP, c.V1BETA1)
    replicas = spec.pop("replicas", None)
    mode = c.OperatingMode.SUSPENDED if replicas == 0 else c.OperatingMode.RUNNING
    spec["operatingMode"] = mode.value
    status.pop("replicas", None)
    status.pop("nodeName", None)  # v1beta1-only; v1alpha1 has nothing to carry over
    _tidy_status(out)
    _write_snapshot(obj, out, c.KIND_SANDBOX)
    return out


def _sandbox_from_hub(obj: Obj) -> Obj:
    out, spec, status = _start(obj, c.GROUP, c.V1ALPHA1)
    mode = spec.pop("operatingMode", None)
    suspended = mode == c.OperatingMode.SUSPENDED
    spec["replicas"] = 0 if suspended else 1
    status.pop("nodeName", None)
    status["replicas"] = 0 if suspended else 1
    original = _pop_snapshot(out, c.KIND_SANDBOX)
    if original is not None:
        # Values that break the v1alpha1 schema (`"abc"`, -5) are ignored, not returned: typed clients and the
        # `/scale` subresource failed on them (until December 6).
        orig_spec = original.get("spec", {})
        usable = isinstance(orig_spec, dict)
        orig_replicas = orig_spec.get("replicas") if usable else None
        if (
            mode == c.OperatingMode.RUNNING
            and usable
            and (orig_replicas is None or _replicas(orig_replicas, most=1))
        ):
            if orig_replicas is None:
                del spec["replicas"]  # an unset replicas round-trips as unset
            elif orig_replicas != 0:
                spec["replicas"] = orig_replicas
        orig_status = original.get("status")
        orig_status = orig_status if isinstance(orig_status, dict) else {}
        if _replicas(orig_status.get("replicas"), most=None):  # only in snapshots written by upstream
            status["replicas"] = orig_status["replicas"]
    return out


# ---------------------------------------------------------------------------
# SandboxClaim (§8.4)
# ---------------------------------------------------------------------------


def _usable_claim_snapshot(original: Obj) -> bool:
    """The snapshot's `warmpool` (a string, or absent) and `sandboxTemplateRef` (an object whose name is a
    string) are what the v1alpha1 schema allows."""
    spec = original.get("spec")
    if spec is None:
        return True
    if not isinstance(spec, dict):
        return False
    policy, ref = spec.get("warmpool"), spec.get("sandboxTemplateRef")
    if policy is not None and not isinstance(policy, str):
        return False
    return ref is None or (isinstance(ref, dict) and isinstance(ref.get("name", ""), str))


def _bound_sandbox_name(obj: Obj) -> str:
    sandbox = (obj.get("status") or {}).get("sandbox") or {}
    return str(sandbox.get("name") or "")


def _claim_to_hub(obj: Obj) -> Obj:
    out, spec, _ = _start(obj, c.EXTENSIONS_GROUP, c.V1BETA1)
    template_ref = spec.pop("sandboxTemplateRef", None) or {}
    policy = spec.pop("warmpool", None)
    claim_name = (obj.get("metadata") or {}).get("name") or ""
    sandbox_name = _bound_sandbox_name(obj)
    if is_specific_pool(policy):
        pool = str(policy)
    elif sandbox_name and sandbox_name != claim_name:
        pool = strip_random_suffix(sandbox_name)  # warm-started: the originating pool
    else:
        pool = f"{c.SHADOW_POOL_PREFIX}{template_ref.get('name', '')}"
    spec["warmPoolRef"] = {"name": pool}
    spec.pop("volumeClaimTemplates", None)  # v1alpha1 has none; never invent them
    _tidy_status(out)
    _write_snapshot(obj, out, c.KIND_SANDBOX_CLAIM)
    return out


def _warm_pool_ref_matches(actual: str, expected: str, sandbox_name: str) -> bool:
    if actual in (expected, f"{c.SHADOW_POOL_PREFIX}{expected}"):
        return True
    return bool(sandbox_name) and actual in (sandbox_name, strip_random_suffix(sandbox_name))


def _claim_from_hub(obj: Obj) -> Obj:
    out, spec, _ = _start(obj, c.EXTENSIONS_GROUP, c.V1ALPHA1)
    pool = str((spec.pop("warmPoolRef", None) or {}).get("name", ""))
    spec.pop("volumeClaimTemplates", None)  # lossy by design (v1alpha1 cannot express them)
    if pool.startswith(c.SHADOW_POOL_PREFIX):
        spec["sandboxTemplateRef"] = {"name": pool.removeprefix(c.SHADOW_POOL_PREFIX)}
        spec["warmpool"] = c.WARMPOOL_POLICY_DEFAULT
    else:
        # Upstream quirk (api spec §10.2): the template name is a guess, the pool name.
        spec["sandboxTemplateRef"] = {"name": pool}
        spec["warmpool"] = pool
    original = _pop_snapshot(out, c.KIND_SANDBOX_CLAIM)
    if original is not None and not _usable_claim_snapshot(original):
        original = None  # as _pop_snapshot: ignored, not returned against the v1alpha1 schema
    if original is not None:
        orig_spec = original.get("spec") or {}
        orig_policy = orig_spec.get("warmpool")
        orig_ref = orig_spec.get("sandboxTemplateRef") or {}
        expected = str(orig_policy) if is_specific_pool(orig_policy) else str(orig_ref.get("name", ""))
        if _warm_pool_ref_matches(pool, expected, _bound_sandbox_name(obj)):
            spec["sandboxTemplateRef"] = copy.deepcopy(orig_ref)
            if orig_policy is None:
                spec.pop("warmpool", None)
            else:
                spec["warmpool"] = orig_policy
        else:
            spec["warmpool"] = pool
            spec["sandboxTemplateRef"] = copy.deepcopy(orig_ref)
    _tidy_status(out)
    return out


# ---------------------------------------------------------------------------
# SandboxTemplate (§8.5)
# ---------------------------------------------------------------------------

_VCT_POLICIES = frozenset(p.value for p in c.VolumeClaimTemplatesPolicy)


def _template_to_hub(obj: Obj) -> Obj:
    out, spec, _ = _start(obj, c.EXTENSIONS_GROUP, c.V1BETA1)
    spec.pop("volumeClaimTemplatesPolicy", None)
    annotations = (out.get("metadata") or {}).get("annotations") or {}
    if c.ANNOTATION_V1BETA1_VCT_POLICY in annotations:
        policy = annotations.pop(c.ANNOTATION_V1BETA1_VCT_POLICY)
        if policy not in _VCT_POLICIES:
            raise ConversionError(f"invalid VolumeClaimTemplatesPolicy annotation value: {policy!r}")
        spec["volumeClaimTemplatesPolicy"] = policy
    _tidy_status(out)
    _write_snapshot(obj, out, c.KIND_SANDBOX_TEMPLATE)
    return out


def _template_from_hub(obj: Obj) -> Obj:
    out, spec, _ = _start(obj, c.EXTENSIONS_GROUP, c.V1ALPHA1)
    policy = spec.pop("volumeClaimTemplatesPolicy", None)
    _pop_snapshot(out, c.KIND_SANDBOX_TEMPLATE)  # written for symmetry, never read back
    annotations = _annotations(out)
    if policy:
        annotations[c.ANNOTATION_V1BETA1_VCT_POLICY] = str(policy)
    else:
        annotations.pop(c.ANNOTATION_V1BETA1_VCT_POLICY, None)
    _tidy_annotations(out)
    _tidy_status(out)
    return out


# ---------------------------------------------------------------------------
# SandboxWarmPool (§8.6)
# ---------------------------------------------------------------------------


def _warm_pool_to_hub(obj: Obj) -> Obj:
    out, spec, _ = _start(obj, c.EXTENSIONS_GROUP, c.V1BETA1)
    spec["replicas"] = spec.get("replicas", 0)  # required in v1alpha1; Go's zero value otherwise
    _tidy_status(out)
    _write_snapshot(obj, out, c.KIND_SANDBOX_WARM_POOL)
    return out


def _warm_pool_from_hub(obj: Obj) -> Obj:
    out, spec, status = _start(obj, c.EXTENSIONS_GROUP, c.V1ALPHA1)
    if spec.get("replicas") is None:
        spec["replicas"] = 1
    status.pop("observedGeneration", None)
    _pop_snapshot(out, c.KIND_SANDBOX_WARM_POOL)
    _tidy_status(out)
    return out


# ---------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------

_Converter = Callable[[Obj], Obj]
_TO_HUB: dict[str, _Converter] = {
    c.KIND_SANDBOX: _sandbox_to_hub,
    c.KIND_SANDBOX_CLAIM: _claim_to_hub,
    c.KIND_SANDBOX_TEMPLATE: _template_to_hub,
    c.KIND_SANDBOX_WARM_POOL: _warm_pool_to_hub,
}
_FROM_HUB: dict[str, _Converter] = {
    c.KIND_SANDBOX: _sandbox_from_hub,
    c.KIND_SANDBOX_CLAIM: _claim_from_hub,
    c.KIND_SANDBOX_TEMPLATE: _template_from_hub,
    c.KIND_SANDBOX_WARM_POOL: _warm_pool_from_hub,
}


def _kind_info(obj: Obj) -> tuple[ResourceKind, str]:
    kind = obj.get("kind")
    info = KINDS_BY_NAME.get(str(kind))
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    if info is None or group != info.group:
        raise ConversionError(f"unsupported kind {obj.get('apiVersion')}/{kind}")
    if version not in (c.V1ALPHA1, c.V1BETA1):
        raise ConversionError(f"unsupported version {obj.get('apiVersion')} for {kind}")
    return info, version


def to_hub(obj: Obj) -> Obj:
    """Convert a v1alpha1 object to v1beta1 (a v1beta1 input is returned as a copy)."""
    info, version = _kind_info(obj)
    if version == c.V1BETA1:
        return copy.deepcopy(obj)
    return _TO_HUB[info.kind](obj)


def to_spoke(obj: Obj) -> Obj:
    """Convert a v1beta1 object to v1alpha1 (a v1alpha1 input is returned as a copy)."""
    info, version = _kind_info(obj)
    if version == c.V1ALPHA1:
        return copy.deepcopy(obj)
    return _FROM_HUB[info.kind](obj)


def convert(obj: Obj, desired_api_version: str) -> Obj:
    """Convert ``obj`` to ``desired_api_version`` (same group; v1alpha1 or v1beta1).

    Raises:
        ConversionError: unknown kind or version, group mismatch, or bad bookkeeping
            annotations.
    """
    info, _ = _kind_info(obj)
    group, _, version = desired_api_version.rpartition("/")
    if group != info.group:
        raise ConversionError(f"cannot convert {info.kind} to {desired_api_version}: group mismatch")
    if version == c.V1BETA1:
        return to_hub(obj)
    if version == c.V1ALPHA1:
        return to_spoke(obj)
    raise ConversionError(f"unsupported target version {desired_api_version}")


def convert_review(review: Obj) -> Obj:
    """Answer an ``apiextensions.k8s.io`` ``ConversionReview`` (v1 or v1beta1).

    The response echoes the request's ``apiVersion`` and ``uid``. If any object fails,
    the whole review fails (the API server requires all-or-nothing).
    """
    request = review.get("request") or {}
    desired = str(request.get("desiredAPIVersion", ""))
    response: Obj = {"uid": request.get("uid", "")}
    try:
        response["convertedObjects"] = [
            _convert_one(i, o, desired) for i, o in enumerate(request.get("objects") or ())
        ]
        response["result"] = {"status": "Success"}
    except ConversionError as exc:
        response["convertedObjects"] = []
        response["result"] = {"status": "Failure", "message": str(exc)}
    return {
        "apiVersion": review.get("apiVersion", "apiextensions.k8s.io/v1"),
        "kind": "ConversionReview",
        "response": response,
    }


def _convert_one(index: int, obj: Any, desired: str) -> Obj:
    """`convert` one object of a review; an object whose fields have the wrong shapes is a Failure.

    The API server only sends objects it stored or validated, but the webhook is reachable by anything
    that can reach its Service: a malformed review must get an answer (Failure), never a crash.
    """
    if not isinstance(obj, dict):
        raise ConversionError(f"objects[{index}]: not an object")
    try:
        return convert(obj, desired)
    except ConversionError:
        raise
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
        name = obj.get("metadata", {}).get("name") if isinstance(obj.get("metadata"), dict) else None
        raise ConversionError(
            f"objects[{index}] ({obj.get('kind')} {name}): malformed: {type(exc).__name__}: {exc}"
        ) from exc
