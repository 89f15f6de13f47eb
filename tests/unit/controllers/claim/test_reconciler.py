"""Claim reconciler passes against the in-memory API (controllers spec §4.3-§4.13, §6.4).

Each test drives the real reconciler; `World.lag()` reproduces an informer that has not seen our writes.
"""

from __future__ import annotations

import asyncio
import copy
from datetime import timedelta
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import controller_ref, new_controller_ref
from agent_sandbox.controllers.claim.reconciler import ClaimConfig
from agent_sandbox.controllers.claim.result import ClaimRetry
from agent_sandbox.controllers.claim_pressure import ClaimPressure
from agent_sandbox.kube import (
    NETWORK_POLICY,
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    Forbidden,
    PatchType,
    Request,
    ServerError,
    Timeout,
)
from tests.unit.controllers.claim.builders import (
    NS,
    T0,
    World,
    claim,
    claim_ready,
    fail_metadata_once,
    member,
    pool,
    ready_cond,
    sample,
    standard,
    template,
    ts,
)

pytestmark = pytest.mark.unit

CTRL_COUNT = "agent_sandbox_claim_controller_startup_latency_ms_count"
CREATED = "agent_sandbox_claim_creation_total"


def owners(world: World) -> dict[str, str]:
    """Sandbox name -> name of its controlling claim (only claim-owned Sandboxes)."""
    out = {}
    for sb in world.fake.objects(SANDBOX):
        ref = controller_ref(sb["metadata"])
        if ref and ref["kind"] == c.KIND_SANDBOX_CLAIM:
            out[sb["metadata"]["name"]] = ref["name"]
    return out


# --------------------------------------------------------------------------- warm path


async def test_warm_adoption_writes_four_times_and_is_ready_in_one_pass() -> None:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    world.observed.record(NS, "c1", "c1-uid", T0)
    before = sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl")
    adopted = sample(CREATED, namespace=NS, sandbox_template="tmpl", launch_type="warm", warmpool_name="pool",
                     pod_condition="ready", created_by="unknown")  # fmt: skip
    assert (await world.reconcile()).requeue_after is None
    writes = world.writes()
    assert sorted(writes[:2]) == [
        ("patch", "Sandbox", "pool-a"),  # the takeover (guarded JSON patch) ...
        ("patch", "SandboxClaim", "c1"),  # ... alongside the intent: assignment, first-observed
    ]
    assert writes[2:] == [
        ("patch", "SandboxClaim", "c1"),  # status: bound + Ready
        ("patch", "SandboxClaim", "c1"),  # first-ready stamp
    ]
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert cl["status"]["sandbox"] == {"name": "pool-a", "podIPs": ["10.0.0.1"]}
    assert claim_ready(cl)["status"] == "True"  # type: ignore[index]
    ann = cl["metadata"]["annotations"]
    assert ann[c.ANNOTATION_SANDBOX_NAME] == "pool-a"
    assert ann[c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT] == "2026-01-01T12:00:00Z"
    assert ann[c.ANNOTATION_CLAIM_FIRST_READY_AT] == "2026-01-01T12:00:00.3Z"
    assert owners(world) == {"pool-a": "c1"}
    assert world.events.events == [("c1", "SandboxAdopted", "Adoption", 'Adopted warm pool Sandbox "pool-a"')]
    assert sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl") == before + 1
    assert sample(CREATED, namespace=NS, sandbox_template="tmpl", launch_type="warm", warmpool_name="pool",
                  pod_condition="ready", created_by="unknown") == adopted + 1  # fmt: skip
    world.clear_actions()
    await world.reconcile()  # settled: the next pass writes nothing
    assert world.writes() == []


async def test_status_is_written_only_once_the_claim_carries_its_intent() -> None:
    """Issue 11 part 1: a CRD's /status write ignores metadata, so the intent must already be stored."""
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    world.reconciler.pressure = ClaimPressure(30.0, calm_after=5.0)
    world.reconciler.pressure.note_arrival()  # hot: the first-ready stamp is held, the intent is not
    world.reconciler.detach_metadata_writes(lambda _request: None)
    stored_at_status_write: list[dict[str, Any]] = []
    real = world.fake.patch_status

    async def spy(kind: Any, name: str, patch: Any, **kw: Any) -> Any:
        if kind is SANDBOX_CLAIM:
            live = next(o for o in world.fake.objects(SANDBOX_CLAIM) if o["metadata"]["name"] == name)
            stored_at_status_write.append(copy.deepcopy(live["metadata"].get("annotations") or {}))
        return await real(kind, name, patch, **kw)

    world.fake.patch_status = spy  # type: ignore[method-assign]
    await world.reconcile()
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["status"] == "True"  # type: ignore[index]
    assert len(stored_at_status_write) == 1
    ann = stored_at_status_write[0]
    assert ann[c.ANNOTATION_SANDBOX_NAME] == "pool-a"
    assert c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT in ann
    assert c.ANNOTATION_CLAIM_FIRST_READY_AT not in world.get(SANDBOX_CLAIM, "c1")["metadata"]["annotations"]
    for task in list(world.reconciler._stamping.values()):
        task.cancel()


