"""Warm adoption, pure parts: candidate verdicts, the takeover patch, contest settlement (spec §4.2, §4.5, §4.6)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.controllers.blueprint import blueprint_hash
from agent_sandbox.controllers.claim.adoption import (
    Contest,
    RecreateGuard,
    Verdict,
    adoption_patch,
    is_adoptable,
    judge_candidate,
    settle_contest,
)
from agent_sandbox.controllers.claim.errors import ReconcilerError
from agent_sandbox.kube import apply_json_patch
from tests.unit.controllers.claim.builders import NS, claim, member, template

pytestmark = pytest.mark.unit


def _judge(sb: dict[str, Any] | None, **kw: Any) -> Verdict:
    return judge_candidate(sb, namespace=NS, pool_name="pool", recreate=kw.pop("recreate", None), **kw)


def _deleting() -> dict[str, Any]:
    sb = member("m")
    sb["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return sb


def _unlabelled() -> dict[str, Any]:
    sb = member("m")
    del sb["metadata"]["labels"][c.LABEL_WARM_POOL_SANDBOX]
    return sb


VERDICTS: list[tuple[str, dict[str, Any] | None, Verdict]] = [
    ("gone", None, Verdict.DISCARD),
    ("ready and networked", member("m"), Verdict.ADOPT),
    ("networked, not ready", member("m", ready=False), Verdict.FALLBACK),
    ("no pod IPs yet", member("m", ips=()), Verdict.PENDING),
    ("ready but no IPs", member("m", ready=True, ips=()), Verdict.PENDING),
    ("being deleted", _deleting(), Verdict.DISCARD),
    ("foreign controller (a claim)", member("m", owner_kind=c.KIND_SANDBOX_CLAIM), Verdict.DISCARD),
    ("unowned look-alike", member("m", controller=False), Verdict.DISCARD),
    ("missing pool label", _unlabelled(), Verdict.DISCARD),
    ("another pool", member("m", pool_name="other"), Verdict.DISCARD),
    ("another namespace is kept, never adopted", member("m", ns="elsewhere"), Verdict.KEEP),
]


@pytest.mark.parametrize(("case", "sandbox", "want"), VERDICTS, ids=[v[0] for v in VERDICTS])
def test_candidate_verdicts(case: str, sandbox: dict[str, Any] | None, want: Verdict) -> None:
    assert _judge(sandbox) is want


def test_recreate_guard_discards_stale_and_keeps_fresh_or_semantically_current() -> None:
    tmpl = template()
    guard = RecreateGuard(tmpl["spec"], blueprint_hash(tmpl["spec"]))
    fresh = member("fresh", template_hash=guard.blueprint_hash)
    assert _judge(fresh, recreate=guard) is Verdict.ADOPT
    # Hash label from another encoder, but the blueprint is the template's (secure defaults applied): adoptable.
    current = member("current", template_hash="deadbeef")
    assert _judge(current, recreate=guard) is Verdict.ADOPT
    stale = member("stale", template_hash="deadbeef")
    stale["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = "old-image"
    assert _judge(stale, recreate=guard) is Verdict.DISCARD
    # OnReplenish (no guard): stale members stay adoptable.
    assert _judge(stale) is Verdict.ADOPT


def test_recreate_guard_unresolved_keeps_candidates_queued() -> None:
    assert _judge(member("m"), recreate_unresolved=True) is Verdict.KEEP
    assert _judge(member("m", ips=()), recreate_unresolved=True) is Verdict.PENDING


def _adopted(sb: dict[str, Any], cl: dict[str, Any], tmpl: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = apply_json_patch(sb, adoption_patch(cl, sb, tmpl))
    return out


def test_takeover_reparents_and_relabels() -> None:
    sb = member("pool-abc", node="n1")
    sb["metadata"]["annotations"][c.ANNOTATION_POD_NAME] = "stale-pod-name"
    cl = claim(labels={c.LABEL_CREATED_BY: "go-client"}, annotations={c.ANNOTATION_TRACE_CONTEXT: "{}"})
    out = _adopted(sb, cl, template())
    meta = out["metadata"]
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "name": "c1",
            "uid": "c1-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert meta["labels"] == {
        c.LABEL_SANDBOX_TEMPLATE_REF_HASH: naming.name_hash("tmpl"),
        c.LABEL_LAUNCH_TYPE: "warm",
        c.LABEL_CREATED_BY: "go-client",  # the pool's "controller" is overwritten by the claim's
        c.LABEL_CLAIM_UID: "c1-uid",
    }
    assert meta["annotations"][c.ANNOTATION_POD_NAME] == "pool-abc"  # stale value corrected
    assert meta["annotations"][c.ANNOTATION_TRACE_CONTEXT] == "{}"
    assert meta["annotations"][c.ANNOTATION_SANDBOX_TEMPLATE_REF] == "tmpl"
    pod_meta = out["spec"]["podTemplate"]["metadata"]
    assert pod_meta == {
        "labels": {
            "app": "demo",
            c.LABEL_CLAIM_UID: "c1-uid",
            c.LABEL_CREATED_BY: "go-client",
            c.LABEL_SANDBOX_TEMPLATE_REF_HASH: naming.name_hash("tmpl"),
        },
        "annotations": {"team": "x"},  # the pool's safe-to-evict "true" is gone
    }
    assert out["spec"]["podTemplate"]["spec"] == sb["spec"]["podTemplate"]["spec"]  # the Pod is not restarted
    assert out["status"] == sb["status"]


def test_takeover_removes_created_by_when_claim_has_none() -> None:
    out = _adopted(member("m"), claim(), template())
    assert c.LABEL_CREATED_BY not in out["metadata"]["labels"]
    assert c.LABEL_CREATED_BY not in out["spec"]["podTemplate"]["metadata"]["labels"]


def test_safe_to_evict_template_false_kept_claim_true_kept() -> None:
    tmpl = template()
    tmpl["spec"]["podTemplate"]["metadata"]["annotations"][c.ANNOTATION_SAFE_TO_EVICT] = "false"
    out = _adopted(member("m", pod_annotations={c.ANNOTATION_SAFE_TO_EVICT: "false"}), claim(), tmpl)
    assert out["spec"]["podTemplate"]["metadata"]["annotations"][c.ANNOTATION_SAFE_TO_EVICT] == "false"
    cl = claim(additionalPodMetadata={"annotations": {c.ANNOTATION_SAFE_TO_EVICT: "true"}})
    out = _adopted(member("m"), cl, template())
    assert out["spec"]["podTemplate"]["metadata"]["annotations"][c.ANNOTATION_SAFE_TO_EVICT] == "true"


def test_takeover_without_template_keeps_pod_metadata_minus_pool_evict_flag() -> None:
    cl = claim(additionalPodMetadata={"labels": {"sandbox.users.io/t": "1"}})
    out = _adopted(member("m"), cl, None)
    pod_meta = out["spec"]["podTemplate"]["metadata"]
    assert c.ANNOTATION_SAFE_TO_EVICT not in pod_meta["annotations"]
    assert pod_meta["labels"]["sandbox.users.io/t"] == "1"
    assert pod_meta["labels"][c.LABEL_CLAIM_UID] == "c1-uid"
    assert pod_meta["labels"][c.LABEL_SANDBOX_TEMPLATE_REF_HASH] == naming.name_hash("tmpl")


def test_takeover_metadata_conflict_is_an_error() -> None:
    cl = claim(additionalPodMetadata={"annotations": {"team": "y"}})
    with pytest.raises(ReconcilerError, match="metadata override conflict"):
        adoption_patch(cl, member("m"), template())


def test_takeover_guard_fails_once_ownership_changed() -> None:
    sb = member("m")
    ops = adoption_patch(claim("c1"), sb, template())
    taken = apply_json_patch(sb, adoption_patch(claim("c2", uid="c2-uid"), sb, template()))
    with pytest.raises(ValueError, match="test failed"):
        apply_json_patch(taken, ops)  # the second claim's patch finds the first claim's owner reference
    # An unrelated change (status, other annotations) does not break the guard.
    busy = copy.deepcopy(sb)
    busy["status"]["podIPs"] = ["10.9.9.9"]
    busy["metadata"]["annotations"]["other"] = "x"
    out = apply_json_patch(busy, ops)
    assert out["metadata"]["annotations"]["other"] == "x"


def test_takeover_adds_annotations_map_when_absent() -> None:
    sb = member("m")
    del sb["metadata"]["annotations"]
    out = _adopted(sb, claim(), template())
    assert out["metadata"]["annotations"] == {c.ANNOTATION_POD_NAME: "m"}


def test_settle_contest() -> None:
    kw = {"claim_uid": "c1-uid", "namespace": NS, "pool_name": "pool"}
    assert settle_contest(None, **kw) is Contest.LOST
    assert settle_contest(member("m"), **kw) is Contest.RETRY
    ours = _adopted(member("m"), claim(), template())
    assert settle_contest(ours, **kw) is Contest.OURS
    theirs = _adopted(member("m"), claim("c2", uid="c2-uid"), template())
    assert settle_contest(theirs, **kw) is Contest.LOST
    assert not is_adoptable(theirs)
