"""`SandboxReconciler` + executor over the in-memory FakeClient: upstream's pinned reconcile behaviours (§6.1).

The FakeClient plays both the cache (reads) and the API server (writes) unless a test needs a lagging cache,
in which case a second FakeClient is the stale reader.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from agent_sandbox.api.constants import (
    ANNOTATION_POD_NAME,
    ANNOTATION_SAFE_TO_EVICT,
    ANNOTATION_TRACE_CONTEXT,
    LABEL_ADOPTABLE,
    LABEL_CLAIM_UID,
    LABEL_CREATED_BY,
    LABEL_SANDBOX_NAME_HASH,
    LABEL_SANDBOX_TEMPLATE_REF_HASH,
    LABEL_WARM_POOL_SANDBOX,
)
from agent_sandbox.controllers.claim_pressure import ClaimPressure
from agent_sandbox.controllers.indexes import INDEX_POD_NAME_HASH, pod_name_hash_index
from agent_sandbox.controllers.sandbox import (
    ChildExpectations,
    SandboxReconcileError,
    SandboxReconciler,
    SandboxWaiting,
)
from agent_sandbox.controllers.sandbox.status import BOOT_HOLD
from agent_sandbox.kube import (
    POD,
    PVC,
    SANDBOX,
    SERVICE,
    Forbidden,
    Invalid,
    NotFound,
    Object,
    Request,
    Tracing,
)
from agent_sandbox.kube.testing import FakeClient, FakeClock
from tests.unit.controllers.sandbox.builders import HASH, NOW, SB, SB_UID, pod, ref, sandbox, service, vct

pytestmark = pytest.mark.unit

REQ = Request("ns", SB)
CLAIM_OWNER = ref("SandboxClaim", "claim", "uid-claim", api_version="extensions.agents.x-k8s.io/v1beta1")


class Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def event(self, regarding: Object, type_: Any, reason: str, action: str, note: str) -> None:
        self.events.append((type_, reason, action, note))


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> Any:
        return self.now


def fake(*objects: tuple[Any, Object]) -> FakeClient:
    client = FakeClient(*objects)
    client.add_index(POD, INDEX_POD_NAME_HASH, lambda o: list(pod_name_hash_index(o)))
    return client


def reconciler(client: FakeClient, reader: FakeClient | None = None, **kwargs: Any) -> SandboxReconciler:
    kwargs.setdefault("now", Clock())
    return SandboxReconciler(reader or client, client, **kwargs)


async def get(client: FakeClient, kind: Any, name: str = SB) -> Object:
    return await client.get(kind, name, namespace="ns")


def cond(sb: Object, type_: str) -> tuple[str, str, str] | None:
    for c in (sb.get("status") or {}).get("conditions") or ():
        if c["type"] == type_:
            return (c["status"], c["reason"], c["message"])
    return None


def writes(client: FakeClient, verb: str, kind: str) -> int:
    return sum(1 for a in client.actions if a[0] == verb and a[1] == kind)


# --------------------------------------------------------------------------- TestReconcile


async def test_minimal_spec_creates_only_a_pod() -> None:
    client = fake((SANDBOX, sandbox()))
    result = await reconciler(client).reconcile(REQ)
    assert result.requeue_after is None
    assert [p["metadata"]["name"] for p in client.objects(POD)] == [SB]
    assert client.objects(SERVICE) == []
    sb = await get(client, SANDBOX)
    assert sb["metadata"]["annotations"] == {ANNOTATION_POD_NAME: SB}
    assert cond(sb, "Ready") == ("False", "DependenciesNotReady", "Pod exists with phase: ")
    assert cond(sb, "Suspended") == ("False", "NotSuspended", "Sandbox is not suspended")
    assert sb["status"]["selector"] == f"{LABEL_SANDBOX_NAME_HASH}={HASH}"


async def test_service_true_adds_headless_service_and_fqdn() -> None:
    client = fake((SANDBOX, sandbox(service=True)))
    await reconciler(client, cluster_domain="example.internal").reconcile(REQ)
    svc = await get(client, SERVICE)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {LABEL_SANDBOX_NAME_HASH: HASH}
    sb = await get(client, SANDBOX)
    assert sb["status"]["serviceFQDN"] == "sb.ns.svc.example.internal"
    assert cond(sb, "Ready") == ("False", "DependenciesNotReady", "Pod exists with phase: ; Service Exists")


async def test_volume_claim_templates_create_pvcs_and_pod_volumes() -> None:
    client = fake((SANDBOX, sandbox(vcts=[vct("data", labels={"tier": "fast"}, annotations={"a": "b"})])))
    await reconciler(client).reconcile(REQ)
    claim = await get(client, PVC, f"data-{SB}")
    assert claim["metadata"]["labels"] == {"tier": "fast", LABEL_SANDBOX_NAME_HASH: HASH}
    assert claim["metadata"]["annotations"] == {"a": "b"}
    assert claim["metadata"]["ownerReferences"][0]["uid"] == SB_UID
    p = await get(client, POD)
    assert {"name": "data", "persistentVolumeClaim": {"claimName": f"data-{SB}"}} in p["spec"]["volumes"]


@pytest.mark.parametrize(
    "labels", [{LABEL_ADOPTABLE: "true"}, {LABEL_SANDBOX_NAME_HASH: HASH}], ids=["adoptable", "legacy-label"]
)
async def test_existing_authorised_pod_is_adopted_and_reports_ips(labels: dict[str, str]) -> None:
    existing = pod(owned=False, labels=labels, phase="Running", ips=["10.1.2.3"])
    client = fake((SANDBOX, sandbox()), (POD, existing))
    await reconciler(client).reconcile(REQ)
    p = await get(client, POD)
    assert p["metadata"]["ownerReferences"][0]["uid"] == SB_UID
    assert p["metadata"]["labels"][LABEL_SANDBOX_NAME_HASH] == HASH
    assert (await get(client, SANDBOX))["status"]["podIPs"] == ["10.1.2.3"]


async def test_ready_pod_makes_sandbox_ready_without_service() -> None:
    ready = pod(phase="Running", ready=True, ips=["10.0.0.1"], node="n1")
    client = fake((SANDBOX, sandbox(annotations={ANNOTATION_POD_NAME: SB})), (POD, ready))
    await reconciler(client).reconcile(REQ)
    sb = await get(client, SANDBOX)
    assert cond(sb, "Ready") == ("True", "DependenciesReady", "Pod is Ready")
    assert sb["status"]["nodeName"] == "n1"


async def test_refused_child_is_an_error_but_status_is_written_first() -> None:
    foreign = pod(owner=ref("ReplicaSet", "rs", "uid-rs", api_version="apps/v1"))
    client = fake((SANDBOX, sandbox()), (POD, foreign))
    with pytest.raises(SandboxReconcileError, match='pod "sb" is owned by ReplicaSet/rs'):
        await reconciler(client).reconcile(REQ)
    assert cond(await get(client, SANDBOX), "Ready")[1] == "ReconcilerError"  # type: ignore[index]
    assert (await get(client, POD))["metadata"]["ownerReferences"][0]["uid"] == "uid-rs"


async def test_a_deleted_namesakes_pod_is_a_wait_with_the_same_status() -> None:
    # A reused generated name: the earlier Sandbox "sb" is gone, its Pod still terminating.
    predecessor = pod(owner=ref(uid="uid-sb-previous"), deleting=True)
    client = fake((SANDBOX, sandbox()), (POD, predecessor))
    with pytest.raises(SandboxWaiting, match='pod "sb" is owned by Sandbox/sb \\(UID: uid-sb-previous\\)'):
        await reconciler(client).reconcile(REQ)
    assert cond(await get(client, SANDBOX), "Ready")[1] == "ReconcilerError"  # type: ignore[index]
    # Once it is gone the next pass creates our own Pod, as after any foreign object.
    await client.delete(POD, SB, namespace="ns")
    await reconciler(client).reconcile(REQ)
    assert (await get(client, POD))["metadata"]["ownerReferences"][0]["uid"] == SB_UID


async def test_another_controllers_pod_is_not_a_wait() -> None:
    foreign = pod(owner=ref("ReplicaSet", "rs", "uid-rs", api_version="apps/v1"))
    client = fake((SANDBOX, sandbox()), (POD, foreign))
    with pytest.raises(SandboxReconcileError) as raised:
        await reconciler(client).reconcile(REQ)
    assert not isinstance(raised.value, SandboxWaiting)


async def test_missing_sandbox_is_done() -> None:
    assert (await reconciler(fake()).reconcile(REQ)).requeue_after is None


async def test_a_sandbox_deleted_mid_pass_ends_the_pass_without_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The cache still shows it; the write to it (here: the pod-name annotation) answers NotFound.
    client = fake((SANDBOX, sandbox()))
    client.inject_error("patch", NotFound(404, "NotFound", f'sandboxes "{SB}" not found'), kind=SANDBOX)
    expectations = ChildExpectations()
    caplog.set_level(logging.INFO, logger="agent_sandbox.controllers.sandbox")
    result = await reconciler(client, expectations=expectations).reconcile(REQ)
    assert result.requeue_after is None
    assert writes(client, "patch", "Sandbox") == 1  # the refused one: no status write after it
    assert not expectations.pending((POD, PVC, SERVICE), "ns", SB)  # its state is forgotten
    assert any("deleted mid-pass" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)


# --------------------------------------------------------------------------- expiry


async def _expire(client: FakeClient, r: SandboxReconciler) -> None:
    first = await r.reconcile(REQ)
    assert first.requeue_after == 0.001
    assert cond(await get(client, SANDBOX), "Ready") == ("False", "SandboxExpired", "Sandbox has expired")
    second = await r.reconcile(REQ)
    assert second.requeue_after is None


async def test_expiry_retain_deletes_pod_and_service_and_keeps_the_sandbox() -> None:
    sb = sandbox(
        shutdown_time=NOW - timedelta(minutes=1), service=True, annotations={ANNOTATION_POD_NAME: SB}
    )
    client = fake(
        (SANDBOX, sb),
        (POD, pod(phase="Running", ips=["10.0.0.1"])),
        (SERVICE, service()),
        (PVC, {"metadata": {"name": "data-sb", "namespace": "ns", "ownerReferences": [ref()]}, "spec": {}}),
    )
    await _expire(client, reconciler(client))
    assert client.objects(POD) == []
    assert client.objects(SERVICE) == []
    assert len(client.objects(PVC)) == 1  # PVCs are never deleted on expiry
    final = await get(client, SANDBOX)
    assert set(final["status"]) == {"conditions"}
    assert cond(final, "Ready") == ("False", "SandboxExpired", "Sandbox has expired")


async def test_expiry_retain_deletes_adopted_warm_pod_tracked_by_annotation() -> None:
    sb = sandbox(shutdown_time=NOW, annotations={ANNOTATION_POD_NAME: "warm-1"})
    client = fake((SANDBOX, sb), (POD, pod("warm-1")))
    await _expire(client, reconciler(client))
    assert client.objects(POD) == []


async def test_expiry_delete_removes_the_sandbox() -> None:
    client = fake((SANDBOX, sandbox(shutdown_time=NOW, shutdown_policy="Delete")), (POD, pod()))
    await _expire(client, reconciler(client))
    assert client.objects(SANDBOX) == []
    assert client.objects(POD) == []


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
async def test_expiry_leaves_unowned_and_foreign_pods(policy: str) -> None:
    unowned = pod(owned=False)
    client = fake((SANDBOX, sandbox(shutdown_time=NOW, shutdown_policy=policy)), (POD, unowned))
    await _expire(client, reconciler(client))
    assert [p["metadata"]["name"] for p in client.objects(POD)] == [SB]


async def test_expiry_with_no_children() -> None:
    client = fake((SANDBOX, sandbox(shutdown_time=NOW)))
    await _expire(client, reconciler(client))


# --------------------------------------------------------------------------- suspend / resume


async def test_suspend_with_terminating_owned_pod_then_resume() -> None:
    terminating = pod(phase="Running")
    terminating["metadata"]["finalizers"] = ["test/hold"]
    client = fake(
        (SANDBOX, sandbox(mode="Suspended", annotations={ANNOTATION_POD_NAME: SB})), (POD, terminating)
    )
    expectations = ChildExpectations()
    r = reconciler(client, expectations=expectations)
    await r.reconcile(REQ)
    deleting = await get(client, POD)
    assert deleting["metadata"].get("deletionTimestamp")
    # Until the informer shows the deletion, the next pass waits instead of deleting again.
    assert (await r.reconcile(REQ)).requeue_after == expectations.ttl
    assert writes(client, "delete", "Pod") == 1
    expectations.handler(POD).on_update(terminating, deleting)
    sb = await get(client, SANDBOX)
    assert cond(sb, "Suspended") == ("False", "PodTerminating", "Pod is terminating. Sandbox is suspending")
    assert cond(sb, "Ready") == ("False", "SandboxSuspended", "Sandbox is suspending")
    await client.patch(POD, SB, {"metadata": {"finalizers": None}}, namespace="ns")
    await r.reconcile(REQ)
    sb = await get(client, SANDBOX)
    assert cond(sb, "Suspended") == ("True", "PodTerminated", "Pod has been terminated. Sandbox is suspended")
    assert ANNOTATION_POD_NAME not in (sb["metadata"].get("annotations") or {})
    await client.patch(SANDBOX, SB, {"spec": {"operatingMode": "Running"}}, namespace="ns")
    await r.reconcile(REQ)
    assert (await get(client, POD))["metadata"]["ownerReferences"][0]["uid"] == SB_UID
    assert cond(await get(client, SANDBOX), "Suspended") == (
        "False",
        "NotSuspended",
        "Sandbox is not suspended",
    )


# --------------------------------------------------------------------------- multiple owned Pods


async def test_multiple_owned_pods_surface_once_without_error() -> None:
    events = Events()
    client = fake((SANDBOX, sandbox(service=True)), (POD, pod("a", ips=["10.0.0.1"])), (POD, pod("b")))
    r = reconciler(client, events=events)
    assert (await r.reconcile(REQ)).requeue_after is None
    sb = await get(client, SANDBOX)
    assert cond(sb, "Ready") == (
        "False",
        "MultiplePods",
        "multiple Pods (2) are controlled by this Sandbox; refusing to choose or create a Pod",
    )
    assert "podIPs" not in sb["status"]
    assert client.objects(SERVICE) == []
    assert len(client.objects(POD)) == 2
    await r.reconcile(REQ)
    assert events.events == [
        (
            "Warning",
            "MultiplePods",
            "Reconciling",
            "multiple Pods (2) are controlled by this Sandbox; refusing to choose or create a Pod",
        )
    ]


# --------------------------------------------------------------------------- write-behind (writebehind_coalesce_test.go)


def _adopted_pool_setup() -> FakeClient:
    # A claim took over a pool Sandbox: its Pod still carries the pool's label and safe-to-evict marker.
    sb = sandbox(
        owner=CLAIM_OWNER,
        labels={LABEL_SANDBOX_TEMPLATE_REF_HASH: "t"},
        annotations={ANNOTATION_POD_NAME: SB},
    )
    p = pod(
        phase="Running",
        ready=True,
        ips=["10.0.0.1"],
        labels={
            LABEL_SANDBOX_NAME_HASH: HASH,
            LABEL_WARM_POOL_SANDBOX: "pool",
            LABEL_SANDBOX_TEMPLATE_REF_HASH: "t",
        },
        annotations={
            ANNOTATION_SAFE_TO_EVICT: "true",
            "agents.x-k8s.io/propagated-annotations": ANNOTATION_SAFE_TO_EVICT,
        },
    )
    return fake((SANDBOX, sb), (POD, p))


async def test_write_behind_disabled_is_synchronous() -> None:
    client = _adopted_pool_setup()
    r = reconciler(client)
    await r.reconcile(REQ)
    assert writes(client, "patch", "Pod") == 1
    p = await get(client, POD)
    assert LABEL_WARM_POOL_SANDBOX not in p["metadata"]["labels"]
    assert ANNOTATION_SAFE_TO_EVICT not in p["metadata"]["annotations"]
    await r.reconcile(REQ)
    assert writes(client, "patch", "Pod") == 1


async def test_write_behind_defers_then_writes_exactly_once() -> None:
    sync_client = _adopted_pool_setup()
    await reconciler(sync_client).reconcile(REQ)
    client = _adopted_pool_setup()
    clock = Clock()
    r = reconciler(client, write_behind_window=0.5, now=clock)
    first = await r.reconcile(REQ)
    assert writes(client, "patch", "Pod") == 0
    assert first.requeue_after is not None
    assert 0 < first.requeue_after <= 1.0
    assert cond(await get(client, SANDBOX), "Ready") == cond(await get(sync_client, SANDBOX), "Ready")
    clock.now += timedelta(seconds=0.2)
    second = await r.reconcile(REQ)
    assert writes(client, "patch", "Pod") == 0
    assert second.requeue_after == pytest.approx(0.3)  # the window is not re-armed
    clock.now += timedelta(seconds=0.4)
    third = await r.reconcile(REQ)
    assert writes(client, "patch", "Pod") == 1
    assert third.requeue_after is None
    await r.reconcile(REQ)
    assert writes(client, "patch", "Pod") == 1


async def test_write_behind_window_is_bounded_by_one_second() -> None:
    client = _adopted_pool_setup()
    result = await reconciler(client, write_behind_window=30.0).reconcile(REQ)
    assert result.requeue_after == 1.0


async def test_write_behind_crash_recovery_converges_with_one_patch() -> None:
    client = _adopted_pool_setup()
    clock = Clock()
    await reconciler(client, write_behind_window=0.5, now=clock).reconcile(REQ)
    fresh = reconciler(client, write_behind_window=0.5, now=clock)  # lost deferral clock
    clock.now += timedelta(seconds=0.1)
    assert (await fresh.reconcile(REQ)).requeue_after == pytest.approx(0.5)
    clock.now += timedelta(seconds=0.6)
    await fresh.reconcile(REQ)
    assert writes(client, "patch", "Pod") == 1


# --------------------------------------------------------------------------- lagging cache


async def test_create_answered_already_exists_handles_the_existing_pod() -> None:
    api = fake(
        (SANDBOX, sandbox()), (POD, pod(owned=False, labels={LABEL_ADOPTABLE: "true"}, phase="Running"))
    )
    stale = fake((SANDBOX, sandbox()))  # the cache has not seen the Pod yet
    await reconciler(api, reader=stale).reconcile(REQ)
    p = await get(api, POD)
    assert p["metadata"]["ownerReferences"][0]["uid"] == SB_UID
    assert cond(await get(api, SANDBOX), "Ready") == (
        "False",
        "DependenciesNotReady",
        "Pod is Running but not Ready",
    )


async def test_own_create_not_yet_in_cache_is_waited_for_not_repeated() -> None:
    api = fake((SANDBOX, sandbox(vcts=[vct("data")])))
    stale = fake((SANDBOX, sandbox(vcts=[vct("data")])))
    expectations = ChildExpectations()
    r = reconciler(api, reader=stale, expectations=expectations)
    await r.reconcile(REQ)
    creates = writes(api, "create", "Pod") + writes(api, "create", "PersistentVolumeClaim")
    assert creates == 2
    waiting = await r.reconcile(REQ)
    assert waiting.requeue_after == expectations.ttl
    assert writes(api, "create", "Pod") + writes(api, "create", "PersistentVolumeClaim") == 2
    # The informer delivers the ADDED events: the records are lowered and the next pass acts normally.
    for kind in (POD, PVC):
        for obj in api.objects(kind):
            expectations.handler(kind).on_add(obj)
            await stale.create(kind, obj)
    assert not expectations.pending((POD, PVC, SERVICE), "ns", SB)
    await r.reconcile(REQ)
    assert writes(api, "create", "Pod") == 1


async def test_failed_create_is_not_waited_for() -> None:
    client = fake((SANDBOX, sandbox()))
    client.inject_error("create", NotFound(404, "NotFound", "namespace gone"), kind=POD)
    expectations = ChildExpectations()
    with pytest.raises(SandboxReconcileError, match="failed to create pod"):
        await reconciler(client, expectations=expectations).reconcile(REQ)
    assert not expectations.pending((POD,), "ns", SB)
    sb = await get(client, SANDBOX)
    assert cond(sb, "PodScheduled") == (
        "Unknown",
        "PodSchedulingUnknown",
        "Pod state is unknown. Pod scheduling cannot be determined",
    )


async def test_a_child_the_api_server_refuses_is_a_warning_event() -> None:
    """Ours: as a ReplicaSet's `FailedCreate`; upstream shows it only in the Ready condition's message."""
    client = fake((SANDBOX, sandbox()))
    refusal = 'Pod "sb" is invalid: spec.containers[0].name: Invalid value: "Bad_Name"'
    client.inject_error("create", Invalid(422, "Invalid", refusal), kind=POD)
    events = Events()
    with pytest.raises(SandboxReconcileError, match="failed to create pod"):
        await reconciler(client, events=events).reconcile(REQ)
    assert events.events == [("Warning", "FailedCreate", "Creating", f"failed to create pod: {refusal}")]


# --------------------------------------------------------------------------- tracing


class FakeTracer:
    def __init__(self) -> None:
        self.spans: list[tuple[str, dict[str, Any]]] = []

    @contextlib.contextmanager
    def start_as_current_span(self, name: str, context: Any = None, attributes: Any = None) -> Iterator[None]:
        self.spans.append((name, dict(attributes or {})))
        yield None


class FakePropagator:
    def inject(self, carrier: dict[str, str]) -> None:
        carrier["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    def extract(self, carrier: dict[str, str]) -> None:
        return None


async def test_tracing_normalizes_created_by_and_stamps_trace_context() -> None:
    tracer = FakeTracer()
    client = fake((SANDBOX, sandbox(labels={LABEL_CREATED_BY: "my-bespoke-tool"})))
    await reconciler(client, tracing=Tracing(tracer, FakePropagator())).reconcile(REQ)
    name, attributes = tracer.spans[0]
    assert name == "ReconcileSandbox"
    assert attributes == {"sandbox.name": SB, "sandbox.namespace": "ns", LABEL_CREATED_BY: "unknown"}
    assert [s[0] for s in tracer.spans[1:]] == ["reconcilePVCs", "reconcilePod"]
    annotation = (await get(client, SANDBOX))["metadata"]["annotations"][ANNOTATION_TRACE_CONTEXT]
    assert annotation.startswith('{"traceparent":"00-0af76519')


async def test_own_writes_supersede_a_stale_cache_so_status_is_not_rewritten() -> None:
    ready = pod(phase="Running", ready=True, ips=["10.0.0.1"], node="n1")
    api = fake((SANDBOX, sandbox(annotations={ANNOTATION_POD_NAME: SB})), (POD, ready))
    stale = fake((SANDBOX, sandbox(annotations={ANNOTATION_POD_NAME: SB})), (POD, ready))
    r = reconciler(api, reader=stale)
    await r.reconcile(REQ)
    assert writes(api, "patch", "Sandbox") == 1  # the status write
    # The cache has not seen our status write yet: the next pass must not send it again.
    await r.reconcile(REQ)
    assert writes(api, "patch", "Sandbox") == 1
    # Someone else writes the Sandbox (a newer version reaches the cache): the cache is trusted again.
    await stale.patch(SANDBOX, SB, {"metadata": {"labels": {"x": "y"}}}, namespace="ns")
    await r.reconcile(REQ)
    assert writes(api, "patch", "Sandbox") == 2  # status recomputed against the (status-less) cache


async def test_already_exists_replan_arms_the_write_behind_clock() -> None:
    drifted = pod(
        labels={LABEL_SANDBOX_NAME_HASH: HASH, "stale": "x"},
        annotations={"agents.x-k8s.io/propagated-labels": "stale"},
    )
    api = fake((SANDBOX, sandbox(annotations={ANNOTATION_POD_NAME: SB})), (POD, drifted))
    stale = fake((SANDBOX, sandbox(annotations={ANNOTATION_POD_NAME: SB})))
    clock = Clock()
    r = reconciler(api, reader=stale, write_behind_window=0.5, now=clock)
    first = await r.reconcile(REQ)
    assert first.requeue_after == pytest.approx(0.5)
    assert writes(api, "patch", "Pod") == 0
    clock.now += timedelta(seconds=0.6)
    await r.reconcile(REQ)  # the window was armed by the first pass: the patch is due now
    assert writes(api, "patch", "Pod") == 1
    assert "stale" not in (await get(api, POD))["metadata"]["labels"]


# --------------------------------------------------------------------------- claim pressure


async def _taken_over(client: FakeClient) -> None:
    """Settle the adopted Sandbox, then bump its generation the way a claim's takeover patch does."""
    await reconciler(client).reconcile(REQ)
    sb = await get(client, SANDBOX)
    sb["spec"]["podTemplate"].setdefault("metadata", {}).setdefault("labels", {})[LABEL_CLAIM_UID] = (
        "uid-claim"
    )
    await client.update(SANDBOX, sb)  # a spec change: the generation moves to 2
    pod_ = await get(client, POD)
    pod_["metadata"]["labels"][LABEL_WARM_POOL_SANDBOX] = "pool"
    await client.update(POD, pod_)
    client.actions.clear()