async def test_a_failed_intent_fails_the_pass_and_the_retry_writes_it_before_the_status() -> None:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    world.fake.inject_error("patch", ServerError(500, "InternalError", "nope"), kind=SANDBOX_CLAIM)
    with pytest.raises(ServerError):
        await world.reconcile()
    assert owners(world) == {"pool-a": "c1"}  # the takeover went through alongside
    assert "status" not in world.get(SANDBOX_CLAIM, "c1")  # but no status without the intent
    world.clear_actions()
    await world.reconcile()
    assert world.writes()[:2] == [("patch", "SandboxClaim", "c1"), ("patch", "SandboxClaim", "c1")]
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert cl["status"]["sandbox"]["name"] == "pool-a"
    assert cl["metadata"]["annotations"][c.ANNOTATION_SANDBOX_NAME] == "pool-a"


async def test_json_patch_is_the_only_sandbox_write() -> None:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    calls: list[PatchType] = []
    real_patch = world.fake.patch

    async def spy(kind: Any, name: str, patch: Any, **kw: Any) -> Any:
        if kind is SANDBOX:
            calls.append(kw.get("patch_type", PatchType.MERGE))
        return await real_patch(kind, name, patch, **kw)

    world.fake.patch = spy  # type: ignore[method-assign]
    await world.reconcile()
    assert calls == [PatchType.JSON]


async def test_cache_lag_never_adopts_twice_and_writes_nothing_more() -> None:
    world = World(*standard(member("pool-a"), member("pool-b")), (SANDBOX_CLAIM, claim()))
    with world.lag():  # the informer sees none of our writes during both passes
        await world.reconcile()
        world.clear_actions()
        await world.reconcile()
        assert world.writes() == []
    assert owners(world) == {"pool-a": "c1"}
    assert world.queue.names("ns/pool") == ["pool-b"]


async def test_crash_after_takeover_recovers_binding_from_ownership() -> None:
    """The process died between the takeover and the status write: a new process binds the same Sandbox."""
    world = World(*standard(member("pool-a"), member("pool-b")), (SANDBOX_CLAIM, claim()))
    world.fake.inject_error("patch", ServerError(500, "InternalError", "boom"), kind=SANDBOX_CLAIM)
    with pytest.raises(ServerError):
        await world.reconcile()
    assert owners(world) == {"pool-a": "c1"}
    restarted = World()
    restarted.fake = world.fake
    restarted.store.fake = world.fake
    restarted.reconciler.store = restarted.store
    restarted.reconciler.api = restarted.reconciler.authoritative = world.fake  # type: ignore[assignment]
    restarted.feed()
    await restarted.reconcile()
    cl = restarted.get(SANDBOX_CLAIM, "c1")
    assert cl["status"]["sandbox"]["name"] == "pool-a"
    assert owners(restarted) == {"pool-a": "c1"}
    assert restarted.queue.names("ns/pool") == ["pool-b"]


async def test_two_warm_three_claims_each_owns_exactly_one() -> None:
    world = World(
        *standard(member("pool-a"), member("pool-b")),
        *[(SANDBOX_CLAIM, claim(f"c{i}")) for i in (1, 2, 3)],
    )
    await asyncio.gather(*(world.reconcile(f"c{i}") for i in (1, 2, 3)))
    got = owners(world)
    assert sorted(got.values()) == ["c1", "c2", "c3"]
    launch = {
        sb["metadata"]["name"]: sb["metadata"]["labels"][c.LABEL_LAUNCH_TYPE]
        for sb in world.fake.objects(SANDBOX)
    }
    assert sorted(launch.values()) == ["cold", "warm", "warm"]
    for i in (1, 2, 3):
        assert world.get(SANDBOX_CLAIM, f"c{i}")["status"]["sandbox"]["name"] in got


async def test_adopts_oldest_ready_and_prefers_ready_over_older_unready() -> None:
    world = World(
        *standard(member("unready", ready=False), member("ready-1"), member("ready-2")),
        (SANDBOX_CLAIM, claim()),
    )
    await world.reconcile()
    assert owners(world) == {"ready-1": "c1"}


async def test_adopts_networked_unready_member_when_nothing_is_ready() -> None:
    world = World(*standard(member("noip", ips=()), member("unready", ready=False)), (SANDBOX_CLAIM, claim()))
    await world.reconcile()
    assert owners(world) == {"unready": "c1"}
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["status"] == "False"  # type: ignore[index]
    assert world.queue.names("ns/pool") == ["noip"]  # un-networked candidates stay queued


