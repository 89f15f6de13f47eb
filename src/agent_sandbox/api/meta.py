"""The object vocabulary: what every controller, the router, the runtime and the SDK say about raw objects.

In the spirit of apimachinery's `meta` helpers, over decoded JSON (`Mapping`s, never mutated unless a
function says so):

* conditions: `find_condition` / `status_condition`, `is_condition_true`, `is_ready`, `new_condition`,
  `upsert_condition` (apimachinery `SetStatusCondition`), `remove_condition`;
* time: `format_time` (metav1.Time), `format_rfc3339nano` (Go's RFC3339Nano), `parse_time`, `deadline_after`;
* ownership: `controller_ref`, `owner_ref_matches`, `controlled_by` / `controller_name` (controlled by a
  kind, optionally a UID), `owner_name`, `classify_ownership`, `new_controller_ref`;
* named references: `claim_pool_name`, `claim_sandbox_name`, `pool_template_name`, `sandbox_pod_name`,
  `sandbox_pool_name`,  `pool_update_strategy`, `pool_key`;
* label rules: reserved prefixes, `normalize_created_by`;
* the resourceVersion policy of read-your-writes (`is_newer`, docs/design/resource-version-order.md).

No I/O, no clock: callers pass `now`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

from .constants import (
    ANNOTATION_POD_NAME,
    ANNOTATION_TRACE_CONTEXT,
    CONDITION_READY,
    CREATED_BY_CONTROLLER,
    CREATED_BY_GO_CLIENT,
    CREATED_BY_PYTHON_CLIENT,
    CREATED_BY_UNKNOWN,
    EXTENSIONS_GROUP,
    GROUP,
    ConditionStatus,
    UpdateStrategyType,
)
from .kinds import SANDBOX_WARM_POOL, ResourceKind

__all__ = [
    "RESERVED_ANNOTATION_KEYS",
    "RESERVED_PREFIXES",
    "Ownership",
    "ReadOnlyObject",
    "api_group",
    "claim_pool_name",
    "claim_sandbox_name",
    "classify_ownership",
    "compare_resource_versions",
    "controlled_by",
    "controller_name",
    "controller_ref",
    "deadline_after",
    "drop_unapplied_managed_fields",
    "find_condition",
    "format_rfc3339nano",
    "format_time",
    "is_condition_true",
    "is_newer",
    "is_ready",
    "is_reserved_annotation",
    "is_reserved_label",
    "new_condition",
    "new_controller_ref",
    "normalize_created_by",
    "owner_name",
    "owner_ref_matches",
    "parse_duration",
    "parse_time",
    "pool_key",
    "pool_template_name",
    "pool_update_strategy",
    "remove_condition",
    "reset_managed_fields",
    "sandbox_pod_name",
    "sandbox_pool_name",
    "server_side_applied",
    "status_condition",
    "upsert_condition",
]

ReadOnlyObject: TypeAlias = Mapping[str, Any]
"""A decoded object we only read (cache objects are shared: never mutate them)."""

# --------------------------------------------------------------------------- conditions


def find_condition(conditions: object, type_: str) -> Mapping[str, Any] | None:
    """The condition of `type_` in a raw `conditions` list (anything else counts as empty), or None."""
    for cond in conditions if isinstance(conditions, list) else ():
        if isinstance(cond, Mapping) and cond.get("type") == type_:
            return cond
    return None


def status_condition(obj: ReadOnlyObject | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of `type_` in `obj.status.conditions`, or None."""
    return find_condition(((obj or {}).get("status") or {}).get("conditions"), type_)


def is_condition_true(obj: ReadOnlyObject | None, type_: str) -> bool:
    """`obj.status.conditions[type_].status` is "True"."""
    cond = status_condition(obj, type_)
    return cond is not None and cond.get("status") == ConditionStatus.TRUE


def is_ready(obj: ReadOnlyObject | None) -> bool:
    """The object's `Ready` condition is "True"."""
    return is_condition_true(obj, CONDITION_READY)


