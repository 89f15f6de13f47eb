"""`decide(snapshot, now)`: every branch of spec §1.2-§1.10 as tables over snapshots (no I/O)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from agent_sandbox.api.constants import (
    ANNOTATION_POD_NAME,
    ANNOTATION_TRACE_CONTEXT,
    LABEL_ADOPTABLE,
    LABEL_SANDBOX_NAME_HASH,
)
from agent_sandbox.api.meta import sandbox_pod_name
from agent_sandbox.controllers.sandbox import PlanMode, check_expiry, decide
from agent_sandbox.controllers.sandbox.decide import deferral
from agent_sandbox.controllers.sandbox.plan import (
    Action,
    CreateObject,
    DeleteObject,
    DeleteSandbox,
    EmitEvent,
    PatchObject,
    PatchSandboxMetadata,
    Plan,
    ServiceFields,
)
from tests.unit.controllers.sandbox.builders import (
    HASH,
    NOW,
    SB,
    SB_UID,
    pod,
    pvc,
    ref,
    sandbox,
    service,
    snap,
    vct,
)

pytestmark = pytest.mark.unit

FOREIGN = ref("ReplicaSet", "rs", "uid-rs", api_version="apps/v1")
OLD_INCARNATION = ref(uid="uid-sb-previous")
SET_NAME = ("sandbox-meta", {ANNOTATION_POD_NAME: SB})
CLEAR_NAME = ("sandbox-meta", {ANNOTATION_POD_NAME: None})


def _summary(actions: tuple[Action, ...]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for a in actions:
        if isinstance(a, CreateObject):
            out.append(("create", a.kind.kind, a.obj["metadata"]["name"]))
        elif isinstance(a, PatchObject):
            out.append(("patch", a.kind.kind, a.name))
        elif isinstance(a, DeleteObject):
            out.append(("delete", a.kind.kind, a.name))
        elif isinstance(a, PatchSandboxMetadata):
            out.append(("sandbox-meta", a.patch["metadata"]["annotations"]))
        elif isinstance(a, DeleteSandbox):
            out.append(("delete-sandbox",))
        elif isinstance(a, EmitEvent):
            out.append(("event", a.type_, a.reason))
    return out


def _pod_actions(plan: Plan) -> list[tuple[Any, ...]]:
    return _summary(plan.pod.actions)


# --------------------------------------------------------------------------- top-level branches (§1.2)


def test_being_deleted_does_nothing() -> None:
    plan = decide(snap(sandbox(deleting=True)), NOW)
    assert plan.mode is PlanMode.IGNORE


def test_waits_while_own_writes_are_not_in_the_cache() -> None:
    plan = decide(snap(sandbox(), awaiting_cache=60.0), NOW)
    assert plan.mode is PlanMode.WAIT
    assert plan.requeue_after == 60.0


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        (None, (False, None)),
        (timedelta(hours=1), (False, 3600.0)),
        (timedelta(0), (True, None)),
        (timedelta(milliseconds=500), (False, 2.0)),
        (-timedelta(days=1), (True, None)),
    ],
    ids=["never", "future-remaining", "now-is-expired", "500ms-ahead-2s", "past"],
)
def test_check_expiry(offset: timedelta | None, expected: tuple[bool, float | None]) -> None:
    assert check_expiry(None if offset is None else NOW + offset, NOW) == expected


@pytest.mark.parametrize("policy", [None, "Retain", "Delete"])
def test_expiry_first_pass_only_marks(policy: str | None) -> None:
    sb = sandbox(shutdown_time=NOW - timedelta(seconds=1), shutdown_policy=policy)
    plan = decide(snap(sb, pods=[pod()], svc=service()), NOW)
    assert plan.mode is PlanMode.EXPIRE_MARK
    assert plan.requeue_after == 0.001
    assert plan.teardown == ()


EXPIRED = {
    "conditions": [
        {"type": "Ready", "status": "False", "reason": "SandboxExpired", "message": "Sandbox has expired"}
    ]
}


@pytest.mark.parametrize(
    ("policy", "pods", "svc", "annotations", "expected"),
    [
        ("Retain", [pod()], service(), None, [("delete", "Pod", SB), ("delete", "Service", SB)]),
        (
            "Delete",
            [pod()],
            service(),
            None,
            [("delete", "Pod", SB), ("delete", "Service", SB), ("delete-sandbox",)],
        ),
        ("Retain", [pod(owned=False)], service(owner=FOREIGN), None, []),
        ("Delete", [pod(owner=FOREIGN)], None, None, [("delete-sandbox",)]),
        ("Retain", [], None, None, []),
        ("Retain", [pod(deleting=True)], None, None, []),
        ("Retain", [pod("warm-1")], None, {ANNOTATION_POD_NAME: "warm-1"}, [("delete", "Pod", "warm-1")]),
    ],
    ids=[
        "retain",
        "delete",
        "unowned-survive",
        "foreign-pod-survives-delete",
        "no-children",
        "already-terminating",
        "tracked-by-annotation",
    ],
)
def test_expiry_second_pass_teardown(
    policy: str,
    pods: list[dict[str, Any]],
    svc: dict[str, Any] | None,
    annotations: dict[str, str] | None,
    expected: list[tuple[Any, ...]],
) -> None:
    sb = sandbox(shutdown_time=NOW, shutdown_policy=policy, status=EXPIRED, annotations=annotations)
    plan = decide(snap(sb, pods=pods, svc=svc), NOW)
    assert plan.mode is PlanMode.EXPIRE_TEARDOWN
    assert [s for step in plan.teardown for s in _summary(step.actions)] == expected
    assert all(len(step.actions) == 1 for step in plan.teardown)  # independent steps


def test_expiry_teardown_skips_pod_whose_delete_is_in_flight() -> None:
    sb = sandbox(shutdown_time=NOW, status=EXPIRED)
    plan = decide(snap(sb, pods=[pod(uid="u1")], deleting_pod_uids=frozenset({"u1"})), NOW)
    assert plan.teardown == ()


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [(None, SB), ({ANNOTATION_POD_NAME: ""}, SB), ({ANNOTATION_POD_NAME: "warm-7"}, "warm-7")],
    ids=["missing", "empty", "set"],
)
def test_resolve_pod_name(annotations: dict[str, str] | None, expected: str) -> None:
    assert sandbox_pod_name(sandbox(annotations=annotations)) == expected


def test_trace_context_annotation_stamped_only_when_missing() -> None:
    plan = decide(snap(sandbox(), trace_context='{"traceparent":"00-a-b-01"}'), NOW)
    assert _summary(plan.trace.actions) == [
        ("sandbox-meta", {ANNOTATION_TRACE_CONTEXT: '{"traceparent":"00-a-b-01"}'})
    ]
    present = sandbox(annotations={ANNOTATION_TRACE_CONTEXT: "{}"})
    assert decide(snap(present, trace_context='{"x":"y"}'), NOW).trace.actions == ()
    assert decide(snap(sandbox()), NOW).trace.actions == ()


# --------------------------------------------------------------------------- PVCs (§1.4)


@pytest.mark.parametrize(
    ("pvcs", "expected", "error"),
    [
        (
            [],
            [("create", "PersistentVolumeClaim", "data-sb"), ("create", "PersistentVolumeClaim", "logs-sb")],
            None,
        ),
        ([pvc("data-sb"), pvc("logs-sb")], [], None),
        (
            [pvc("data-sb", owner=FOREIGN)],
            [],
            'PVC "data-sb" is owned by ReplicaSet/rs (UID: uid-rs), not by sandbox "sb"',
        ),
        (
            [pvc("data-sb", owned=False, labels={LABEL_ADOPTABLE: "true"})],
            [("patch", "PersistentVolumeClaim", "data-sb"), ("create", "PersistentVolumeClaim", "logs-sb")],
            None,
        ),
        (
            [pvc("data-sb", owned=False, labels={LABEL_SANDBOX_NAME_HASH: HASH})],
            [("patch", "PersistentVolumeClaim", "data-sb"), ("create", "PersistentVolumeClaim", "logs-sb")],
            None,
        ),
        (
            [pvc("logs-sb", owned=False)],
            [("create", "PersistentVolumeClaim", "data-sb")],
            "cannot adopt unowned PVC",
        ),
    ],
    ids=[
        "create",
        "keep-owned",
        "refuse-foreign-stops-list",
        "adopt-adoptable",
        "adopt-tracking-label",
        "refuse-unauthorized",
    ],
)
def test_pvcs(pvcs: list[dict[str, Any]], expected: list[tuple[Any, ...]], error: str | None) -> None:
    plan = decide(snap(sandbox(vcts=[vct("data"), vct("logs")]), pvcs=pvcs), NOW)
    assert _summary(plan.pvcs.actions) == expected
    if error is None:
        assert plan.pvcs.error is None
    else:
        assert plan.pvcs.error is not None
        assert plan.pvcs.error.startswith(error)


def test_pvc_adoption_is_optimistic_and_keeps_other_owner_refs() -> None:
    other = ref("ConfigMap", "cm", "uid-cm", api_version="v1", controller=False)
    plan = decide(
        snap(
            sandbox(vcts=[vct("data")]), pvcs=[pvc("data-sb", owner=other, labels={LABEL_ADOPTABLE: "true"})]
        ),
        NOW,
    )
    (action,) = plan.pvcs.actions
    assert isinstance(action, PatchObject)
    assert action.patch["metadata"]["resourceVersion"] == "3"
    assert [r["uid"] for r in action.patch["metadata"]["ownerReferences"]] == ["uid-cm", SB_UID]


# --------------------------------------------------------------------------- Pod (§1.5-§1.7)


def test_minimal_spec_creates_pod_then_records_its_name() -> None:
    plan = decide(snap(sandbox()), NOW)
    assert plan.mode is PlanMode.RECONCILE
    assert _pod_actions(plan) == [("create", "Pod", SB), SET_NAME]
    assert plan.pod.owned
    assert plan.service is not None
    assert plan.service.actions == ()


POOL = ref("SandboxWarmPool", "pool", "uid-pool", api_version="extensions.agents.x-k8s.io/v1beta1")
CLAIM = ref("SandboxClaim", "claim", "uid-claim", api_version="extensions.agents.x-k8s.io/v1beta1")


UPDATE_ENTRY = {"manager": "kubectl-create", "operation": "Update"}
APPLY_ENTRY = {"manager": "argocd-controller", "operation": "Apply"}


@pytest.mark.parametrize(
    ("owner", "pods", "entries", "dropped"),
    [
        (POOL, [], None, True),
        (CLAIM, [], None, True),
        (POOL, [pod()], None, True),  # the annotation written late (a Pod already there)
        (None, [], [UPDATE_ENTRY], True),  # a user's Sandbox, created with a POST
        (None, [], None, True),  # ... as the Sandbox cache shows it (entries of plain updates dropped)
        (FOREIGN, [], [UPDATE_ENTRY], True),
        (None, [], [UPDATE_ENTRY, APPLY_ENTRY], False),  # someone server-side applied it: apply reads them
        (POOL, [], [APPLY_ENTRY], False),
    ],
    ids=["pool-member", "claim-cold", "pool-member-late", "user-posted", "user-cached", "foreign-controller",
         "user-applied", "pool-member-applied"],
)  # fmt: skip
def test_the_pod_name_patch_drops_managed_fields_unless_the_sandbox_was_applied(
    owner: dict[str, Any] | None, pods: list[Any], entries: list[dict[str, str]] | None, dropped: bool
) -> None:
    sb = sandbox(owner=owner)
    if entries is not None:
        sb["metadata"]["managedFields"] = entries
    plan = decide(snap(sb, pods=pods), NOW)
    (patch,) = [a.patch for a in plan.pod.actions if isinstance(a, PatchSandboxMetadata)]
    assert patch["metadata"]["annotations"] == {ANNOTATION_POD_NAME: SB}
    assert ("managedFields" in patch["metadata"]) is dropped
    if dropped:
        assert patch["metadata"]["managedFields"] == [{}]  # kube-apiserver's "reset" form; [] changes nothing


def test_existing_owned_pod_in_sync_needs_no_write() -> None:
    sb = sandbox(annotations={ANNOTATION_POD_NAME: SB})
    assert _pod_actions(decide(snap(sb, pods=[pod()]), NOW)) == []
    # The annotation missing on an otherwise healthy Sandbox is (re)written.
    assert _pod_actions(decide(snap(sandbox(), pods=[pod()]), NOW)) == [SET_NAME]


def test_existing_pod_drift_is_repaired_with_a_metadata_merge_patch() -> None:
    sb = sandbox(annotations={ANNOTATION_POD_NAME: SB}, template_labels={"app": "x"})
    plan = decide(snap(sb, pods=[pod()]), NOW)
    (action,) = plan.pod.actions
    assert isinstance(action, PatchObject)
    assert action.patch == {
        "metadata": {"labels": {"app": "x"}, "annotations": {"agents.x-k8s.io/propagated-labels": "app"}}
    }


@pytest.mark.parametrize(
    "labels",
    [
        {LABEL_ADOPTABLE: "true"},
        {LABEL_SANDBOX_NAME_HASH: HASH},
        {LABEL_ADOPTABLE: "true", LABEL_SANDBOX_NAME_HASH: HASH},
    ],
    ids=["adoptable", "legacy-tracking-label", "labels-already-right"],
)
def test_unowned_authorised_pod_is_adopted(labels: dict[str, str]) -> None:
    plan = decide(snap(sandbox(), pods=[pod(owned=False, labels=labels)]), NOW)
    assert _pod_actions(plan) == [("patch", "Pod", SB), SET_NAME]
    patch = plan.pod.actions[0].patch  # type: ignore[union-attr]
    assert patch["metadata"]["ownerReferences"][0]["uid"] == SB_UID
    assert patch["metadata"]["resourceVersion"] == "5"
    assert plan.pod.owned


def test_unowned_unauthorised_pod_is_refused() -> None:
    plan = decide(snap(sandbox(), pods=[pod(owned=False, labels={})]), NOW)
    assert _pod_actions(plan) == []
    assert plan.pod.pod is None
    assert plan.pod.error is not None
    assert plan.pod.error.startswith('cannot adopt unowned pod "sb"')


@pytest.mark.parametrize("owner", [FOREIGN, OLD_INCARNATION], ids=["other-controller", "earlier-incarnation"])
def test_foreign_pod_is_refused_and_annotation_cleared(owner: dict[str, Any]) -> None:
    sb = sandbox(annotations={ANNOTATION_POD_NAME: SB})
    plan = decide(snap(sb, pods=[pod(owner=owner)]), NOW)
    assert _pod_actions(plan) == [CLEAR_NAME]
    assert plan.pod.pod is None
    assert plan.pod.error is not None
    assert "is owned by" in plan.pod.error
    # Only a deleted namesake's Pod is a wait (it goes away by itself); another controller's is a fault.
    assert plan.pod.waiting is (owner is OLD_INCARNATION)


@pytest.mark.parametrize(
    ("owner", "waiting"),
    [
        (OLD_INCARNATION, True),
        (FOREIGN, False),
        (ref(name="other-sb", uid="uid-other"), False),  # another Sandbox's child under our name
        (ref(uid="uid-sb-previous", api_version="example.com/v1"), False),  # a Sandbox kind of another group
    ],
    ids=["namesake", "other-controller", "other-sandbox", "other-group"],
)
def test_children_of_a_deleted_namesake_are_waits(owner: dict[str, Any], waiting: bool) -> None:
    sb = sandbox(vcts=[vct("data")], service=True)
    plan = decide(snap(sb, pods=[pod(owner=owner)], svc=service(owner=owner), pvcs=[pvc(owner=owner)]), NOW)
    assert plan.pvcs.error is not None
    assert plan.pod.error is not None
    assert (plan.pvcs.waiting, plan.pod.waiting) == (waiting, waiting)
    assert plan.service is not None
    assert plan.service.error is not None
    assert plan.service.waiting is waiting


def test_missing_tracked_pod_with_owned_survivor_repairs_annotation_instead_of_creating() -> None:
    sb = sandbox(annotations={ANNOTATION_POD_NAME: "gone"})
    plan = decide(snap(sb, pods=[pod("survivor")]), NOW)
    assert _pod_actions(plan) == [CLEAR_NAME, ("sandbox-meta", {ANNOTATION_POD_NAME: "survivor"})]
    assert plan.pod.pod is not None
    assert plan.pod.pod["metadata"]["name"] == "survivor"


def test_owned_pod_wins_over_stale_adoption_target() -> None:
    sb = sandbox(annotations={ANNOTATION_POD_NAME: "adoptable"})
    target = pod("adoptable", owned=False, labels={LABEL_ADOPTABLE: "true"})
    plan = decide(snap(sb, pods=[pod("owned"), target]), NOW)
    assert _pod_actions(plan) == [
        CLEAR_NAME,
        ("sandbox-meta", {ANNOTATION_POD_NAME: "owned"}),
    ]  # no adoption patch


def test_multiple_owned_pods_fail_closed_with_one_event_per_episode() -> None:
    plan = decide(snap(sandbox(), pods=[pod("a"), pod("b")], svc=service()), NOW)
    assert plan.pod.multiple
    assert (
        plan.pod.error
        == "multiple Pods (2) are controlled by this Sandbox; refusing to choose or create a Pod"
    )
    assert _pod_actions(plan) == []
    assert plan.service is None  # Service untouched while the mapping is ambiguous
    assert _summary(plan.events) == [("event", "Warning", "MultiplePods")]
    status = {"conditions": [{"type": "Ready", "status": "False", "reason": "MultiplePods", "message": "x"}]}
    again = decide(snap(sandbox(status=status), pods=[pod("a"), pod("b")]), NOW)
    assert again.events == ()


def test_tracked_owned_pod_missing_from_index_is_counted() -> None:
    # Tracked Pod lacks the tracking label (index lag) and another owned Pod is indexed: two owned Pods.
    sb = sandbox(annotations={ANNOTATION_POD_NAME: "t"})
    plan = decide(snap(sb, pods=[pod("t", labels={}), pod("other")]), NOW)
    assert plan.pod.multiple


def test_terminating_owned_pod_blocks_creation() -> None:
    plan = decide(snap(sandbox(annotations={ANNOTATION_POD_NAME: SB}), pods=[pod(deleting=True)]), NOW)
    assert not any(a[0] == "create" for a in _pod_actions(plan))
    assert plan.pod.pod is not None


@pytest.mark.parametrize(
    ("pods", "annotations", "expected", "owned", "present"),
    [
        ([pod()], {ANNOTATION_POD_NAME: SB}, [("delete", "Pod", SB)], True, True),
        ([pod(deleting=True)], {ANNOTATION_POD_NAME: SB}, [], True, True),
        ([], {ANNOTATION_POD_NAME: SB}, [CLEAR_NAME], False, False),
        ([], None, [], False, False),
        (
            [pod(owned=False, labels={LABEL_ADOPTABLE: "true"})],
            {ANNOTATION_POD_NAME: SB},
            [CLEAR_NAME],
            False,
            True,
        ),
        ([pod(owner=FOREIGN)], None, [], False, True),
        ([pod("warm-1")], {ANNOTATION_POD_NAME: "warm-1"}, [("delete", "Pod", "warm-1")], True, True),
    ],
    ids=[
        "delete-owned",
        "already-deleting",
        "no-pod-clears-annotation",
        "no-pod-noop",
        "unowned-kept",
        "foreign-kept",
        "annotation-tracked",
    ],
)
def test_suspended(
    pods: list[dict[str, Any]],
    annotations: dict[str, str] | None,
    expected: list[tuple[Any, ...]],
    owned: bool,
    present: bool,
) -> None:
    plan = decide(snap(sandbox(mode="Suspended", annotations=annotations), pods=pods), NOW)
    assert _pod_actions(plan) == expected
    assert plan.pod.owned is owned
    assert (plan.pod.pod is not None) is present
    # A failed delete keeps reporting the (terminating) Pod.
    assert all(a.keeps_pod for a in plan.pod.actions if isinstance(a, DeleteObject))


def test_suspended_pending_delete_is_not_repeated() -> None:
    plan = decide(
        snap(sandbox(mode="Suspended"), pods=[pod(uid="u1")], deleting_pod_uids=frozenset({"u1"})), NOW
    )
    assert _pod_actions(plan) == []


def test_suspend_keeps_pvcs_and_service() -> None:
    sb = sandbox(mode="Suspended", vcts=[vct("data")], service=True)
    plan = decide(snap(sb, pods=[pod()], pvcs=[pvc("data-sb")], svc=service()), NOW)
    assert plan.pvcs.actions == ()
    assert plan.service is not None
    assert plan.service.actions == ()
    assert plan.service.fields is ServiceFields.SET


# --------------------------------------------------------------------------- Service (§1.8)


PORTS = [{"name": "c", "image": "i", "ports": [{"containerPort": 8080}]}]
DESIRED_PORTS = [{"name": "p-8080-tcp", "protocol": "TCP", "port": 8080, "targetPort": 8080}]


@pytest.mark.parametrize(
    ("desired", "svc", "expected", "fields", "error"),
    [
        (True, None, [("create", "Service", SB)], ServiceFields.SET, None),
        (None, None, [], ServiceFields.CLEAR, None),
        (False, None, [], ServiceFields.CLEAR, None),
        (False, service(ports=DESIRED_PORTS), [("delete", "Service", SB)], ServiceFields.CLEAR, None),
        (False, service(owned=False), [], ServiceFields.CLEAR, None),
        (False, service(owner=FOREIGN), [], ServiceFields.CLEAR, None),
        (True, service(owner=FOREIGN), [], ServiceFields.KEEP, 'service "sb" is owned by ReplicaSet/rs'),
        (None, service(owner=FOREIGN), [], ServiceFields.KEEP, 'service "sb" is owned by'),
        (None, service(owned=False), [], ServiceFields.CLEAR, None),
        (True, service(owned=False, labels={}), [], ServiceFields.KEEP, 'cannot adopt unowned service "sb"'),
        (
            True,
            service(owned=False, labels={LABEL_ADOPTABLE: "true"}, cluster_ip="10.96.0.7"),
            [],
            ServiceFields.KEEP,
            'cannot adopt service "sb": ClusterIP is "10.96.0.7"',
        ),
        (
            True,
            service(owned=False, labels={LABEL_ADOPTABLE: "true"}, cluster_ip=""),
            [("patch", "Service", SB)],
            ServiceFields.SET,
            None,
        ),
        (
            True,
            service(owned=False, labels={LABEL_SANDBOX_NAME_HASH: HASH}),
            [("patch", "Service", SB)],
            ServiceFields.SET,
            None,
        ),
        (True, service(ports=DESIRED_PORTS), [], ServiceFields.SET, None),
        (None, service(ports=[{"name": "x", "port": 1, "targetPort": 1}]), [], ServiceFields.SET, None),
        (
            True,
            service(ports=[{"name": "x", "port": 1, "targetPort": 1}]),
            [("patch", "Service", SB)],
            ServiceFields.SET,
            None,
        ),
        (None, service(selector={"app": "hijack"}), [("patch", "Service", SB)], ServiceFields.SET, None),
        (None, service(labels={}), [("patch", "Service", SB)], ServiceFields.SET, None),
    ],
    ids=[
        "true-missing-create",
        "unset-missing",
        "false-missing",
        "false-owned-delete",
        "false-unowned-ignored",
        "false-foreign-ignored",
        "true-foreign-refused",
        "unset-foreign-refused",
        "unset-unowned-not-adopted",
        "true-unowned-unauthorised",
        "true-unowned-not-headless",
        "true-unowned-adopt-adoptable",
        "true-unowned-adopt-legacy-label",
        "true-owned-in-sync",
        "unset-owned-ports-not-managed",
        "true-owned-ports-drift",
        "owned-selector-drift",
        "owned-label-drift",
    ],
)
def test_service(
    desired: bool | None,
    svc: dict[str, Any] | None,
    expected: list[tuple[Any, ...]],
    fields: ServiceFields,
    error: str | None,
) -> None:
    plan = decide(snap(sandbox(service=desired, containers=PORTS), pods=[pod()], svc=svc), NOW)
    assert plan.service is not None
    assert _summary(plan.service.actions) == expected
    assert plan.service.fields is fields
    if error is None:
        assert plan.service.error is None
    else:
        assert plan.service.error is not None
        assert plan.service.error.startswith(error)


def test_service_drift_patch_replaces_selector_and_ports_exactly() -> None:
    svc = service(
        selector={LABEL_SANDBOX_NAME_HASH: HASH, "app": "hijack"},
        ports=[{"name": "x", "port": 1, "targetPort": 1}],
    )
    plan = decide(snap(sandbox(service=True, containers=PORTS), pods=[pod()], svc=svc), NOW)
    assert plan.service is not None
    (action,) = plan.service.actions
    assert isinstance(action, PatchObject)
    assert action.patch == {"spec": {"selector": {"app": None}, "ports": DESIRED_PORTS}}


def test_service_adoption_clears_ports_overwrites_selector_and_is_optimistic() -> None:
    svc = service(
        owned=False, labels={LABEL_ADOPTABLE: "true"}, selector={"app": "x"}, ports=[{"name": "x", "port": 1}]
    )
    plan = decide(snap(sandbox(service=True), pods=[pod()], svc=svc), NOW)
    assert plan.service is not None
    (action,) = plan.service.actions
    assert isinstance(action, PatchObject)
    assert action.patch["spec"] == {"selector": {"app": None, LABEL_SANDBOX_NAME_HASH: HASH}, "ports": None}
    assert action.patch["metadata"]["labels"] == {LABEL_SANDBOX_NAME_HASH: HASH}
    assert action.patch["metadata"]["resourceVersion"] == "7"
    assert action.patch["metadata"]["ownerReferences"][0]["uid"] == SB_UID


# --------------------------------------------------------------------------- write-behind (§1.12)


@pytest.mark.parametrize(
    ("window", "since", "expected"),
    [
        (0.0, None, None),
        (0.5, None, 0.5),
        (0.5, NOW - timedelta(seconds=0.2), 0.3),
        (0.5, NOW - timedelta(seconds=0.5), None),
        (0.5, NOW - timedelta(seconds=9), None),
    ],
    ids=["off", "first-observation", "remaining", "due", "overdue"],
)
def test_deferral_arithmetic(window: float, since: Any, expected: float | None) -> None:
    wait = deferral(window, since, NOW)
    assert wait == (pytest.approx(expected) if expected is not None else None)


def test_owned_pod_patch_is_deferred_and_clock_armed_once() -> None:
    sb = sandbox(annotations={ANNOTATION_POD_NAME: SB}, template_labels={"app": "x"})
    plan = decide(snap(sb, pods=[pod()], write_behind_window=0.5), NOW)
    assert _pod_actions(plan) == []
    assert plan.pod.deferred_wait == 0.5
    assert plan.defer_since == NOW
    later = decide(
        snap(sb, pods=[pod()], write_behind_window=0.5, deferral_since=NOW - timedelta(seconds=0.1)), NOW
    )
    assert later.defer_since is None  # never re-armed
    assert later.pod.deferred_wait == pytest.approx(0.4)
    due = decide(
        snap(sb, pods=[pod()], write_behind_window=0.5, deferral_since=NOW - timedelta(seconds=1)), NOW
    )
    assert _pod_actions(due) == [("patch", "Pod", SB)]


def test_adoption_is_never_deferred() -> None:
    plan = decide(
        snap(
            sandbox(annotations={ANNOTATION_POD_NAME: SB}),
            pods=[pod(owned=False, labels={LABEL_ADOPTABLE: "true"})],
            write_behind_window=1.0,
        ),
        NOW,
    )
    assert _pod_actions(plan) == [("patch", "Pod", SB)]
    assert plan.pod.deferred_wait is None


@pytest.mark.parametrize(
    "raw",
    [
        "2030-01-01T00:00:00z",
        "2030-01-01t00:00:00Z",
        "2030-01-01T00:00:00.123456789Z",
        "2030-01-01T01:00:00+01:00",
    ],
)
def test_every_shutdown_time_the_crd_admits_is_read(raw: str) -> None:
    """The CRD's date-time format admits a lowercase `z`/`t` and nine fraction digits; `fromisoformat` alone
    refused some, and the Sandbox failed every pass (no Pod, no status) while the router read the deadline."""
    from datetime import UTC, datetime

    from agent_sandbox.controllers.sandbox.decide import shutdown_time

    parsed = shutdown_time({"spec": {"shutdownTime": raw}})
    assert parsed is not None
    assert parsed.astimezone(UTC).replace(microsecond=0) == datetime(2030, 1, 1, tzinfo=UTC)