async def test_ineligible_members_fall_back_to_cold() -> None:
    deleting = member("deleting")
    deleting["metadata"]["finalizers"] = ["x/y"]
    lookalike = member("lookalike", controller=False)
    foreign = member("foreign", owner_kind=c.KIND_SANDBOX_CLAIM)
    world = World(*standard(deleting, lookalike, foreign), (SANDBOX_CLAIM, claim()))
    await world.fake.delete(SANDBOX, "deleting", namespace=NS)  # sets deletionTimestamp (finalizer)
    world.feed()
    await world.reconcile()
    assert owners(world) == {"c1": "c1", "foreign": "pool"}  # "foreign" is another claim's, untouched
    assert world.get(SANDBOX, "c1")["metadata"]["labels"][c.LABEL_LAUNCH_TYPE] == "cold"


# --------------------------------------------------------------------------- contested takeovers


async def test_lost_candidate_moves_on_to_the_next_one() -> None:
    world = World(
        *standard(member("pool-a"), member("pool-b")), (SANDBOX_CLAIM, claim()), (SANDBOX_CLAIM, claim("c2"))
    )
    with world.lag():  # c2 takes pool-a behind our cache's back (as another process would)
        sb = world.fake.objects(SANDBOX)[0]
        stolen = copy.deepcopy(sb["metadata"]["ownerReferences"])
        stolen[0].update(kind=c.KIND_SANDBOX_CLAIM, name="c2", uid="c2-uid")
        await world.fake.patch(SANDBOX, "pool-a", {"metadata": {"ownerReferences": stolen}}, namespace=NS)
        await world.reconcile()
    assert owners(world) == {"pool-a": "c2", "pool-b": "c1"}
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert cl["status"]["sandbox"]["name"] == "pool-b"
    assert cl["metadata"]["annotations"][c.ANNOTATION_SANDBOX_NAME] == "pool-b"  # re-recorded
    assert world.queue.names("ns/pool") == []


async def test_stale_view_of_a_still_free_member_is_retried_on_the_fresh_object() -> None:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    with (
        world.lag()
    ):  # the pool rewrote its owner reference (old apiVersion): the guard fails, it is still free
        refs = copy.deepcopy(world.fake.objects(SANDBOX)[0]["metadata"]["ownerReferences"])
        refs[0]["apiVersion"] = "extensions.agents.x-k8s.io/v1alpha1"
        await world.fake.patch(SANDBOX, "pool-a", {"metadata": {"ownerReferences": refs}}, namespace=NS)
        world.clear_actions()
        await world.reconcile()
    assert owners(world) == {"pool-a": "c1"}
    assert [w for w in world.writes() if w[1] == "Sandbox"] == [("patch", "Sandbox", "pool-a")] * 2


async def test_guard_failure_on_our_own_applied_takeover_is_success_without_a_write() -> None:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    with world.lag():
        from agent_sandbox.controllers.claim.adoption import adoption_patch

        sb = world.fake.objects(SANDBOX)[0]
        await world.fake.patch(
            SANDBOX,
            "pool-a",
            adoption_patch(claim(), sb, template()),
            namespace=NS,
            patch_type=PatchType.JSON,
        )
        world.clear_actions()
        await world.reconcile()
    assert [w for w in world.writes() if w[1] == "Sandbox"] == [
        ("patch", "Sandbox", "pool-a")
    ]  # the failed one
    assert world.get(SANDBOX_CLAIM, "c1")["status"]["sandbox"]["name"] == "pool-a"


async def test_unanswered_takeover_is_settled_by_reading_before_anything_else() -> None:
    world = World(*standard(member("pool-a"), member("pool-b")), (SANDBOX_CLAIM, claim()))
    world.fake.inject_error("patch", Timeout("patch timed out"), kind=SANDBOX)
    with pytest.raises(Timeout):
        await world.reconcile()
    assert world.queue.names("ns/pool") == ["pool-b"]  # pool-a is neither offered to others nor lost
    world.clear_actions()
    await world.reconcile()  # it had not applied: pool-a goes back to the queue, the claim takes one member
    assert world.fake.actions[0][:2] == ("get", "Sandbox")  # the authoritative read came first
    assert owners(world) == {"pool-b": "c1"}
    assert world.queue.names("ns/pool") == ["pool-a"]


async def test_a_claim_deleted_during_its_warm_takeover_ends_the_pass_quietly() -> None:
    """Probe fleet11: a mass or namespace delete during a burst. The takeover went through, the claim's
    intent patch answers NotFound: the pass ends with no error (the runtime would log it at error level,
    count it and retry with backoff), no requeue, no further write. The member stays owned by the dead
    claim's UID, which garbage collection deletes (claim-quirks.md #23)."""
    world = World(*standard(member("pool-a"), member("pool-b")), (SANDBOX_CLAIM, claim()))
    with world.lag():  # the informer has not delivered the deletion yet
        await world.fake.delete(SANDBOX_CLAIM, "c1", namespace=NS)
        world.clear_actions()
        result = await world.reconcile()
    assert result.requeue_after is None
    assert sorted(world.writes()) == [("patch", "Sandbox", "pool-a"), ("patch", "SandboxClaim", "c1")]
    assert owners(world) == {"pool-a": "c1"}
    ref = controller_ref(world.get(SANDBOX, "pool-a")["metadata"])
    assert ref is not None
    assert ref["uid"] == "c1-uid"  # GC's owner: the deleted claim
    assert world.queue.names("ns/pool") == ["pool-b"]  # the other member stays for other claims
    assert world.find(SANDBOX_CLAIM, "c1") is None