def new_condition(
    type_: str, status: str, reason: str, message: str, generation: object = None
) -> dict[str, Any]:
    """A condition to upsert; `observedGeneration` only when `generation` is not None."""
    cond: dict[str, Any] = {"type": type_, "status": status, "reason": reason, "message": message}
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def upsert_condition(conditions: list[dict[str, Any]], new: Mapping[str, Any], now: datetime) -> None:
    """apimachinery `SetStatusCondition` on a raw list, in place (controllers spec §0.5).

    Absent: append `new` (lastTransitionTime = `new`'s if given, else `now`). Present: a status change sets
    lastTransitionTime the same way; reason and message are always overwritten; observedGeneration is
    `new`'s, or removed when `new` has none; the list position is kept. The old condition dict is replaced,
    never mutated (it may be shared with a cache).
    """
    stamp = new.get("lastTransitionTime") or format_time(now)
    for i, cond in enumerate(conditions):
        if cond.get("type") != new["type"]:
            continue
        updated = dict(cond)
        if cond.get("status") != new["status"]:
            updated["status"] = new["status"]
            updated["lastTransitionTime"] = stamp
        updated["reason"] = new["reason"]
        updated["message"] = new["message"]
        if new.get("observedGeneration") is not None:
            updated["observedGeneration"] = new["observedGeneration"]
        else:
            updated.pop("observedGeneration", None)
        conditions[i] = updated
        return
    conditions.append({**new, "lastTransitionTime": stamp})


def remove_condition(conditions: list[dict[str, Any]], type_: str) -> None:
    """Delete every condition of `type_`, in place."""
    conditions[:] = [cond for cond in conditions if cond.get("type") != type_]


# --------------------------------------------------------------------------- time


def _utc_seconds(moment: datetime) -> str:
    # Not strftime: glibc's "%Y" does not pad years before 1000 ("999-01-01"), which RFC 3339, Go and
    # `parse_time` do not read; the four digits are always written.
    m = moment
    return f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}"


def format_time(moment: datetime) -> str:
    """`metav1.Time` wire form: RFC 3339, UTC, second precision."""
    return _utc_seconds(moment.astimezone(UTC)) + "Z"


def format_rfc3339nano(moment: datetime) -> str:
    """Go's RFC3339Nano in UTC: fraction with trailing zeros trimmed (none when whole), 'Z' suffix."""
    moment = moment.astimezone(UTC)
    base = _utc_seconds(moment)
    frac = f"{moment.microsecond:06d}".rstrip("0")
    return f"{base}.{frac}Z" if frac else f"{base}Z"


# kube-apiserver's `format: date-time` check (k8s.io/kube-openapi pkg/validation/strfmt `IsDateTime`): the
# lower-cased value split at every "t" (here: at every "t" or "T", and "z" or "Z" - Python's lower() turns a
# few characters into two, Go's ToLower never); the first piece a Go `2006-01-02` date, the second this pattern (with
# hour <= 23, minute and second <= 59). Its unescaped "." admits any one character before the fraction digits,
# its offset any two-digit hours and minutes ("+24:00", "+99:99"), and pieces after a second "t" are never
# looked at. Python's `$` would also match before a trailing newline, Go's does not: hence `\Z`.
_APISERVER_TIME_RE = re.compile(
    r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?([zZ]|([+-])([0-9]{2}):([0-9]{2}))\Z"
)
_APISERVER_DATE_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})\Z")
# `YYYY-MM-DDTHH:MM:SS[.1-9 digits]Z`: metav1.Time, RFC3339Nano (`parse_time`'s fast path).
_CANONICAL_TIME_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?Z\Z")
_UTC_MIN = datetime.min.replace(tzinfo=UTC)
_UTC_MAX = datetime.max.replace(tzinfo=UTC)


