"""Lifecycle decisions (controllers/lifecycle/decide.py): idle, hibernation, restore; pure tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import format_time
from agent_sandbox.controllers.lifecycle.decide import (
    ANNOTATION_ARCHIVED_VERSION,
    ANNOTATION_EXPIRED_AT,
    ANNOTATION_RESTORED_FROM,
    ArchiveSteps,
    DropHibernate,
    ExpireArchive,
    MarkArchiveExpired,
    Nothing,
    Probe,
    RestoreSteps,
    RuntimeActivity,
    Snapshot,
    Suspend,
    adopt_child_patch,
    decide,
    handover_child_patch,
    idle_since,
    release_child_patch,
)

pytestmark = pytest.mark.unit

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
CLAIM_REF = {
    "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
    "kind": "SandboxClaim",
    "name": "c",
    "uid": "claim-uid",
    "controller": True,
}
POOL_REF = {**CLAIM_REF, "kind": "SandboxWarmPool", "name": "p", "uid": "pool-uid"}


def sandbox(
    *,
    annotations: dict[str, str] | None = None,
    mode: str = "Running",
    created: datetime = T0,
    ready_at: datetime | None = None,
    suspended_at: datetime | None = None,
    owners: list[dict[str, Any]] | None = None,
    ips: list[str] | None = None,
    **meta: Any,
) -> dict[str, Any]:
    conditions = []
    if ready_at is not None:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": format_time(ready_at)})
    if suspended_at is not None:
        conditions.append(
            {"type": "Suspended", "status": "True", "lastTransitionTime": format_time(suspended_at)}
        )
    return {
        "metadata": {
            "name": "sb",
            "namespace": "ns",
            "uid": "sb-uid",
            "resourceVersion": "7",
            "creationTimestamp": format_time(created),
            "annotations": annotations or {},
            "ownerReferences": owners or [],
            **meta,
        },
        "spec": {"operatingMode": mode},
        "status": {"conditions": conditions, "podIPs": ips or []},
    }


def snap(sb: Any = None, *, now: datetime, **kw: Any) -> Snapshot:
    return Snapshot(now=now, sandbox=sb, **kw)


IDLE = {lc.ANNOTATION_IDLE_TIMEOUT: "10m"}


def test_nothing_asked_nothing_done() -> None:
    assert decide(snap(sandbox(), now=T0 + timedelta(days=9))) == Nothing()


def test_idle_clock_waits_for_the_deadline() -> None:
    plan = decide(snap(sandbox(annotations=IDLE, ready_at=T0), now=T0 + timedelta(minutes=4)))
    assert plan == Nothing(pytest.approx(360.0))


def test_due_asks_the_runtime_first_then_suspends() -> None:
    sb = sandbox(annotations=IDLE, ips=["10.0.0.1"])
    now = T0 + timedelta(minutes=11)
    assert decide(snap(sb, now=now)) == Probe("10.0.0.1")
    idle = RuntimeActivity(True, idle_seconds=900)
    assert decide(snap(sb, now=now, activity=idle)) == Suspend(lc.Cause.IDLE, "7", pytest.approx(660.0))


@pytest.mark.parametrize(
    ("activity", "requeue"),
    [
        (RuntimeActivity(True, idle_seconds=30), 570.0),  # traffic that bypassed the router, 30 s ago
        (RuntimeActivity(True, idle_seconds=0, running_commands=1), 60.0),  # a long command
        (RuntimeActivity(True, idle_seconds=0, inflight_requests=2), 60.0),  # a download in flight
    ],
)
def test_the_runtime_can_postpone_the_suspend(activity: RuntimeActivity, requeue: float) -> None:
    sb = sandbox(annotations=IDLE, ips=["10.0.0.1"])
    assert decide(snap(sb, now=T0 + timedelta(minutes=11), activity=activity)) == Nothing(
        pytest.approx(requeue)
    )


def test_unreachable_runtime_or_no_probe_rests_on_router_activity() -> None:
    sb = sandbox(annotations=IDLE, ips=["10.0.0.1"])
    now = T0 + timedelta(minutes=11)
    assert isinstance(decide(snap(sb, now=now, activity=RuntimeActivity(False))), Suspend)
    assert isinstance(decide(snap(sb, now=now, probe_enabled=False)), Suspend)


def test_every_activity_source_moves_the_idle_clock() -> None:
    claim = {
        "metadata": {
            "creationTimestamp": format_time(T0 + timedelta(minutes=5)),
            "annotations": {"agents.x-k8s.io/claim-first-ready-at": "2026-03-01T12:06:00.5Z"},
        }
    }
    sb = sandbox(
        annotations={
            **IDLE,
            lc.ANNOTATION_LAST_ACTIVITY: format_time(T0 + timedelta(minutes=2)),
            lc.ANNOTATION_RESUMED_AT: format_time(T0 + timedelta(minutes=3)),
        },
        ready_at=T0 + timedelta(minutes=4),
    )
    assert idle_since(sb, None) == T0 + timedelta(minutes=4)
    # A warm member adopted long after its creation: the claim's times count.
    assert idle_since(sb, claim) == T0 + timedelta(minutes=6, seconds=0.5)


def test_a_start_is_not_idle_until_the_sandbox_is_ready() -> None:
    # Resumed at T0 with a 2 s timeout; its pod is still starting 10 s later (requests held for it).
    annotations = {lc.ANNOTATION_IDLE_TIMEOUT: "2s", lc.ANNOTATION_RESUMED_AT: format_time(T0)}
    starting = sandbox(annotations=annotations, created=T0 - timedelta(hours=1))
    plan = decide(snap(starting, now=T0 + timedelta(seconds=10), probe_enabled=False))
    assert plan == Nothing(290.0)
    # Ready again: the clock runs from its Ready transition.
    ready = sandbox(
        annotations=annotations, created=T0 - timedelta(hours=1), ready_at=T0 + timedelta(seconds=9)
    )
    assert decide(snap(ready, now=T0 + timedelta(seconds=10), probe_enabled=False)) == Nothing(1.0)
    assert isinstance(decide(snap(ready, now=T0 + timedelta(seconds=12), probe_enabled=False)), Suspend)
    # Never Ready within the grace: idle-suspended as any other.
    late = T0 + timedelta(seconds=301)
    assert isinstance(decide(snap(starting, now=late, probe_enabled=False)), Suspend)
    # A new Sandbox whose pod is slow to start: the same.
    new = sandbox(annotations={lc.ANNOTATION_IDLE_TIMEOUT: "2s"}, created=T0)
    assert decide(snap(new, now=T0 + timedelta(seconds=5), probe_enabled=False)) == Nothing(295.0)


def test_pool_members_deleting_and_expired_sandboxes_are_left_alone() -> None:
    now = T0 + timedelta(hours=1)
    assert decide(snap(sandbox(annotations=IDLE, owners=[POOL_REF]), now=now)) == Nothing()
    deleting = sandbox(annotations=IDLE, deletionTimestamp=format_time(T0))
    assert decide(snap(deleting, now=now)) == Nothing()
    expired = sandbox(annotations=IDLE)
    expired["spec"]["shutdownTime"] = format_time(T0 + timedelta(minutes=30))
    assert decide(snap(expired, now=now)) == Nothing()


def test_a_hibernate_request_on_a_pool_member_is_dropped_not_carried_out() -> None:
    # Until December 6 it stayed on the member and hibernated whoever claimed it.
    member = sandbox(annotations={lc.ANNOTATION_HIBERNATE: "true"}, owners=[POOL_REF])
    assert decide(snap(member, now=T0)) == DropHibernate("7")


def test_template_settings_apply_and_problems_are_reported() -> None:
    now = T0 + timedelta(minutes=11)
    assert isinstance(
        decide(snap(sandbox(), now=now, template_annotations=IDLE, probe_enabled=False)), Suspend
    )
    bad = decide(snap(sandbox(annotations={lc.ANNOTATION_IDLE_TIMEOUT: "soon"}), now=now))
    assert isinstance(bad, Nothing)
    assert "idle-timeout" in bad.problems[0]


def test_on_demand_hibernation_suspends_first() -> None:
    sb = sandbox(annotations={lc.ANNOTATION_HIBERNATE: "true"})
    assert decide(snap(sb, now=T0)) == Suspend(lc.Cause.HIBERNATE, "7")


def test_suspended_sandbox_is_archived_once_its_pod_is_gone_and_the_time_is_due() -> None:
    annotations = {lc.ANNOTATION_HIBERNATE_AFTER: "1h"}
    pending = sandbox(annotations=annotations, mode="Suspended")  # no Suspended=True yet: pod still there
    assert decide(snap(pending, now=T0 + timedelta(days=1))) == Nothing()
    sb = sandbox(annotations=annotations, mode="Suspended", suspended_at=T0, owners=[CLAIM_REF])
    assert decide(snap(sb, now=T0 + timedelta(minutes=20))) == Nothing(pytest.approx(2400.0))
    pvc = {"kind": "PersistentVolumeClaim", "metadata": {"name": "data-sb", "resourceVersion": "3"}}
    plan = decide(snap(sb, now=T0 + timedelta(hours=2), children=(pvc,)))
    assert isinstance(plan, ArchiveSteps)
    assert plan.cause is lc.Cause.AFTER
    assert plan.claim_name == "c"
    assert plan.delete_uid == "sb-uid"
    assert plan.archive is not None
    assert plan.archive["spec"]["children"] == [{"kind": "PersistentVolumeClaim", "name": "data-sb"}]


def test_interrupted_archiving_finishes_only_what_is_left() -> None:
    hibernating = {lc.ANNOTATION_HIBERNATE: "true"}  # still asked for: the archiving goes on
    sb = sandbox(annotations=hibernating, mode="Suspended", suspended_at=T0, owners=[CLAIM_REF])
    archive = lc.archive_body(sb, cause=lc.Cause.REQUESTED, now=T0, children=[])
    archive["metadata"]["uid"] = "archive-uid"
    archive["metadata"]["annotations"] = {ANNOTATION_ARCHIVED_VERSION: "7"}  # copied from this very Sandbox
    kept = {
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "a", "ownerReferences": [{"uid": "archive-uid"}]},
    }
    left = {
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "b", "ownerReferences": [{"uid": "sb-uid"}]},
    }
    claim = {"metadata": {"name": "c", "annotations": {lc.ANNOTATION_HIBERNATED_SANDBOX: "sb"}}}
    plan = decide(snap(sb, now=T0, archive=archive, children=(kept, left), claim=claim))
    assert plan == ArchiveSteps(lc.Cause.REQUESTED, None, (left,), None, "sb-uid", "7")
    deleting = sandbox(uid="sb-uid", deletionTimestamp=format_time(T0))
    assert decide(snap(deleting, now=T0, archive=archive)) == Nothing()


def test_restore_creates_releases_unmarks_and_deletes() -> None:
    sb = sandbox(mode="Suspended", suspended_at=T0, owners=[CLAIM_REF])
    archive = lc.archive_body(sb, cause=lc.Cause.REQUESTED, now=T0, children=[])
    archive["metadata"]["uid"] = "archive-uid"
    assert decide(snap(None, now=T0, archive=archive)) == Nothing()  # hibernated, nobody asked
    archive["spec"]["restore"] = {"cause": "Request", "requestedAt": "2026-03-01T13:00:00Z"}
    held = {
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "a", "ownerReferences": [{"uid": "archive-uid"}]},
    }
    claim = {"metadata": {"name": "c", "annotations": {lc.ANNOTATION_HIBERNATED_SANDBOX: "sb"}}}
    plan = decide(snap(None, now=T0, archive=archive, children=(held,), claim=claim))
    assert isinstance(plan, RestoreSteps)
    assert plan.create is not None
    assert plan.create["metadata"]["ownerReferences"] == [CLAIM_REF]
    assert plan.create["spec"]["operatingMode"] == "Running"
    # Creating is the whole pass: the volumes stay the archive's, the claim marked, the archive kept.
    assert (plan.cause, plan.children, plan.claim_name, plan.archive_uid) == (
        lc.Cause.REQUEST,
        (),
        None,
        "archive-uid",
    )
    assert plan.create["metadata"]["annotations"][ANNOTATION_RESTORED_FROM] == "archive-uid"
    # The new Sandbox exists (another UID): finish without creating again, once it controls the volume.
    fresh = sandbox(uid="new-uid", annotations={ANNOTATION_RESTORED_FROM: "archive-uid"})
    taken = {
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "a",
            "ownerReferences": [{"uid": "archive-uid"}, {"uid": "new-uid", "controller": True}],
        },
    }
    again = decide(snap(fresh, now=T0, archive=archive, children=(taken,), claim=claim))
    assert again == RestoreSteps(
        lc.Cause.REQUEST,
        datetime(2026, 3, 1, 13, tzinfo=UTC),
        None,
        (taken,),
        "c",
        "archive-uid",
        sandbox=fresh,
        record_uid="new-uid",  # the pass that created it was interrupted before recording it
    )


def test_restore_keeps_the_volume_until_the_sandbox_controller_takes_it_back() -> None:
    # Until December 6 the archive's reference was dropped right after the create: a Sandbox that never
    # adopted the PVC (expired) left it with no owner, and the two patches raced (409).
    archive = lc.archive_body(sandbox(mode="Suspended"), cause=lc.Cause.REQUESTED, now=T0, children=[])
    archive["metadata"]["uid"] = "archive-uid"
    archive["spec"]["restore"] = {"cause": "Manual"}
    held = {
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "a", "resourceVersion": "9", "ownerReferences": [{"uid": "archive-uid"}]},
    }
    claim = {"metadata": {"name": "c", "annotations": {lc.ANNOTATION_HIBERNATED_SANDBOX: "sb"}}}
    restored = {ANNOTATION_RESTORED_FROM: "archive-uid"}
    fresh = sandbox(uid="new-uid", annotations=restored)
    plan = decide(snap(fresh, now=T0, archive=archive, children=(held,), claim=claim))
    assert isinstance(plan, RestoreSteps)
    assert (plan.children, plan.handover, plan.waiting, plan.claim_name) == ((), (), True, None)
    # A restored Sandbox that will never adopt it (expired, being deleted): we hand it over, in one write.
    expired = sandbox(uid="new-uid", annotations=restored)
    expired["spec"]["shutdownTime"] = format_time(T0 - timedelta(seconds=1))
    deleting = sandbox(uid="new-uid", annotations=restored, deletionTimestamp=format_time(T0))
    for gone in (expired, deleting):
        plan = decide(snap(gone, now=T0, archive=archive, children=(held,), claim=claim))
        assert isinstance(plan, RestoreSteps)
        assert (plan.children, plan.handover, plan.waiting, plan.claim_name) == ((), (held,), False, None)
        assert handover_child_patch(held, gone, "archive-uid") == {
            "metadata": {
                "resourceVersion": "9",
                "ownerReferences": [
                    {
                        "apiVersion": "agents.x-k8s.io/v1beta1",
                        "kind": "Sandbox",
                        "name": "sb",
                        "uid": "new-uid",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            }
        }


@pytest.mark.parametrize("restore", [False, True])
def test_a_hibernated_sandbox_expires_by_its_shutdown_policy(restore: bool) -> None:
    # Until December 6 a hibernated Sandbox was never expired: its archive kept the volumes forever.
    sb = sandbox(mode="Suspended", suspended_at=T0, owners=[CLAIM_REF])
    sb["spec"]["shutdownTime"] = format_time(T0 + timedelta(hours=1))
    claim = {"metadata": {"name": "c", "annotations": {lc.ANNOTATION_HIBERNATED_SANDBOX: "sb"}}}
    retained = MarkArchiveExpired("archive-uid")
    for policy, expected in (("Delete", ExpireArchive("archive-uid", "c")), ("Retain", retained)):
        sb["spec"]["shutdownPolicy"] = policy
        archive = lc.archive_body(sb, cause=lc.Cause.REQUESTED, now=T0, children=[])
        archive["metadata"]["uid"] = "archive-uid"
        if restore:  # an expired one is never restored (it would only be torn down again)
            archive["spec"]["restore"] = {"cause": "Manual"}
        else:  # not yet: looked at again at its shutdownTime
            assert decide(snap(None, now=T0, archive=archive, claim=claim)) == Nothing(3600.0)
        assert decide(snap(None, now=T0 + timedelta(hours=2), archive=archive, claim=claim)) == expected
        if policy == "Retain":  # marked once (`kubectl get sbarchive -o yaml` tells it), then left alone
            archive["metadata"]["annotations"] = {ANNOTATION_EXPIRED_AT: format_time(T0)}
            assert decide(snap(None, now=T0 + timedelta(hours=2), archive=archive)) == Nothing()


def test_a_new_sandbox_in_an_archived_name_is_reported_not_touched() -> None:
    archive = lc.archive_body(sandbox(mode="Suspended"), cause=lc.Cause.REQUESTED, now=T0, children=[])
    archive["metadata"]["uid"] = "archive-uid"
    plan = decide(snap(sandbox(uid="someone-else"), now=T0, archive=archive))
    assert isinstance(plan, Nothing)
    assert "exists while it is hibernated" in plan.conflict


def test_child_owner_patches_are_guarded_and_keep_other_owners() -> None:
    archive = {"metadata": {"name": "sb", "uid": "archive-uid"}}
    child = {"metadata": {"resourceVersion": "5", "ownerReferences": [{"uid": "sb-uid", "controller": True}]}}
    adopted = adopt_child_patch(child, archive)["metadata"]
    assert adopted["resourceVersion"] == "5"
    assert [r["uid"] for r in adopted["ownerReferences"]] == ["sb-uid", "archive-uid"]
    assert adopted["ownerReferences"][1]["controller"] is False
    held = {"metadata": {"resourceVersion": "6", "ownerReferences": [{"uid": "archive-uid"}]}}
    assert release_child_patch(held, "archive-uid") == {
        "metadata": {"resourceVersion": "6", "ownerReferences": None}
    }


@pytest.mark.parametrize(
    ("template", "recorded"), [({lc.ANNOTATION_AUTO_RESUME: "true"}, "true"), ({}, None)]
)
def test_the_archive_records_its_templates_auto_resume(
    template: dict[str, str], recorded: str | None
) -> None:
    # So a restore on request does not depend on a template deleted while the Sandbox is hibernated (until
    # December 7 a request then got upstream's 502 and nothing was restored).
    settings = {**template, lc.ANNOTATION_HIBERNATE_AFTER: "1h"}
    sb = sandbox(mode="Suspended", suspended_at=T0)
    plan = decide(snap(sb, now=T0 + timedelta(hours=2), template_annotations=settings))
    assert isinstance(plan, ArchiveSteps)
    assert plan.archive is not None
    assert plan.archive["metadata"]["annotations"].get(lc.ANNOTATION_TEMPLATE_AUTO_RESUME) == recorded