async def test_cancellation_is_never_reported_as_success() -> None:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    world.fake.inject_error("patch", asyncio.CancelledError(), kind=SANDBOX)
    with pytest.raises(asyncio.CancelledError):
        await world.reconcile()
    assert "status" not in world.get(SANDBOX_CLAIM, "c1")


# --------------------------------------------------------------------------- grace window


async def test_young_claim_waits_for_pod_ips_without_writing_then_is_woken() -> None:
    world = World(*standard(member("noip", ips=())), (SANDBOX_CLAIM, claim()))
    result = await world.reconcile()
    assert result.requeue_after == 0.5
    assert world.writes() == []
    networked = world.get(SANDBOX, "noip")
    updated = copy.deepcopy(networked)
    updated["status"]["podIPs"] = ["10.0.0.5"]
    await world.fake.patch_status(SANDBOX, "noip", {"status": {"podIPs": ["10.0.0.5"]}}, namespace=NS)
    world.feeder.on_update(networked, updated)
    assert world.woken == [Request(NS, "c1")]
    await world.reconcile()  # the woken pass adopts the member that became networked during the grace
    assert owners(world) == {"noip": "c1"}


async def test_grace_over_cold_starts() -> None:
    world = World(*standard(member("noip", ips=())), (SANDBOX_CLAIM, claim()))
    world.now = T0 + timedelta(seconds=2, milliseconds=1)
    await world.reconcile()
    assert owners(world) == {"c1": "c1"}


async def test_recreate_pool_without_template_keeps_candidates_queued() -> None:
    world = World(
        (SANDBOX_WARM_POOL, pool(strategy="Recreate")), (SANDBOX, member("pool-a")), (SANDBOX_CLAIM, claim())
    )
    result = await world.reconcile()
    assert result.requeue_after == 60.0
    assert world.queue.names("ns/pool") == ["pool-a"]
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["reason"] == "TemplateNotFound"  # type: ignore[index]


# --------------------------------------------------------------------------- cold path


async def test_a_sandbox_the_api_server_refuses_is_a_warning_event() -> None:
    """Ours: as a ReplicaSet's FailedCreate (a quota, an admission webhook); upstream says it only in Ready."""
    world = World(*standard(), (SANDBOX_CLAIM, claim()))
    world.observed.record(NS, "c1", "c1-uid", T0)
    refusal = Forbidden(403, "Forbidden", 'sandboxes.agents.x-k8s.io "c1" is forbidden: exceeded quota: q')
    world.fake.inject_error("create", refusal, kind=SANDBOX)
    with pytest.raises(ClaimRetry, match="exceeded quota"):
        await world.reconcile()
    ready = claim_ready(world.get(SANDBOX_CLAIM, "c1"))
    assert ready is not None
    assert ready["reason"] == "ReconcilerError"
    assert [(e[1], e[2]) for e in world.events.events] == [("FailedCreate", "Creating")]
    assert "exceeded quota: q" in world.events.events[0][3]


async def test_cold_start_then_ready() -> None:
    world = World(*standard(), (SANDBOX_CLAIM, claim()))  # pool of 0: nothing to adopt
    world.observed.record(NS, "c1", "c1-uid", T0)
    before = sample(CTRL_COUNT, launch_type="cold", sandbox_template="tmpl")
    await world.reconcile()
    assert world.writes() == [
        ("create", "Sandbox", "c1"),
        ("patch", "SandboxClaim", "c1"),
        ("patch", "SandboxClaim", "c1"),
    ]
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert claim_ready(cl)["reason"] == "SandboxNotReady"  # type: ignore[index]
    assert cl["status"]["sandbox"] == {"name": "c1"}
    assert list(cl["metadata"]["annotations"]) == [c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT]
    assert world.events.events == [("c1", "SandboxProvisioned", "Provisioning", 'Created Sandbox "c1"')]
    status = {"podIPs": ["10.1.1.1"], "conditions": [ready_cond(at=T0 + timedelta(seconds=3))]}
    await world.fake.patch_status(SANDBOX, "c1", {"status": status}, namespace=NS)
    world.now = T0 + timedelta(seconds=4)
    world.clear_actions()
    await world.reconcile()
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert claim_ready(cl)["status"] == "True"  # type: ignore[index]
    assert cl["status"]["sandbox"] == {"name": "c1", "podIPs": ["10.1.1.1"]}
    assert cl["metadata"]["annotations"][c.ANNOTATION_CLAIM_FIRST_READY_AT] == "2026-01-01T12:00:04Z"
    assert c.ANNOTATION_SANDBOX_NAME not in cl["metadata"]["annotations"]
    assert sample(CTRL_COUNT, launch_type="cold", sandbox_template="tmpl") == before + 1