def _parse_apiserver_time(value: str) -> datetime | None:
    """A value kube-apiserver admits as `format: date-time`, as an instant; None if it would not admit it.

    The offset counts as +-(hh*60 + mm) minutes whatever its range, the fraction is cut to microseconds, and an
    instant beyond `datetime`'s years 1-9999 (year 0000 is a valid Go date; a large offset crosses the ends)
    is clamped to `datetime.min` / `datetime.max`: every comparison with a real `now` stays right.
    """
    pieces = re.split("[tT]", value)
    if len(pieces) < 2:
        return None
    date, clock = _APISERVER_DATE_RE.match(pieces[0]), _APISERVER_TIME_RE.match(pieces[1])
    if date is None or clock is None:
        return None
    year, month, day = (int(g) for g in date.groups())
    hour, minute, second = int(clock[1]), int(clock[2]), int(clock[3])
    if hour > 23 or minute > 59 or second > 59:
        return None
    try:  # Go's calendar check; year 0000 (a leap year) has 2000's month lengths
        datetime(year or 2000, month, day)
    except ValueError:
        return None
    if year == 0:
        return _UTC_MIN
    micros = int(clock[4][1:7].ljust(6, "0")) if clock[4] else 0
    local = datetime(year, month, day, hour, minute, second, micros, tzinfo=UTC)
    offset = 0 if clock[5] in "zZ" else int(clock[7]) * 60 + int(clock[8])
    try:
        return local - timedelta(minutes=offset if clock[6] != "-" else -offset)
    except OverflowError:
        return _UTC_MIN if clock[6] != "-" else _UTC_MAX


def parse_time(value: object) -> datetime | None:
    """Parse an RFC 3339 / ISO 8601 timestamp (any fraction length, 'Z' or offset); None if unusable.

    Every value kube-apiserver admits for a `format: date-time` field (`spec.shutdownTime`) parses, read as
    the apiserver's check reads it (`_parse_apiserver_time`): none of them may count as unset. Other ISO 8601
    forms `datetime.fromisoformat` reads (annotations have no schema) are accepted as well.
    """
    if not isinstance(value, str) or not value:
        return None
    if _CANONICAL_TIME_RE.match(value):
        # Fast path (~0.4 us instead of ~4 us: creationTimestamps of every pool member each pass, router
        # informer events): the form the apiserver and our own `format_time` / `format_rfc3339nano` write.
        # For this shape `fromisoformat` accepts exactly the values the apiserver check does (save year 0000,
        # which it refuses: the slow path below clamps it) and cuts the fraction to microseconds just as
        # `_parse_apiserver_time`: identical results (tests/unit/api/test_parse_time_roundtrip.py).
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    admitted = _parse_apiserver_time(value)
    if admitted is not None:
        return admitted
    text = value.strip().replace("z", "Z")
    if "." in text:  # Python parses at most 6 fractional digits; Go writes up to 9.
        head, _, rest = text.partition(".")
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def deadline_after(start: datetime, seconds: float) -> datetime | None:
    """`start` + `seconds`, or None ("never") when that lies past `datetime.max`.

    A TTL or duration the API admits (an int32 field the apiserver does not range-check, a Go duration of up
    to 292 years, a far-future `last-activity`) can reach past year 9999: `datetime` raises OverflowError there
    (and `timedelta` beyond ~2.7 million years), which would fail every pass of the caller. A deadline before
    `datetime.min` (a negative span) is `datetime.min`.
    """
    try:
        return start + timedelta(seconds=seconds)
    except OverflowError:
        return None if seconds > 0 else _UTC_MIN if start.tzinfo else datetime.min


