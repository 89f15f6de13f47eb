"""Warm adoption, the pure parts: who is adoptable, how a candidate is judged, and the takeover patch.

Implements controllers spec §4.2 (adoptable), §4.5.1 (candidate check), §4.5.2 steps 2-7 (per-candidate
verdicts; the ordering lives in `queue`), and §4.6 step 3 (what the Sandbox looks like after adoption).

The takeover is one JSON patch (RFC 6902) whose leading `test` operations are the guard: the Sandbox
must still have the UID and the exact ownerReferences we saw in the cache. The API server applies a
patch inside its own optimistic-concurrency retry loop, so the test is a compare-and-swap on *ownership*
rather than on the whole object: an unrelated status write by the Sandbox controller between our cache
read and our patch no longer costs a 409 and a re-read (upstream's resourceVersion-guarded merge patch
does), yet two claims can never both re-parent one Sandbox - the second patch finds the first claim's
owner reference and fails with 422. See docs/design/claim-adoption.md.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api.kinds import SANDBOX_CLAIM, SANDBOX_WARM_POOL
from agent_sandbox.api.meta import ReadOnlyObject, controlled_by, is_ready, sandbox_pool_name
from agent_sandbox.api.naming import template_ref_hash

from ..blueprint import blueprint_matches
from .metadata import additional_metadata, merge_no_override
from .shape import apply_claim_labels, claim_owner_ref, desired_pod_metadata

__all__ = [
    "Contest",
    "RecreateGuard",
    "Verdict",
    "adoption_patch",
    "candidate_problem",
    "is_adoptable",
    "judge_candidate",
    "settle_contest",
]

_POOL_ONLY_LABELS = (
    c.LABEL_WARM_POOL_SANDBOX,
    c.LABEL_SANDBOX_POD_TEMPLATE_HASH,
    c.LABEL_SANDBOX_TEMPLATE_HASH,
)


def is_adoptable(sandbox: ReadOnlyObject | None) -> bool:
    """§4.2: not being deleted, both pool labels present, controlled by a SandboxWarmPool (any version)."""
    if sandbox is None:
        return False
    meta = sandbox.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return False
    labels = meta.get("labels") or {}
    if c.LABEL_WARM_POOL_SANDBOX not in labels or c.LABEL_SANDBOX_TEMPLATE_REF_HASH not in labels:
        return False
    return controlled_by(sandbox, SANDBOX_WARM_POOL)


def candidate_problem(sandbox: ReadOnlyObject, *, namespace: str, pool_name: str) -> str | None:
    """§4.5.1 candidate check for a claim in `namespace` drawing from `pool_name`; None when valid."""
    meta = sandbox.get("metadata") or {}
    if meta.get("namespace") != namespace:
        return "cross-namespace adoption forbidden"
    if not is_adoptable(sandbox):
        return "not adoptable"
    if sandbox_pool_name(sandbox) != pool_name:
        return f"belongs to pool {sandbox_pool_name(sandbox)!r}, not {pool_name!r}"
    return None


class Verdict(enum.Enum):
    """What selection does with one queued key (§4.5.2)."""

    ADOPT = "adopt"  # Ready: take it now
    FALLBACK = "fallback"  # networked but not Ready: usable if nothing Ready turns up
    PENDING = "pending"  # no Pod IPs yet: keep queued, counts toward the 2 s grace
    KEEP = "keep"  # cannot judge now (Recreate guard unresolved): keep queued
    DISCARD = "discard"  # gone, foreign, stale under Recreate: drop the key


@dataclass(frozen=True, slots=True)
class RecreateGuard:
    """Resolved Recreate-strategy context: the pool's template spec and its blueprint hash."""

    template_spec: Mapping[str, Any]
    blueprint_hash: str


def judge_candidate(
    sandbox: ReadOnlyObject | None,
    *,
    namespace: str,
    pool_name: str,
    recreate: RecreateGuard | None,
    recreate_unresolved: bool = False,
) -> Verdict:
    """Verdict for one queued key (§4.5.2 steps 2-7).

    Args:
        sandbox: the freshest cached view, None when the Sandbox is gone.
        recreate: set when the pool uses `Recreate` (stale members must not be adopted).
        recreate_unresolved: the pool is `Recreate` but its template could not be read: keep the key.
    """
    if sandbox is None:
        return Verdict.DISCARD
    problem = candidate_problem(sandbox, namespace=namespace, pool_name=pool_name)
    if problem is not None:
        # A cross-namespace key is a bug in the feeding side; keep it rather than lose it silently.
        return Verdict.KEEP if problem.startswith("cross-namespace") else Verdict.DISCARD
    status = sandbox.get("status") or {}
    if recreate_unresolved:
        return Verdict.PENDING if not status.get("podIPs") else Verdict.KEEP
    if recreate is not None:
        labels = sandbox["metadata"].get("labels") or {}
        if labels.get(c.LABEL_SANDBOX_TEMPLATE_HASH) != recreate.blueprint_hash and not blueprint_matches(
            recreate.template_spec, sandbox.get("spec") or {}
        ):
            return Verdict.DISCARD  # stale under Recreate: the pool is replacing it
    if not status.get("podIPs"):
        return Verdict.PENDING
    return Verdict.ADOPT if is_ready(sandbox) else Verdict.FALLBACK