async def test_already_exists_on_cold_create_is_pending_not_an_error() -> None:
    world = World(*standard(), (SANDBOX_CLAIM, claim()))
    with world.lag():
        await world.fake.create(
            SANDBOX, {"metadata": {"name": "c1", "namespace": NS}, "spec": {}}, namespace=NS
        )
        result = await world.reconcile()
    assert result.requeue_after == 0.2
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["reason"] == "SandboxCreatePending"  # type: ignore[index]


async def test_missing_pool_and_template_report_and_requeue_without_error() -> None:
    world = World((SANDBOX_CLAIM, claim()))
    assert (await world.reconcile()).requeue_after == 60.0
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["message"] == 'SandboxWarmPool "pool" not found'  # type: ignore[index]
    await world.fake.create(SANDBOX_WARM_POOL, pool(), namespace=NS)
    assert (await world.reconcile()).requeue_after == 60.0
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["reason"] == "TemplateNotFound"  # type: ignore[index]


async def test_an_invalid_reference_is_one_warning_event_per_episode() -> None:
    """Ours (claim-quirks.md): the Ready reason and message as a Warning, once, not on every retry pass."""
    world = World((SANDBOX_CLAIM, claim()))
    for _ in range(3):
        assert (await world.reconcile()).requeue_after == 60.0
    assert world.events.events == [("c1", "WarmPoolNotFound", "Binding", 'SandboxWarmPool "pool" not found')]
    await world.fake.create(SANDBOX_WARM_POOL, pool(), namespace=NS)
    for _ in range(3):
        await world.reconcile()
    assert world.events.events[1:] == [
        ("c1", "TemplateNotFound", "Binding", 'SandboxTemplate "tmpl" not found')
    ]
    await world.fake.delete(SANDBOX_WARM_POOL, "pool", namespace=NS)
    await world.reconcile()
    assert [e[1] for e in world.events.events] == ["WarmPoolNotFound", "TemplateNotFound", "WarmPoolNotFound"]


async def test_a_claim_repointed_back_and_forth_between_missing_pools_says_each_change_once() -> None:
    """warmPoolRef is mutable: each change of the missing reference is a new episode (the stored message
    differs), the passes in between say nothing."""
    world = World((SANDBOX_CLAIM, claim()))
    for target in ("other", "pool", "pool"):
        await world.reconcile()
        await world.reconcile()
        await world.fake.patch(SANDBOX_CLAIM, "c1", {"spec": {"warmPoolRef": {"name": target}}}, namespace=NS)
    await world.reconcile()
    await world.reconcile()
    assert [e[3] for e in world.events.events] == [
        'SandboxWarmPool "pool" not found',
        'SandboxWarmPool "other" not found',
        'SandboxWarmPool "pool" not found',
    ]


async def test_a_claim_that_already_shows_its_missing_pool_gets_no_event() -> None:
    """A controller restart: the stored condition already says it, so the first pass says nothing more."""
    world = World((SANDBOX_CLAIM, claim()))
    await world.reconcile()
    world.events.events.clear()
    again = World(*((SANDBOX_CLAIM, o) for o in world.fake.objects(SANDBOX_CLAIM)))
    await again.reconcile()
    assert again.events.events == []


async def test_name_collision_is_a_retried_reconciler_error() -> None:
    foreign = member("c1", owner_kind=c.KIND_SANDBOX_CLAIM)
    world = World(*standard(foreign), (SANDBOX_CLAIM, claim()))
    with pytest.raises(ClaimRetry):
        await world.reconcile()
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["reason"] == "ReconcilerError"  # type: ignore[index]


async def test_spec_errors_are_reported_without_retry() -> None:
    world = World(*standard(), (SANDBOX_CLAIM, claim(env=[{"name": "A", "value": "b"}])))
    assert (await world.reconcile()).requeue_after is None
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["reason"] == "EnvVarsInjectionRejected"  # type: ignore[index]


# --------------------------------------------------------------------------- status writes and metrics


async def test_stale_status_patch_conflict_is_dropped_without_metrics() -> None:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    before = sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl")
    foreign = {
        "type": "Foreign",
        "status": "True",
        "reason": "X",
        "message": "",
        "lastTransitionTime": ts(T0),
    }
    with world.lag():  # someone writes the claim's status; our view (and status patch precondition) is stale
        await world.fake.patch_status(
            SANDBOX_CLAIM, "c1", {"status": {"conditions": [foreign]}}, namespace=NS
        )
        result = await world.reconcile()
    assert result.requeue_after is None
    assert world.get(SANDBOX_CLAIM, "c1")["status"] == {"conditions": [foreign]}  # ours was not applied
    assert sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl") == before
    await world.reconcile()  # the update event's pass: binds the owned Sandbox, records once
    assert world.get(SANDBOX_CLAIM, "c1")["status"]["sandbox"]["name"] == "pool-a"
    assert sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl") == before + 1
    await world.reconcile()
    assert sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl") == before + 1