_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_RE = re.compile(r"(\d*\.?\d*)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Parse a Go duration ("1h2m3.5s", "-250ms", "0") into seconds.

    Raises:
        ValueError: not a Go duration (e.g. "5" without a unit, "5x").
    """
    s = text.strip()
    sign = -1.0 if s.startswith("-") else 1.0
    s = s.lstrip("+-")
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    pos, total = 0, 0.0
    while pos < len(s):
        m = _DURATION_RE.match(s, pos)
        if not m or m.group(1) in ("", "."):
            raise ValueError(f"invalid duration {text!r}")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    return sign * total


# --------------------------------------------------------------------------- ownership


def api_group(api_version: str) -> str:
    """The group part of an `apiVersion` ("" for the core group `v1`)."""
    group, sep, _ = api_version.rpartition("/")
    return group if sep else ""


def owner_ref_matches(ref: Mapping[str, Any], group: str, kind: str) -> bool:
    """True if an owner reference points at `group`/`kind`, whatever its version.

    Owner references keep the apiVersion current when they were written (a pool member may still say
    `extensions.agents.x-k8s.io/v1alpha1`), so upstream compares group and kind only; so must we.
    """
    return ref.get("kind") == kind and api_group(str(ref.get("apiVersion", ""))) == group


def controller_ref(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference with `controller: true` in `metadata`, if any."""
    for ref in metadata.get("ownerReferences") or ():
        if ref.get("controller") is True:
            found: Mapping[str, Any] = ref
            return found
    return None


def _controller_of(obj: ReadOnlyObject | None, kind: ResourceKind | None) -> Mapping[str, Any] | None:
    if obj is None:
        return None
    ref = controller_ref(obj.get("metadata") or {})
    if ref is None or (kind is not None and not owner_ref_matches(ref, kind.group, kind.kind)):
        return None
    return ref


def reset_managed_fields(patch_metadata: dict[str, Any]) -> None:
    """Make a merge patch's `metadata` drop the object's `managedFields`: `[{}]` is kube-apiserver's reset form
    (`[]` would be ignored). Only a write that is sent anyway should carry it (docs/design/managed-fields.md)."""
    patch_metadata["managedFields"] = [{}]


def server_side_applied(obj: ReadOnlyObject | None) -> bool:
    """Some manager server-side applied `obj`: a `managedFields` entry has operation Apply.

    Only then do the entries matter - apply's conflict detection and field removal read them. Entries of
    plain updates (creates, patches, client-side `kubectl apply`) are informational, and an object without
    any is tracked again from its next apply on (docs/design/managed-fields.md).
    """
    entries = ((obj or {}).get("metadata") or {}).get("managedFields")
    return isinstance(entries, list) and any(
        isinstance(e, Mapping) and e.get("operation") == "Apply" for e in entries
    )


def drop_unapplied_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """A cache transform: `obj` without its `managedFields` unless some manager server-side applied it.

    The caches of the objects whose entries our writes reset (claims, Sandboxes) keep exactly what that
    decision reads (`server_side_applied`); applied objects are rare, so the entries they keep cost little.
    """
    if not server_side_applied(obj):
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            meta.pop("managedFields", None)
    return obj


def controlled_by(
    obj: ReadOnlyObject | None, kind: ResourceKind | None = None, uid: str | None = None
) -> bool:
    """metav1.IsControlledBy, by kind and/or UID: `obj`'s controller reference is of `kind` (group + kind,
    any version; None: any kind) and, when `uid` is given, has that non-empty UID."""
    ref = _controller_of(obj, kind)
    return ref is not None and (uid is None or (bool(uid) and ref.get("uid") == uid))


def controller_name(obj: ReadOnlyObject | None, kind: ResourceKind) -> str | None:
    """Name of `obj`'s controller if it is of `kind`, else None."""
    ref = _controller_of(obj, kind)
    return None if ref is None else str(ref.get("name", ""))


def owner_name(obj: ReadOnlyObject | None, kind: ResourceKind) -> str | None:
    """The controller's name if of `kind`, else the first owner of `kind` (controller or not), else None.

    A warm-pool member that lost its controller flag still belongs to its pool (controllers spec §4.2).
    """
    name = controller_name(obj, kind)
    if name is not None or obj is None:
        return name
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if owner_ref_matches(ref, kind.group, kind.kind):
            return str(ref.get("name", ""))
    return None


class Ownership(enum.StrEnum):
    """Classification of an object relative to a would-be owner (controllers spec §0.4)."""

    OWNED = "owned"
    UNOWNED = "unowned"
    FOREIGN = "foreign"


def classify_ownership(metadata: Mapping[str, Any], owner_uid: str) -> Ownership:
    """Classify an object by its controller owner reference against `owner_uid`."""
    ref = controller_ref(metadata)
    if ref is None:
        return Ownership.UNOWNED
    return Ownership.OWNED if ref.get("uid") == owner_uid else Ownership.FOREIGN


def new_controller_ref(*, api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    """A controller owner reference as every agent-sandbox controller writes it."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


# --------------------------------------------------------------------------- named references


def claim_pool_name(claim: ReadOnlyObject) -> str:
    """A claim's `spec.warmPoolRef.name` ("" when unset)."""
    return str(((claim.get("spec") or {}).get("warmPoolRef") or {}).get("name") or "")


def claim_sandbox_name(claim: ReadOnlyObject) -> str:
    """The Sandbox a claim's status records as bound, `status.sandbox.name` ("" when none)."""
    return str(((claim.get("status") or {}).get("sandbox") or {}).get("name") or "")


def sandbox_pool_name(sandbox: ReadOnlyObject) -> str | None:
    """The pool a Sandbox belongs to: its controller if a SandboxWarmPool, else any pool-kind owner (§4.2)."""
    return owner_name(sandbox, SANDBOX_WARM_POOL)


def pool_template_name(pool: ReadOnlyObject) -> str:
    """A pool's `spec.sandboxTemplateRef.name` ("" when unset)."""
    return str(((pool.get("spec") or {}).get("sandboxTemplateRef") or {}).get("name") or "")


def sandbox_pod_name(sandbox: ReadOnlyObject) -> str:
    """The Pod backing a Sandbox: the `agents.x-k8s.io/pod-name` annotation if non-empty, else its name."""
    meta = sandbox.get("metadata") or {}
    return str((meta.get("annotations") or {}).get(ANNOTATION_POD_NAME) or meta.get("name", ""))


def pool_update_strategy(pool: ReadOnlyObject) -> str:
    """`Recreate` only if `spec.updateStrategy.type` is exactly that; anything else is `OnReplenish` (§3.4)."""
    strategy = (pool.get("spec") or {}).get("updateStrategy") or {}
    if strategy.get("type") == UpdateStrategyType.RECREATE:
        return UpdateStrategyType.RECREATE.value
    return UpdateStrategyType.ON_REPLENISH.value


def pool_key(namespace: str, pool: str) -> str:
    """`<namespace>/<pool>`: the key of a pool's in-memory records (warm queue, expectations, holds)."""
    return f"{namespace}/{pool}"


# --------------------------------------------------------------------------- label rules (api spec §7.4)

#: Label/annotation prefixes never copied from a user pod template onto a Pod.
RESERVED_PREFIXES: tuple[str, ...] = (f"{GROUP}/", f"{EXTENSIONS_GROUP}/")
#: Annotation keys additionally never copied onto a Pod.
RESERVED_ANNOTATION_KEYS = frozenset({ANNOTATION_TRACE_CONTEXT})
_CREATED_BY_KNOWN = frozenset({CREATED_BY_GO_CLIENT, CREATED_BY_PYTHON_CLIENT, CREATED_BY_CONTROLLER})


def is_reserved_label(key: str) -> bool:
    """True if a pod-template label key must not be propagated to the Pod."""
    return key.startswith(RESERVED_PREFIXES)


def is_reserved_annotation(key: str) -> bool:
    """True if a pod-template annotation key must not be propagated to the Pod."""
    return key.startswith(RESERVED_PREFIXES) or key in RESERVED_ANNOTATION_KEYS


def normalize_created_by(value: str | None) -> str:
    """Normalise a `created-by` label value for the Pod (controllers spec §0.3).

    `go-client`, `python-client` and `controller` pass through; anything else, including a missing or
    empty value, becomes `unknown`.
    """
    if value is not None and value in _CREATED_BY_KNOWN:
        return value
    return CREATED_BY_UNKNOWN


# --------------------------------------------------------------------------- resourceVersion order


def compare_resource_versions(a: str, b: str) -> int | None:
    """-1, 0 or 1 as `a` is older than, the same as, or newer than `b`; None when not comparable.

    Kubernetes 1.35 (KEP-5504) makes the resourceVersions of one resource type served by kube-apiserver
    (built-in kinds and CRDs) comparable as monotonically increasing integers. Only well-formed versions
    compare (decimal digits, no sign, no leading zero); anything else (an aggregated API server's opaque
    token, "" or "0") answers None, and the caller must then fall back to equality.
    """
    if not (_well_formed(a) and _well_formed(b)):
        return None
    if len(a) != len(b):
        return -1 if len(a) < len(b) else 1
    return (a > b) - (a < b)


def _well_formed(rv: str) -> bool:
    return rv.isascii() and rv.isdigit() and rv[0] != "0"


def is_newer(a: ReadOnlyObject, b: ReadOnlyObject) -> bool:
    """True if object `a` carries a strictly newer resourceVersion than `b` (same resource type).

    Not comparable means not newer: a read-your-writes overlay then trusts the cache.
    """
    ra = str((a.get("metadata") or {}).get("resourceVersion") or "")
    rb = str((b.get("metadata") or {}).get("resourceVersion") or "")
    return compare_resource_versions(ra, rb) == 1