async def _hot_after_takeover() -> tuple[FakeClient, SandboxReconciler, ClaimPressure, FakeClock, Clock]:
    """A taken-over pool Sandbox, a reconciler with a 15 s claim-priority hold, and a claim just arrived."""
    client = _adopted_pool_setup()
    await _taken_over(client)
    mono = FakeClock()
    pressure = ClaimPressure(15.0, clock=mono.now)
    clock = Clock()
    r = reconciler(client, pressure=pressure, now=clock)
    pressure.note_arrival()
    return client, r, pressure, mono, clock


async def test_claim_pressure_defers_pod_patch_and_generation_echo_then_writes_once_calm() -> None:
    client, r, _, mono, clock = await _hot_after_takeover()
    first = await r.reconcile(REQ)
    assert writes(client, "patch", "Pod") == 0
    assert writes(client, "patch", "Sandbox") == 0
    assert first.requeue_after == pytest.approx(15.0)
    assert r.deferred() == [REQ]
    mono.advance(2.0)  # calm again (the pass after the calm listener re-enqueued it)
    clock.now += timedelta(seconds=2)
    second = await r.reconcile(REQ)
    assert writes(client, "patch", "Pod") == 1
    assert writes(client, "patch", "Sandbox") == 1
    ready = next(c for c in (await get(client, SANDBOX))["status"]["conditions"] if c["type"] == "Ready")
    assert ready["observedGeneration"] == 2
    assert second.requeue_after is None
    assert r.deferred() == []