async def test_status_patch_carries_the_resource_version_the_intent_patch_returned() -> None:
    world = World(*standard(), (SANDBOX_CLAIM, claim()))
    bodies: list[Any] = []
    intent_rvs: list[str] = []
    real_status, real_patch = world.fake.patch_status, world.fake.patch

    async def spy_status(kind: Any, name: str, patch: Any, **kw: Any) -> Any:
        bodies.append(copy.deepcopy(patch))
        return await real_status(kind, name, patch, **kw)

    async def spy_patch(kind: Any, name: str, patch: Any, **kw: Any) -> Any:
        out = await real_patch(kind, name, patch, **kw)
        if kind is SANDBOX_CLAIM and kw.get("subresource") is None:
            intent_rvs.append(out["metadata"]["resourceVersion"])
        return out

    world.fake.patch_status = spy_status  # type: ignore[method-assign]
    world.fake.patch = spy_patch  # type: ignore[method-assign]
    rv = world.get(SANDBOX_CLAIM, "c1")["metadata"]["resourceVersion"]
    await world.reconcile()
    assert len(intent_rvs) == 1
    assert intent_rvs[0] != rv  # first-observed went out first
    assert bodies[0]["metadata"] == {"resourceVersion": intent_rvs[0]}


async def test_failed_first_ready_stamp_is_an_error_and_never_double_counts() -> None:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    before = sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl")
    fail_metadata_once(world)
    with pytest.raises(ServerError):
        await world.reconcile()
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["status"] == "True"  # type: ignore[index]
    await world.reconcile()  # retry: Ready was persisted, so backfill instead of recording again
    ann = world.get(SANDBOX_CLAIM, "c1")["metadata"]["annotations"]
    assert ann[c.ANNOTATION_CLAIM_FIRST_READY_AT] == "unknown"
    assert sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl") == before + 1


async def test_observability_annotations_disabled_still_four_writes() -> None:
    world = World(
        *standard(member("pool-a")), (SANDBOX_CLAIM, claim()), config=ClaimConfig(persist_observability=False)
    )
    await world.reconcile()
    assert len(world.writes()) == 4  # intent (assignment only), takeover, status, first-ready
    ann = world.get(SANDBOX_CLAIM, "c1")["metadata"]["annotations"]
    assert c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT not in ann
    assert set(ann) == {c.ANNOTATION_SANDBOX_NAME, c.ANNOTATION_CLAIM_FIRST_READY_AT}


async def test_failed_sandbox_repair_keeps_the_binding() -> None:
    cl = claim(labels={c.LABEL_CREATED_BY: "go-client"})
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, cl))
    await world.reconcile()
    await world.fake.patch(
        SANDBOX_CLAIM, "c1", {"metadata": {"labels": {c.LABEL_CREATED_BY: "python-client"}}}, namespace=NS
    )
    world.fake.inject_error("patch", ServerError(500, "InternalError", "nope"), kind=SANDBOX)
    with pytest.raises(ClaimRetry):
        await world.reconcile()
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert cl["status"]["sandbox"]["name"] == "pool-a"
    assert claim_ready(cl)["reason"] == "ReconcilerError"  # type: ignore[index]


# --------------------------------------------------------------------------- lifecycle


def _bound_claim(name: str = "c1", **kw: Any) -> tuple[World, str]:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim(name, **kw)))
    return world, name


async def _finish(world: World, name: str, at: Any) -> None:
    finished = {
        "type": "Finished",
        "status": "True",
        "reason": "PodSucceeded",
        "message": "",
        "lastTransitionTime": ts(at),
    }
    sb = world.get(SANDBOX, name)
    await world.fake.patch_status(
        SANDBOX, name, {"status": {"conditions": [*sb["status"]["conditions"], finished]}}, namespace=NS
    )


async def test_finished_is_mirrored_and_ttl_requeue_scheduled() -> None:
    world, _ = _bound_claim(lifecycle={"ttlSecondsAfterFinished": 60})
    await world.reconcile()
    await _finish(world, "pool-a", T0)
    result = await world.reconcile()
    assert result.requeue_after == pytest.approx(59.7)
    conds = {cd["type"] for cd in world.get(SANDBOX_CLAIM, "c1")["status"]["conditions"]}
    assert conds == {"Ready", "Finished"}


async def test_ttl_zero_marks_expired_first_then_retain_deletes_the_sandbox() -> None:
    world, _ = _bound_claim(lifecycle={"ttlSecondsAfterFinished": 0})
    await world.reconcile()
    await _finish(world, "pool-a", T0)
    assert (await world.reconcile()).requeue_after == 0.001  # persisted ClaimExpired, nothing deleted yet
    assert world.find(SANDBOX, "pool-a") is not None
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert claim_ready(cl)["reason"] == "ClaimExpired"  # type: ignore[index]
    assert world.events.events[-1] == ("c1", "ClaimExpired", "Claim Expired", "Claim expired")
    await world.reconcile()  # acts: Retain deletes the Sandbox, keeps the claim
    assert world.find(SANDBOX, "pool-a") is None
    await world.reconcile()
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert claim_ready(cl)["reason"] == "ClaimExpired"  # type: ignore[index]
    assert "sandbox" not in cl["status"]
    assert {cd["type"] for cd in cl["status"]["conditions"]} == {"Ready", "Finished"}  # Finished kept


