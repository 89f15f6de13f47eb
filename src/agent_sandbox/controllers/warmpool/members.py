"""Pool members: their shape, staleness and health (controllers spec §3.5, §3.8).

Owns: building the member Sandbox body once per pass (§3.8, created n times with `generateName`), the
staleness test with its per-pass verdict cache (§3.8.2), the Pod-unschedulable test (§3.5), and the Go
duration rendering used in the NotProgressing event (§3.10).

Pure functions over raw wire dicts; inputs are never mutated (cached objects are shared).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.api.meta import new_controller_ref, pool_template_name, status_condition
from agent_sandbox.api.naming import template_ref_hash
from agent_sandbox.kube import SANDBOX, SANDBOX_WARM_POOL, Object

from ..blueprint import apply_secure_defaults, blueprint, blueprint_matches

__all__ = [
    "StalenessChecker",
    "build_member",
    "go_duration",
    "pod_unschedulable",
]


def pod_unschedulable(pod: Mapping[str, Any] | None) -> bool:
    """First `PodScheduled` condition is `False` with reason `Unschedulable` (missing/deleting Pod: no)."""
    if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    cond = status_condition(pod, c.CONDITION_POD_SCHEDULED)
    return (
        cond is not None
        and cond.get("status") == c.ConditionStatus.FALSE
        and cond.get("reason") == "Unschedulable"
    )


def build_member(
    pool: Object,
    template: Object,
    *,
    pod_template_hash: str,
    blueprint_hash: str,
    enable_eviction: bool,
) -> Object:
    """The member Sandbox of §3.8 (generateName `<pool>-`, pool as controller owner, secure defaults)."""
    pool_meta = pool["metadata"]
    template_spec = template.get("spec") or {}
    ref_name = pool_template_name(pool)
    hashes = {
        c.LABEL_WARM_POOL_SANDBOX: naming.name_hash(pool_meta["name"]),
        c.LABEL_SANDBOX_TEMPLATE_REF_HASH: template_ref_hash(ref_name),
        c.LABEL_SANDBOX_POD_TEMPLATE_HASH: pod_template_hash,
        c.LABEL_SANDBOX_TEMPLATE_HASH: blueprint_hash,
    }
    spec = copy.deepcopy(blueprint(template_spec))
    pod_template = spec["podTemplate"]
    pod_meta = dict(pod_template.get("metadata") or {})
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **hashes}
    annotations = dict(pod_meta.get("annotations") or {})
    # An explicit template value ("true" or "false") always wins over the flag.
    if enable_eviction and c.ANNOTATION_SAFE_TO_EVICT not in annotations:
        annotations[c.ANNOTATION_SAFE_TO_EVICT] = "true"
    if annotations:
        pod_meta["annotations"] = annotations
    pod_template["metadata"] = pod_meta
    pod_template["spec"] = apply_secure_defaults(template_spec, pod_template.get("spec") or {})
    return {
        "apiVersion": SANDBOX.api_version,
        "kind": SANDBOX.kind,
        "metadata": {
            "generateName": f"{pool_meta['name']}-",
            "namespace": pool_meta["namespace"],
            "labels": {
                **hashes,
                c.LABEL_LAUNCH_TYPE: c.LAUNCH_TYPE_WARM,
                c.LABEL_CREATED_BY: c.CREATED_BY_CONTROLLER,
            },
            "annotations": {c.ANNOTATION_SANDBOX_TEMPLATE_REF: ref_name},
            "ownerReferences": [
                new_controller_ref(
                    api_version=SANDBOX_WARM_POOL.api_version,
                    kind=SANDBOX_WARM_POOL.kind,
                    name=pool_meta["name"],
                    uid=pool_meta["uid"],
                )
            ],
        },
        "spec": spec,
    }


class StalenessChecker:
    """The staleness test of §3.8.2 for one pass, caching verdicts by the member's hash label."""

    __slots__ = ("_current_hash", "_ref_hash", "_spec", "_verdicts")

    def __init__(self, template: Object, current_blueprint_hash: str) -> None:
        self._spec: Mapping[str, Any] = template.get("spec") or {}
        self._ref_hash = template_ref_hash(template["metadata"]["name"])
        self._current_hash = current_blueprint_hash
        self._verdicts: dict[str, bool] = {}

    def is_stale(self, sandbox: Mapping[str, Any], *, orphan: bool) -> bool:
        labels = (sandbox.get("metadata") or {}).get("labels") or {}
        if labels.get(c.LABEL_SANDBOX_TEMPLATE_REF_HASH, "") != self._ref_hash:
            return True
        spec = sandbox.get("spec") or {}
        if orphan:  # never trust the labels of a Sandbox we did not create
            return not blueprint_matches(self._spec, spec)
        member_hash = labels.get(c.LABEL_SANDBOX_TEMPLATE_HASH, "")
        if member_hash and member_hash == self._current_hash:
            return False
        if not self._current_hash:
            return False  # hash not computable: never mass-delete on that
        if member_hash in self._verdicts:
            return self._verdicts[member_hash]
        stale = not blueprint_matches(self._spec, spec)
        if member_hash:
            self._verdicts[member_hash] = stale
        return stale


def go_duration(seconds: float) -> str:
    """Render like Go's `time.Duration.String()` (`5m0s`, `1h0m0s`, `1.5s`, `500ms`, `0s`)."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _fraction(ns, size) + unit
    hours, rem = divmod(ns, 3600 * 1_000_000_000)
    minutes, rem = divmod(rem, 60 * 1_000_000_000)
    out = sign
    if hours:
        out += f"{hours}h"
    if hours or minutes:
        out += f"{minutes}m"
    return out + _fraction(rem, 1_000_000_000) + "s"


def _fraction(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{str(frac).zfill(digits).rstrip('0')}"
