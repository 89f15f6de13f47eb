"""v1alpha1 <-> v1beta1 conversion of the four kinds, as pure functions on wire dicts (api spec §8).

Hub-and-spoke: v1beta1 is the hub, v1alpha1 the only spoke. Functions take and return
plain JSON dicts (exactly what a ``ConversionReview`` carries) so that fields this code
does not know about pass through untouched; the API server prunes whatever the target
schema lacks.

Lossless round trips (§8.2): converting v1alpha1 -> v1beta1 stores a JSON snapshot of the
v1alpha1 object in ``api.agents.x-k8s.io/v1alpha1-<kind>-state``; converting back strips
the snapshot and, for Sandbox and SandboxClaim, restores what v1beta1 cannot represent.
Deliberate differences from upstream are listed in ``docs/design/api-quirks.md``:

* the snapshot holds ``apiVersion``/``kind`` and only the spec fields the way back reads (Sandbox
  ``replicas``; claim ``sandboxTemplateRef.name`` and ``warmpool``), and is left out when it would push
  the annotations over the API server's 256 KiB limit;
* a snapshot is untrusted input (anyone who may edit the v1beta1 object can write it): one that does not
  parse, or values the v1alpha1 schema (or the JSON encoder) would refuse, are ignored;
* a claim's warm start (rule (b) of §8.4) is read from its assignment record in metadata, not from
  ``status.sandbox.name``, and the way back never returns a spec that converts to another pool: a v1alpha1
  ``/status`` write reaches the to-hub conversion with a status the client chose, and must not move
  ``spec.warmPoolRef``.

Failure modes: :class:`ConversionError` for an unknown kind/version, an object whose fields have the wrong
shapes or that is nested too deeply to copy, or an invalid ``v1beta1-volume-claim-templates-policy``
annotation.
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


#: kube-apiserver's limit on the annotations of one object: the sum of the keys' and values' lengths in bytes
#: (apimachinery ``TotalAnnotationSizeLimitB``).
ANNOTATIONS_SIZE_LIMIT = 256 * 1024
#: Largest value of a Kubernetes ``int32`` field (v1alpha1 ``status.replicas``).
INT32_MAX = 2**31 - 1


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
    """Store on the v1beta1 ``dst`` what the way back reads of the v1alpha1 ``src`` (:func:`_snapshot_spec`).

    Left out (and any snapshot the client sent removed) when it would push ``dst``'s annotations over
    kube-apiserver's limit: the write would fail with "metadata.annotations: Too long" where the same
    object written as v1beta1 is accepted, and the snapshot is only an aid for lossless round trips.
    """
    snapshot: Obj = {k: src[k] for k in ("apiVersion", "kind") if k in src}
    snapshot["spec"] = _snapshot_spec(src, kind)
    # sort_keys: an unchanged v1alpha1 update must produce a byte-identical annotation, or the API server
    # would see a change and bump resourceVersion on every no-op apply.
    text = json.dumps(snapshot, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    key = c.STATE_ANNOTATIONS[kind]
    annotations = _annotations(dst)
    annotations.pop(key, None)
    if _annotations_size(annotations) + _utf8_len(key) + _utf8_len(text) <= ANNOTATIONS_SIZE_LIMIT:
        annotations[key] = text
    _tidy_annotations(dst)


def _snapshot_spec(src: Obj, kind: str) -> Obj:
    """The spec fields of the v1alpha1 ``src`` that the way back restores, and nothing else.

    Upstream stores the whole object (metadata and status included); its reader unmarshals the snapshot
    into the typed object and reads only these fields, so a smaller snapshot reads back the same there.
    """
    spec = src.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    out: Obj = {}
    if kind == c.KIND_SANDBOX:
        if _is_int(spec.get("replicas")):
            out["replicas"] = spec["replicas"]
    elif kind == c.KIND_SANDBOX_CLAIM:
        ref = spec.get("sandboxTemplateRef")
        if isinstance(ref, dict) and isinstance(ref.get("name"), str):
            out["sandboxTemplateRef"] = {"name": ref["name"]}
        if isinstance(spec.get("warmpool"), str):
            out["warmpool"] = spec["warmpool"]
    return out


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "replace"))


def _annotations_size(annotations: dict[str, Any]) -> int:
    """Bytes kube-apiserver counts against :data:`ANNOTATIONS_SIZE_LIMIT` (keys plus values)."""
    return sum(_utf8_len(str(k)) + _utf8_len(str(v)) for k, v in annotations.items())


def _pop_snapshot(obj: Obj, kind: str) -> Obj | None:
    """Remove the state annotation from ``obj`` and return the parsed snapshot, if it is a JSON object.

    Ours (a deliberate difference, docs/design/api-quirks.md): upstream's webhook fails the conversion on a
    snapshot it cannot unmarshal. The annotation is writable by anyone who may edit the v1beta1 object, and one
    bad value failed every v1alpha1 LIST of the namespace (each object of a list is converted) and kept the API
    server's v1alpha1 watch cache retrying - a warning in the controller's log per retry. A snapshot is only an
    aid for lossless round trips, so an unusable one is ignored: the object converts as if it had none. That
    includes JSON nested too deeply for the parser (RecursionError); callers check every value they use.
    """
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    raw = annotations.pop(c.STATE_ANNOTATIONS[kind], None)
    _tidy_annotations(obj)
    if not isinstance(raw, str):
        return None
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _replicas(value: object, *, most: int) -> bool:
    """A snapshot's replicas count is usable: an integer (not a bool) within the v1alpha1 schema's range."""
    return _is_int(value) and 0 <= value <= most  # type: ignore[operator]


def _text(value: object) -> str | None:
    """``value`` if it is a string the JSON encoder can write (a lone surrogate from ``\\ud800`` cannot be)."""
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


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
        # Values that break the v1alpha1 schema (`"abc"`, -5, more than int32) are ignored, not returned:
        # typed clients and the `/scale` subresource failed on them (until December 6), and Go's unmarshal
        # into upstream's int32 fails on the larger ones.
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
        if _replicas(orig_status.get("replicas"), most=INT32_MAX):  # only in snapshots written by upstream
            status["replicas"] = orig_status["replicas"]
    return out


# ---------------------------------------------------------------------------
# SandboxClaim (§8.4)
# ---------------------------------------------------------------------------


def _claim_snapshot(original: Obj | None) -> tuple[Obj, str | None] | None:
    """The snapshot's ``sandboxTemplateRef`` (reduced to its ``name``) and ``warmpool``, if both are usable.

    Usable: a name that is a string (the v1alpha1 schema requires one), a ``warmpool`` that is a string or
    absent, both encodable. Only the name is taken, as upstream's typed unmarshal does: copying the
    snapshot's object whole returned whatever else it held.
    """
    spec = original.get("spec") if original is not None else None
    if not isinstance(spec, dict):
        return None
    ref, policy = spec.get("sandboxTemplateRef"), spec.get("warmpool")
    name = _text(ref.get("name")) if isinstance(ref, dict) else None
    if name is None or (policy is not None and _text(policy) is None):
        return None
    return {"name": name}, policy


def _bound_sandbox_name(obj: Obj) -> str:
    sandbox = (obj.get("status") or {}).get("sandbox") or {}
    return str(sandbox.get("name") or "")


def _assigned_sandbox_name(obj: Obj) -> str:
    """The claim's assignment record: annotation ``agents.x-k8s.io/sandbox-name``, else the legacy label.

    What the claim controller reads to recognise a warm adoption (controllers spec §4.5); metadata, so a
    ``/status`` write cannot change it.
    """
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    for where, key in (("annotations", c.ANNOTATION_SANDBOX_NAME), ("labels", c.LABEL_SANDBOX_NAME_LEGACY)):
        values = meta.get(where)
        name = values.get(key) if isinstance(values, dict) else None
        if isinstance(name, str) and name:
            return name
    return ""


def _warm_pool_for(template_ref: Any, policy: Any, obj: Obj) -> str:
    """``spec.warmPoolRef.name`` of a v1alpha1 claim with this template reference and ``warmpool`` (§8.4).

    (a) a specific pool; (b) warm-started: the pool the assigned Sandbox came from; (c) the template's shadow
    pool. Ours (docs/design/api-quirks.md): (b) reads the assignment record in metadata, not upstream's
    ``status.sandbox.name`` - on a v1alpha1 ``/status`` write the API server converts the client's new status,
    so a status-only write rewrote ``spec.warmPoolRef`` without a new generation.
    """
    if is_specific_pool(policy):
        return str(policy)
    claim_name = (obj.get("metadata") or {}).get("name") or ""
    assigned = _assigned_sandbox_name(obj)
    if assigned and assigned != claim_name:
        return strip_random_suffix(assigned)  # warm-started: the originating pool
    return f"{c.SHADOW_POOL_PREFIX}{template_ref.get('name', '')}"


def _claim_to_hub(obj: Obj) -> Obj:
    out, spec, _ = _start(obj, c.EXTENSIONS_GROUP, c.V1BETA1)
    template_ref = spec.pop("sandboxTemplateRef", None) or {}
    policy = spec.pop("warmpool", None)
    spec["warmPoolRef"] = {"name": _warm_pool_for(template_ref, policy, obj)}
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
    template_ref: Obj
    policy: str | None
    if pool.startswith(c.SHADOW_POOL_PREFIX):
        template_ref, policy = {"name": pool.removeprefix(c.SHADOW_POOL_PREFIX)}, c.WARMPOOL_POLICY_DEFAULT
    else:
        # Upstream quirk (api spec §10.2): the template name is a guess, the pool name.
        template_ref, policy = {"name": pool}, pool
    # An unusable snapshot is ignored, as in _pop_snapshot: never returned against the v1alpha1 schema.
    original = _claim_snapshot(_pop_snapshot(out, c.KIND_SANDBOX_CLAIM))
    if original is not None:
        template_ref, orig_policy = original
        expected = (
            orig_policy if orig_policy is not None and is_specific_pool(orig_policy) else template_ref["name"]
        )
        # Ours: the assignment record explains the pool as well as the bound name does (rule (b) reads it).
        matches = any(
            _warm_pool_ref_matches(pool, expected, bound)
            for bound in (_bound_sandbox_name(obj), _assigned_sandbox_name(obj))
        )
        policy = orig_policy if matches else pool
    if is_specific_pool(pool) and _warm_pool_for(template_ref, policy, out) != pool:
        # Ours: a v1alpha1 write of what is returned here (a /status write above all: the API server
        # converts the stored spec with the client's status) must store the same pool. Where the rules above
        # give a spec that would convert to another pool - the snapshot matched through the bound Sandbox
        # while the assignment record says otherwise, or a record contradicts the shadow pool - name the
        # pool itself, as for a pool changed through v1beta1.
        policy = pool
    spec["sandboxTemplateRef"] = template_ref
    if policy is None:
        spec.pop("warmpool", None)
    else:
        spec["warmpool"] = policy
    _tidy_status(out)
    return out


# ---------------------------------------------------------------------------
# SandboxTemplate (§8.5)
# ---------------------------------------------------------------------------

_VCT_POLICIES = frozenset(p.value for p in c.VolumeClaimTemplatesPolicy)


#: Go's strconv.Quote escapes of the non-printable ASCII controls that have a letter.
_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def _go_quote(value: object) -> str:
    """``value`` quoted as Go's ``%q`` (``strconv.Quote``) writes it, for error texts upstream formats so.

    ``"`` and ``\\`` are escaped; printable characters stay as they are (Go's ``unicode.IsPrint`` and Python's
    ``str.isprintable`` take the same classes as printable: letters, marks, numbers, punctuation, symbols and the
    ASCII space); the others become ``\\a``-style, ``\\xNN`` (other ASCII controls), ``\\uNNNN`` or
    ``\\UNNNNNNNN``. A lone surrogate, which a Go string cannot hold (its JSON decoder makes it U+FFFD), is
    written as U+FFFD.

    The two agree only for the same Unicode version: each classifies by its own tables, and a code point that is
    unassigned (not printable) in one may be assigned in the other. Python 3.11 has Unicode 14.0, Go 1.26 Unicode
    15.0: they differ on 4,482 code points, all unassigned in 14.0 (new CJK ideographs, Kawi, Nag Mundari, ...),
    which Go writes as they are and this writes as ``\\uNNNN``/``\\UNNNNNNNN``; every other code point is quoted
    alike (compared over all of them with ``strconv.Quote``).
    """
    text = value if isinstance(value, str) else str(value)
    out = ['"']
    for ch in text:
        code = ord(ch)
        if 0xD800 <= code <= 0xDFFF:
            ch, code = "\ufffd", 0xFFFD
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _template_to_hub(obj: Obj) -> Obj:
    out, spec, _ = _start(obj, c.EXTENSIONS_GROUP, c.V1BETA1)
    spec.pop("volumeClaimTemplatesPolicy", None)
    annotations = (out.get("metadata") or {}).get("annotations") or {}
    if c.ANNOTATION_V1BETA1_VCT_POLICY in annotations:
        policy = annotations.pop(c.ANNOTATION_V1BETA1_VCT_POLICY)
        if policy not in _VCT_POLICIES:
            raise ConversionError(f"invalid VolumeClaimTemplatesPolicy annotation value: {_go_quote(policy)}")
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
    # RecursionError: an object nested too deeply to copy (the API server never sends one: its schemas
    # bound the depth; a review POSTed by anything else can).
    except (AttributeError, TypeError, ValueError, KeyError, IndexError, RecursionError) as exc:
        name = obj.get("metadata", {}).get("name") if isinstance(obj.get("metadata"), dict) else None
        raise ConversionError(
            f"objects[{index}] ({obj.get('kind')} {name}): malformed: {type(exc).__name__}: {exc}"
        ) from exc