def _pointer(*parts: str) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def adoption_patch(
    claim: ReadOnlyObject, sandbox: ReadOnlyObject, template: ReadOnlyObject | None
) -> list[dict[str, Any]]:
    """The JSON patch that moves `sandbox` (as cached) from its pool to `claim` (§4.6 step 3).

    Raises:
        ReconcilerError: the claim's additional metadata conflicts with the template (§4.7.2).
    """
    meta = sandbox["metadata"]
    labels = dict(meta.get("labels") or {})
    remembered_ref_hash = labels.get(c.LABEL_SANDBOX_TEMPLATE_REF_HASH, "")
    for key in _POOL_ONLY_LABELS:
        labels.pop(key, None)
    labels[c.LABEL_LAUNCH_TYPE] = c.LAUNCH_TYPE_WARM
    ref_hash = remembered_ref_hash or (template_ref_hash(template["metadata"]["name"]) if template else "")
    apply_claim_labels(labels, claim, ref_hash)

    if template is not None:
        pod_meta: dict[str, Any] = desired_pod_metadata(claim, template)
    else:
        current = ((sandbox.get("spec") or {}).get("podTemplate") or {}).get("metadata") or {}
        pod_labels = dict(current.get("labels") or {})
        pod_annotations = dict(current.get("annotations") or {})
        if pod_annotations.get(c.ANNOTATION_SAFE_TO_EVICT) == "true":
            del pod_annotations[c.ANNOTATION_SAFE_TO_EVICT]  # the pool's, not a template choice
        apply_claim_labels(pod_labels, claim, ref_hash)
        extra_labels, extra_annotations = additional_metadata(claim)
        merge_no_override(pod_labels, extra_labels, what="label")
        merge_no_override(pod_annotations, extra_annotations, what="annotation")
        pod_meta = {"labels": pod_labels, "annotations": pod_annotations}

    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
        {"op": "test", "path": "/metadata/ownerReferences", "value": meta.get("ownerReferences") or []},
        {"op": "replace", "path": "/metadata/ownerReferences", "value": [claim_owner_ref(claim)]},
        {"op": "add", "path": "/metadata/labels", "value": labels},
    ]
    annotations = {c.ANNOTATION_POD_NAME: meta["name"]}
    trace = (claim["metadata"].get("annotations") or {}).get(c.ANNOTATION_TRACE_CONTEXT)
    if trace:
        annotations[c.ANNOTATION_TRACE_CONTEXT] = trace
    if meta.get("annotations") is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": annotations})
    else:
        # Key by key: the Sandbox controller may be writing other annotations concurrently.
        ops.extend(
            {"op": "add", "path": _pointer("metadata", "annotations", k), "value": v}
            for k, v in sorted(annotations.items())
        )
    ops.append({"op": "add", "path": "/spec/podTemplate/metadata", "value": pod_meta})
    return ops


class Contest(enum.Enum):
    """How a takeover whose guard failed (422), or that met 404/409, is settled from an authoritative read."""

    OURS = "ours"  # already controlled by this claim (an earlier attempt applied): success, no write
    RETRY = "retry"  # still a valid candidate of our pool, our view was just stale: patch the fresh object
    LOST = "lost"  # gone, deleting, taken by another claim, or no longer adoptable: try another candidate


def settle_contest(
    fresh: ReadOnlyObject | None, *, claim_uid: str, namespace: str, pool_name: str
) -> Contest:
    """Classify the authoritative view of a contested candidate (§4.6 "authoritative resolution")."""
    if fresh is None:
        return Contest.LOST
    if controlled_by(fresh, SANDBOX_CLAIM, claim_uid):
        return Contest.OURS
    if candidate_problem(fresh, namespace=namespace, pool_name=pool_name) is None:
        return Contest.RETRY
    return Contest.LOST