async def test_claim_pressure_never_holds_a_write_past_the_hold() -> None:
    client, r, pressure, mono, clock = await _hot_after_takeover()
    await r.reconcile(REQ)
    for _ in range(16):  # claims keep arriving for 16 s
        mono.advance(1.0)
        clock.now += timedelta(seconds=1)
        pressure.note_arrival()
        await r.reconcile(REQ)
    assert writes(client, "patch", "Pod") == 1
    assert writes(client, "patch", "Sandbox") == 1


async def test_claim_pressure_never_defers_a_real_status_change() -> None:
    client = _adopted_pool_setup()
    await _taken_over(client)
    pod_ = await get(client, POD)
    pod_["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    await client.update(POD, pod_, subresource="status")
    client.actions.clear()
    pressure = ClaimPressure(15.0, clock=FakeClock().now)
    pressure.note_arrival()
    await reconciler(client, pressure=pressure).reconcile(REQ)
    assert writes(client, "patch", "Pod") == 0  # metadata only: still deferred
    assert writes(client, "patch", "Sandbox") == 1
    assert cond(await get(client, SANDBOX), "Ready")[0] == "False"  # type: ignore[index]


POOL_OWNER = ref("SandboxWarmPool", "pool", "uid-pool", api_version="extensions.agents.x-k8s.io/v1beta1")


async def _booting_member(
    owner: dict[str, Any] | None = POOL_OWNER, *, hold: float = 15.0
) -> tuple[FakeClient, SandboxReconciler, Clock]:
    """A Sandbox whose Pod is Pending; the reconciler has a claim-priority hold but no claims arrive."""
    client = fake(
        (SANDBOX, sandbox(owner=owner, annotations={ANNOTATION_POD_NAME: SB})), (POD, pod(phase="Pending"))
    )
    clock = Clock()
    pressure = ClaimPressure(hold, clock=FakeClock().now)
    return client, reconciler(client, now=clock, pressure=pressure), clock


async def _pod_becomes(client: FakeClient, *, ready: bool, ip: str | None) -> None:
    booted = await get(client, POD)
    booted["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}
    if ip:
        booted["status"] |= {"podIPs": [{"ip": ip}], "podIP": ip}
    await client.update(POD, booted, subresource="status")
    client.actions.clear()


async def test_a_booting_pool_members_status_rides_along_with_its_ready_write() -> None:
    client, r, _ = await _booting_member()
    held = await r.reconcile(REQ)
    assert writes(client, "patch", "Sandbox") == 0  # Pending, nobody reads it: waits for Ready
    assert held.requeue_after == pytest.approx(BOOT_HOLD)
    # Not behind claims: not counted as held by claim priority, not re-enqueued when claims stop.
    assert r.held_writes() == {"sandbox": 0}
    assert r.deferred() == []
    await _pod_becomes(client, ready=True, ip="10.0.0.1")
    await r.reconcile(REQ)
    assert writes(client, "patch", "Sandbox") == 1  # Ready is never held: claims take Ready members
    status = (await get(client, SANDBOX))["status"]
    assert cond(await get(client, SANDBOX), "Ready")[0] == "True"  # type: ignore[index]
    assert status["podIPs"] == ["10.0.0.1"]
    assert status["selector"]
    assert r.deferred() == []


async def _ready_member() -> tuple[FakeClient, SandboxReconciler, Clock]:
    """A pool member whose Pod booted and whose Ready=True status with the Pod's address is written."""
    client, r, clock = await _booting_member()
    await r.reconcile(REQ)
    await _pod_becomes(client, ready=True, ip="10.0.0.1")
    await r.reconcile(REQ)
    assert cond(await get(client, SANDBOX), "Ready")[0] == "True"  # type: ignore[index]
    client.actions.clear()
    return client, r, clock


async def test_a_ready_members_lost_pod_is_written_at_once_not_held_as_booting() -> None:
    # Probe: the member's Pod was deleted and could not be recreated (a zero-pod quota); the Ready=False
    # write was held for BOOT_HOLD, so the Sandbox kept Ready=True and the dead Pod's IPs for ~5 s and a
    # claim adopted the Pod-less member in that window (§4.5.2 takes Ready members).
    client, r, _ = await _ready_member()
    await client.delete(POD, SB, namespace="ns")
    client.actions.clear()
    quota = Forbidden(403, "Forbidden", 'pods "sb" is forbidden: exceeded quota: pods1')
    client.inject_error("create", quota, kind=POD)
    with pytest.raises(SandboxReconcileError, match="exceeded quota"):
        await r.reconcile(REQ)
    status = (await get(client, SANDBOX))["status"]
    assert cond(await get(client, SANDBOX), "Ready")[:2] == ("False", "ReconcilerError")  # type: ignore[index]
    assert not status.get("podIPs")
    assert r.deferred() == []


async def test_a_ready_members_pod_going_away_is_written_at_once() -> None:
    # The Pod is gone from the cache (evicted) and its recreation is still Pending: the member left Ready,
    # which claims must see at once even though the new status looks like a booting one.
    client, r, clock = await _ready_member()
    await client.delete(POD, SB, namespace="ns")
    client.actions.clear()
    result = await r.reconcile(REQ)
    status = (await get(client, SANDBOX))["status"]
    assert cond(await get(client, SANDBOX), "Ready")[0] == "False"  # type: ignore[index]
    assert not status.get("podIPs")
    assert result.requeue_after is None
    assert r.deferred() == []
    # From there the recreated Pod boots like a new member's: its next booting state is held again (a
    # restarted reconciler: this one still expects its create to show up in an informer).
    pending = await get(client, POD)
    pending["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    await client.update(POD, pending, subresource="status")
    restarted = reconciler(client, now=clock, pressure=ClaimPressure(15.0, clock=FakeClock().now))
    held = await restarted.reconcile(REQ)
    assert held.requeue_after == pytest.approx(BOOT_HOLD)
    assert (await get(client, SANDBOX))["status"] == status


async def test_a_booting_members_status_is_written_after_the_hold() -> None:
    client, r, clock = await _booting_member()
    await r.reconcile(REQ)
    clock.now += timedelta(seconds=BOOT_HOLD / 2)
    again = await r.reconcile(REQ)
    assert writes(client, "patch", "Sandbox") == 0
    assert again.requeue_after == pytest.approx(BOOT_HOLD / 2)  # the clock never re-arms
    clock.now += timedelta(seconds=BOOT_HOLD / 2)
    await r.reconcile(REQ)
    assert writes(client, "patch", "Sandbox") == 1
    assert cond(await get(client, SANDBOX), "Ready")[0] == "False"  # type: ignore[index]


async def test_a_member_that_cannot_get_a_pod_is_never_counted_as_held_behind_claims() -> None:
    # A pass that fails keeps the write-behind clock running; once the boot hold has run out, that clock entry
    # alone was read as a write held behind claims (CI once read held{write="sandbox"} = 17 at rest).
    client = fake((SANDBOX, sandbox(owner=POOL_OWNER)))
    client.inject_error(
        "create", Forbidden(403, "Forbidden", "namespace is being terminated"), kind=POD, times=3
    )
    clock = Clock()
    r = reconciler(client, now=clock, pressure=ClaimPressure(15.0, clock=FakeClock().now))
    for _ in range(3):
        with pytest.raises(SandboxReconcileError, match="failed to create pod"):
            await r.reconcile(REQ)
        assert r.held_writes() == {"sandbox": 0}
        assert r.deferred() == []
        clock.now += timedelta(seconds=BOOT_HOLD)


async def test_a_member_with_an_address_but_not_ready_is_written_at_once() -> None:
    client, r, _ = await _booting_member()
    await _pod_becomes(client, ready=False, ip="10.0.0.1")
    await r.reconcile(REQ)
    assert writes(client, "patch", "Sandbox") == 1  # claims fall back to addressed members (§4.5.2)
    assert (await get(client, SANDBOX))["status"]["podIPs"] == ["10.0.0.1"]


async def test_a_claimed_or_plain_sandboxs_booting_status_is_written_at_once() -> None:
    for owner in (CLAIM_OWNER, None):
        client, r, _ = await _booting_member(owner)
        result = await r.reconcile(REQ)
        assert writes(client, "patch", "Sandbox") == 1, owner
        assert result.requeue_after is None, owner


async def test_no_boot_hold_without_the_claim_priority_hold() -> None:
    client, r, _ = await _booting_member(hold=0.0)  # --sandbox-claim-priority-hold=0: upstream's timing
    result = await r.reconcile(REQ)
    assert writes(client, "patch", "Sandbox") == 1
    assert result.requeue_after is None