async def test_an_expired_claim_whose_terminating_sandbox_loses_finished_never_binds_another() -> None:
    """§4.9 step 5: Finished is kept once the claim is marked expired (docs/lifecycle.md). The Sandbox being
    torn down (held here by a finalizer) loses its own Finished when its Pod goes; mirroring that removal
    un-expired the claim and the next pass adopted a fresh warm member (probe p2, defect 2)."""
    world = World(
        *standard(member("pool-a"), member("pool-b", created=T0 - timedelta(seconds=30))),
        (SANDBOX_CLAIM, claim(lifecycle={"ttlSecondsAfterFinished": 0})),
    )
    await world.reconcile()
    bound = world.get(SANDBOX_CLAIM, "c1")["status"]["sandbox"]["name"]
    await world.fake.patch(SANDBOX, bound, {"metadata": {"finalizers": ["test/hold"]}}, namespace=NS)
    await _finish(world, bound, T0)
    await world.reconcile()  # mark
    await world.reconcile()  # act: Retain deletes the Sandbox, which stays terminating
    assert world.get(SANDBOX, bound)["metadata"].get("deletionTimestamp")
    sb = world.get(SANDBOX, bound)
    without = [cd for cd in sb["status"]["conditions"] if cd["type"] != "Finished"]
    await world.fake.patch_status(SANDBOX, bound, {"status": {"conditions": without}}, namespace=NS)
    for _ in range(3):
        await world.reconcile()
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert claim_ready(cl)["reason"] == "ClaimExpired"  # type: ignore[index]
    assert {cd["type"] for cd in cl["status"]["conditions"]} == {"Ready", "Finished"}
    assert cl["status"]["sandbox"]["name"] == bound
    assert owners(world) == {bound: "c1"}  # the spare member was not taken


async def test_a_claim_revived_by_a_later_shutdown_time_drops_its_old_finished_in_the_same_pass() -> None:
    """Moving shutdownTime later revives a claim that expired by it (§4.9); the Finished it kept while
    expired (the TTL's start, from the Sandbox it deleted) follows the new Sandbox at once (§4.10 step 2),
    not one pass later: until then the old TTL start could expire the revived claim and delete its new
    Sandbox (a pass delayed past it, e.g. by a restart)."""
    lifecycle = {"ttlSecondsAfterFinished": 60, "shutdownTime": ts(T0 + timedelta(seconds=10))}
    world = World(
        *standard(member("pool-a"), member("pool-b", created=T0 - timedelta(seconds=30))),
        (SANDBOX_CLAIM, claim(lifecycle=lifecycle)),
    )
    await world.reconcile()
    bound = world.get(SANDBOX_CLAIM, "c1")["status"]["sandbox"]["name"]
    await _finish(world, bound, T0)
    await world.reconcile()  # mirrors Finished: the TTL would end at T0 + 60 s
    world.now = T0 + timedelta(seconds=11)
    await world.reconcile()  # mark (shutdownTime)
    await world.reconcile()  # act: Retain deletes the Sandbox
    await world.reconcile()
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert claim_ready(cl)["reason"] == "ClaimExpired"  # type: ignore[index]
    assert {cd["type"] for cd in cl["status"]["conditions"]} == {"Ready", "Finished"}
    later = {**lifecycle, "shutdownTime": ts(T0 + timedelta(hours=1))}
    await world.fake.patch(SANDBOX_CLAIM, "c1", {"spec": {"lifecycle": later}}, namespace=NS)
    await world.reconcile()
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert claim_ready(cl)["reason"] != "ClaimExpired"  # type: ignore[index]
    assert cl["status"]["sandbox"]["name"] != bound
    assert {cd["type"] for cd in cl["status"]["conditions"]} == {"Ready"}
    world.now = T0 + timedelta(seconds=61)  # the old TTL start's end: the revived claim stays
    await world.reconcile()
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert claim_ready(cl)["reason"] != "ClaimExpired"  # type: ignore[index]
    assert world.find(SANDBOX, cl["status"]["sandbox"]["name"]) is not None


@pytest.mark.parametrize(
    ("policy", "propagation"), [("Delete", "Background"), ("DeleteForeground", "Foreground")]
)
async def test_delete_policies_delete_the_claim(policy: str, propagation: str) -> None:
    lifecycle = {"shutdownTime": ts(T0 + timedelta(seconds=10)), "shutdownPolicy": policy}
    world, _ = _bound_claim(lifecycle=lifecycle)
    assert (await world.reconcile()).requeue_after == pytest.approx(9.7)
    world.now = T0 + timedelta(seconds=11)
    await world.reconcile()  # mark
    seen: list[Any] = []
    real = world.fake.delete

    async def spy(kind: Any, name: str, **kw: Any) -> Any:
        seen.append((kind.kind, name, kw.get("propagation_policy")))
        return await real(kind, name, **kw)

    world.fake.delete = spy  # type: ignore[method-assign]
    await world.reconcile()  # act
    assert seen == [("SandboxClaim", "c1", propagation)]
    assert world.find(SANDBOX_CLAIM, "c1") is None
    assert world.events.events[-1] == (
        "c1",
        "ClaimExpired",
        "Deleting",
        f"Deleting Claim (ShutdownPolicy={policy})",
    )


