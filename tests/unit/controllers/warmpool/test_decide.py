"""Pool decisions as tables (controllers spec §3.3-§3.5, §3.9; pinned cases of §6.3)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.controllers.warmpool.config import WarmPoolConfig
from agent_sandbox.controllers.warmpool.decide import PoolPlan, PoolSnapshot, decide

from .fixtures import NOW, POOL_UID, member, pool, template, unschedulable_pod

pytestmark = pytest.mark.unit

CFG = WarmPoolConfig(grace_jitter=0)


def plan_for(
    members: list[dict[str, Any]],
    *,
    pool_obj: dict[str, Any] | None = None,
    tmpl: dict[str, Any] | None = None,
    missing: bool = False,
    error: str | None = None,
    pods: dict[str, Any] | None = None,
    pending: frozenset[str] = frozenset(),
    config: WarmPoolConfig = CFG,
) -> PoolPlan:
    snap = PoolSnapshot(
        pool_obj or pool(),
        tuple(members),
        None if (missing or error) else (tmpl or template()),
        template_missing=missing,
        template_error=error,
        pods=pods or {},
        pending_deletions=pending,
    )
    return decide(snap, NOW, config)


def names(n: int, prefix: str = "m") -> list[dict[str, Any]]:
    return [member(f"{prefix}{i}", age=3600 + i) for i in range(n)]


@pytest.mark.parametrize(
    ("replicas", "existing", "create", "excess"),
    [
        pytest.param(None, 0, 1, 0, id="nil-replicas-means-one"),
        pytest.param(3, 0, 3, 0, id="fill-empty-pool"),
        pytest.param(3, 1, 2, 0, id="top-up"),
        pytest.param(3, 5, 0, 2, id="delete-excess"),
        pytest.param(3, 3, 0, 0, id="steady-state"),
        pytest.param(0, 3, 0, 3, id="zero-replicas-empties-pool"),
        pytest.param(0, 0, 0, 0, id="zero-and-empty"),
    ],
)
def test_sizing(replicas: int | None, existing: int, create: int, excess: int) -> None:
    plan = plan_for(names(existing), pool_obj=pool(replicas))
    assert (plan.create.want if plan.create else 0) == create
    assert len(plan.excess) == excess
    assert plan.desired == (1 if replicas is None else replicas)
    assert plan.current == existing
    assert not plan.gc
    assert not plan.updates


def test_batch_size_caps_creates_and_deletes() -> None:
    cfg = WarmPoolConfig(max_batch_size=4, grace_jitter=0)
    assert plan_for([], pool_obj=pool(10), config=cfg).create.want == 4  # type: ignore[union-attr]
    assert len(plan_for(names(10), pool_obj=pool(1), config=cfg).excess) == 4


def test_excess_deletes_not_ready_first_then_newest() -> None:
    members = [
        member("old-ready", age=5000),
        member("new-ready", age=100),
        member("old-unready", age=200, ready=False),
        member("new-unready", age=10, ready=False),
    ]
    plan = plan_for(members, pool_obj=pool(1))
    assert [d.name for d in plan.excess] == ["new-unready", "old-unready", "new-ready"]
    assert all(d.owned and d.reason == "excess" for d in plan.excess)
    assert plan.excess[0].resource_version == "1"


def test_controller_references() -> None:
    orphan = member("orphan", owner_uid=None)
    owned = member("owned")
    foreign = member("foreign", owner_uid="claim-uid")
    plan = plan_for([orphan, owned, foreign], pool_obj=pool(3))
    assert plan.current == 2  # the foreign one is ignored entirely
    assert plan.create is not None
    assert plan.create.want == 1
    (adopt,) = plan.updates
    assert adopt.reason == "adopt"
    assert adopt.name == "orphan"
    assert adopt.patch["metadata"]["resourceVersion"] == "1"  # optimistic lock
    refs = adopt.patch["metadata"]["ownerReferences"]
    assert refs == [
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxWarmPool",
            "name": "pool",
            "uid": POOL_UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert adopt.patch["metadata"]["labels"] == {c.LABEL_LAUNCH_TYPE: "warm"}
    assert "ownerReferences" not in orphan["metadata"]  # the cached object is not modified


def test_adoption_keeps_non_controller_owner_references() -> None:
    orphan = member("orphan", owner_uid=None)
    orphan["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "y"}
    ]
    (adopt,) = plan_for([orphan]).updates
    assert [r["kind"] for r in adopt.patch["metadata"]["ownerReferences"]] == ["ConfigMap", "SandboxWarmPool"]


def test_owned_member_without_warm_launch_type_is_relabelled() -> None:
    sb = member("m")
    del sb["metadata"]["labels"][c.LABEL_LAUNCH_TYPE]
    (update,) = plan_for([sb], pool_obj=pool(1)).updates
    assert update.reason == "launch-type"
    assert update.name == "m"
    assert update.patch == {"metadata": {"labels": {c.LABEL_LAUNCH_TYPE: "warm"}}}


def test_status_counts_ready_active_members_and_generation() -> None:
    members = [member("a"), member("b", ready=False, age=10), member("c", deleting=True)]
    plan = plan_for(members, pool_obj=pool(2, generation=7))
    assert plan.status == {
        "replicas": 2,
        "readyReplicas": 1,
        "selector": f"agents.x-k8s.io/warm-pool-sandbox={naming.name_hash('pool')}",
        "observedGeneration": 7,
    }
    assert plan.status_changed


def test_status_zero_values_are_a_change_and_then_steady() -> None:
    written = {
        "replicas": 0,
        "readyReplicas": 0,
        "selector": f"{c.LABEL_WARM_POOL_SANDBOX}={naming.name_hash('pool')}",
        "observedGeneration": 1,
    }
    old = {**written, "replicas": 3, "readyReplicas": 3}
    plan = plan_for([], pool_obj=pool(0, status=old))
    assert plan.status == written
    assert plan.status_changed
    assert not plan_for([], pool_obj=pool(0, status=written)).status_changed


def test_terminating_and_pending_deletions_count_against_the_target() -> None:
    members = [member("a"), member("b", deleting=True), member("c")]
    plan = plan_for(members, pool_obj=pool(3))
    assert (plan.current, plan.terminating, plan.create) == (2, 1, None)
    plan = plan_for([member("a"), member("c")], pool_obj=pool(3), pending=frozenset({"c-uid"}))
    assert (plan.current, plan.terminating) == (1, 1)
    assert plan.create is not None
    assert plan.create.want == 1
    # A foreign member being deleted does not count.
    plan = plan_for([member("a"), member("f", owner_uid="other", deleting=True)], pool_obj=pool(2))
    assert (plan.terminating, plan.create.want if plan.create else 0) == (0, 1)


def test_readiness_grace_period() -> None:
    cfg = WarmPoolConfig(readiness_grace_period=60, grace_jitter=0)
    young = member("young", ready=False, age=50)
    stuck = member("stuck", ready=False, age=70)
    plan = plan_for([young, stuck, member("ok")], pool_obj=pool(3), config=cfg)
    assert [(d.name, d.reason, d.owned) for d in plan.gc] == [("stuck", "stuck", True)]
    assert (plan.current, plan.terminating) == (2, 1)
    assert plan.create is None  # the replacement waits until the deletion is observed
    assert plan.grace_requeue == pytest.approx(60 - 50 + 2)


def test_earliest_grace_deadline_wins() -> None:
    cfg = WarmPoolConfig(readiness_grace_period=100, grace_jitter=0)
    plan = plan_for(
        [member("a", ready=False, age=10), member("b", ready=False, age=90)], config=cfg, pool_obj=pool(2)
    )
    assert plan.grace_requeue == pytest.approx(100 - 90 + 2)
    assert plan_for([member("a")], config=cfg).grace_requeue == 0


def test_unschedulable_members_are_held_others_replaced() -> None:
    cfg = WarmPoolConfig(readiness_grace_period=60, grace_jitter=0)
    held = member("held", ready=False, age=100)
    scheduled_stuck = member("scheduled", ready=False, age=100)
    podless = member("podless", ready=False, age=100)
    pods = {
        "held": unschedulable_pod("held"),
        "scheduled": {
            "metadata": {"name": "scheduled"},
            "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
        },
    }
    plan = plan_for([held, scheduled_stuck, podless], pool_obj=pool(3), pods=pods, config=cfg)
    assert plan.unschedulable == 1
    assert sorted(d.name for d in plan.gc) == ["podless", "scheduled"]
    assert plan.current == 1
    assert plan.terminating == 2


def test_unschedulable_pod_found_through_pod_name_annotation() -> None:
    cfg = WarmPoolConfig(readiness_grace_period=60, grace_jitter=0)
    sb = member("sb", ready=False, age=100)
    sb["metadata"]["annotations"][c.ANNOTATION_POD_NAME] = "the-pod"
    plan = plan_for([sb], pods={"the-pod": unschedulable_pod("the-pod")}, config=cfg)
    assert plan.unschedulable == 1
    assert not plan.gc


@pytest.mark.parametrize(
    ("strategy", "recreated"),
    [("Recreate", True), ("OnReplenish", False), (None, False), ("", False)],
)
def test_template_update_rollout(strategy: str | None, recreated: bool) -> None:
    old = template(image="img:1")
    new = template(image="img:2")
    members = [member(f"m{i}", tmpl=old) for i in range(3)]
    plan = plan_for(members, pool_obj=pool(3, strategy=strategy), tmpl=new)
    if recreated:
        assert sorted(d.name for d in plan.gc) == ["m0", "m1", "m2"]
        assert all(d.reason == "stale" and d.owned for d in plan.gc)
        assert (plan.current, plan.terminating, plan.create) == (0, 3, None)
    else:
        assert not plan.gc
        assert plan.current == 3


def test_metadata_only_template_change_never_recreates() -> None:
    old = template()
    new = template()
    new["spec"]["podTemplate"]["metadata"]["labels"]["new"] = "label"
    plan = plan_for([member("m", tmpl=old)], pool_obj=pool(1, strategy="Recreate"), tmpl=new)
    assert not plan.gc
    assert plan.current == 1


def test_template_ref_change_recreates_even_with_identical_spec() -> None:
    members = [member("m", tmpl=template("tmpl"))]
    plan = plan_for(
        members, pool_obj=pool(1, template_name="other", strategy="Recreate"), tmpl=template("other")
    )
    assert [d.name for d in plan.gc] == ["m"]
    # OnReplenish keeps it (it stays claimable); the replacement uses the new template.
    plan = plan_for(members, pool_obj=pool(2, template_name="other"), tmpl=template("other"))
    assert not plan.gc
    assert plan.create is not None
    assert plan.create.body["metadata"]["annotations"] == {c.ANNOTATION_SANDBOX_TEMPLATE_REF: "other"}


def test_stale_orphans_are_deleted_without_counting() -> None:
    stale_orphan = member("o", tmpl=template(image="old"), owner_uid=None)
    plan = plan_for([stale_orphan, member("a")], pool_obj=pool(2))
    assert [(d.name, d.owned) for d in plan.gc] == [("o", False)]
    assert (plan.current, plan.terminating) == (1, 0)
    assert plan.create is not None
    assert plan.create.want == 1


def test_missing_template_creates_nothing_and_judges_nothing_stale() -> None:
    stale_orphan = member("o", tmpl=template(image="old"), owner_uid=None)
    plan = plan_for([stale_orphan], pool_obj=pool(3, strategy="Recreate"), missing=True)
    assert plan.create is None
    assert not plan.gc
    assert [u.reason for u in plan.updates] == ["adopt"]
    assert plan.status["replicas"] == 1
    assert plan.template_error is None
    assert not plan.template_ok
    assert plan.template_missing  # the reconciler's SandboxTemplateNotFound Event


def test_template_read_error_is_reported() -> None:
    plan = plan_for([], pool_obj=pool(1), error="boom")
    assert plan.create is None
    assert plan.template_error == "boom"
    assert not plan.template_missing  # unknown, not missing: no event either way
    assert not plan_for([], pool_obj=pool(1)).template_missing