async def test_a_pass_before_the_informer_delivers_the_deletion_neither_deletes_again_nor_repeats_the_event() -> (
    None
):
    """Our status write's event (or a Sandbox event) can run one more pass over the deleted claim's cached copy."""
    lifecycle = {"shutdownTime": ts(T0 + timedelta(seconds=10)), "shutdownPolicy": "Delete"}
    world, _ = _bound_claim(lifecycle=lifecycle)
    await world.reconcile()
    world.now = T0 + timedelta(seconds=11)
    await world.reconcile()  # mark
    with world.lag():  # the informer still shows the claim after our DELETE
        await world.reconcile()  # act
        deleting = [e for e in world.events.events if e[2] == "Deleting"]
        world.clear_actions()
        assert (await world.reconcile()).requeue_after is None
        assert world.writes() == []
    assert [e for e in world.events.events if e[2] == "Deleting"] == deleting
    assert len(deleting) == 1
    assert world.find(SANDBOX_CLAIM, "c1") is None


async def test_retain_with_foreign_sandbox_skips_deletion_and_clears_binding() -> None:
    foreign = member("c1", owner_kind=c.KIND_SANDBOX_CLAIM)
    expired = claim(
        lifecycle={"shutdownTime": ts(T0 - timedelta(seconds=1))},
        status={"conditions": [ready_cond("False", "ClaimExpired")]},
    )
    world = World(*standard(foreign), (SANDBOX_CLAIM, expired))
    assert (await world.reconcile()).requeue_after is None
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert claim_ready(cl)["message"].startswith('Claim expired. sandbox "c1" is not owned')  # type: ignore[index]
    assert world.find(SANDBOX, "c1") is not None


async def test_deleted_claim_drops_first_observed_and_being_deleted_does_nothing() -> None:
    world = World((SANDBOX_CLAIM, claim()))
    world.observed.record(NS, "gone", "u", T0)
    assert (await world.reconcile("gone")).requeue_after is None
    assert world.observed.get(NS, "gone", "u") is None
    deleting = claim("d")
    deleting["metadata"]["finalizers"] = ["x/y"]
    await world.fake.create(SANDBOX_CLAIM, deleting, namespace=NS)
    await world.fake.delete(SANDBOX_CLAIM, "d", namespace=NS)
    world.clear_actions()
    await world.reconcile("d")
    assert world.writes() == []


async def test_legacy_network_policy_deleted_only_if_claim_controlled() -> None:
    ours = {
        "metadata": {
            "name": "c1-network-policy",
            "namespace": NS,
            "ownerReferences": [
                new_controller_ref(
                    api_version=c.EXTENSIONS_API_VERSION, kind="SandboxClaim", name="c1", uid="c1-uid"
                )
            ],
        },
        "spec": {},
    }
    theirs = copy.deepcopy(ours)
    theirs["metadata"]["name"] = "c2-network-policy"
    theirs["metadata"]["ownerReferences"] = []
    world = World(
        *standard(),
        (NETWORK_POLICY, ours),
        (NETWORK_POLICY, theirs),
        (SANDBOX_CLAIM, claim()),
        (SANDBOX_CLAIM, claim("c2")),
    )
    await world.reconcile()
    await world.reconcile("c2")
    assert [p["metadata"]["name"] for p in world.fake.objects(NETWORK_POLICY)] == ["c2-network-policy"]


@pytest.mark.parametrize("lagging", ["pool and template", "template"])
async def test_a_pool_or_template_the_cache_has_not_seen_yet_is_asked_for_not_reported_missing(
    lagging: str,
) -> None:
    """A claim POSTed right after its pool and template can beat their watch events to this controller: the
    reconciler asks the API server before writing WarmPoolNotFound / TemplateNotFound, which clients treat as
    terminal. Here the claim goes on to a cold Sandbox from the template the cache did not have yet."""
    world = World((SANDBOX_CLAIM, claim()), *([(SANDBOX_WARM_POOL, pool())] if lagging == "template" else []))
    with world.lag():  # the informer has not delivered what is created below
        if lagging == "pool and template":
            await world.fake.create(SANDBOX_WARM_POOL, pool(), namespace=NS)
        await world.fake.create(SANDBOX_TEMPLATE, template(), namespace=NS)
        await world.reconcile()
    ready = claim_ready(world.get(SANDBOX_CLAIM, "c1"))
    assert ready is not None
    assert ready["reason"] not in (c.REASON_WARM_POOL_NOT_FOUND, c.REASON_TEMPLATE_NOT_FOUND), ready
    assert [sb["metadata"]["name"] for sb in world.fake.objects(SANDBOX)] == ["c1"]  # cold, from the template
