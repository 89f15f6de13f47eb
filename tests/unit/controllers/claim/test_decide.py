"""Pure claim decisions: resolution order, expiry, claim metadata, readiness rules (spec §4.3-§4.5, §4.13)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.claim.adoption import adoption_patch
from agent_sandbox.controllers.claim.decide import (
    Adopt,
    Bound,
    Continue,
    Create,
    DeleteClaim,
    Failed,
    MarkExpired,
    NeedCandidate,
    Pending,
    Snapshot,
    decide_claim_intent,
    decide_expiry,
    decide_first_ready,
    legacy_policy_to_delete,
    resolve,
    resolve_expired,
)
from agent_sandbox.controllers.claim.errors import (
    InvalidMetadata,
    ReconcilerError,
    TemplateNotFound,
    WarmPoolNotFound,
)
from agent_sandbox.controllers.claim.observability import ReadyStep, readiness_step
from agent_sandbox.kube import apply_json_patch
from tests.unit.controllers.claim.builders import T0, claim, member, pool, ready_cond, template, ts

pytestmark = pytest.mark.unit


def owned_by(sb: dict[str, Any], cl: dict[str, Any], *, cold: bool = False) -> dict[str, Any]:
    """`sb` after `cl` took it over (or, `cold`, a Sandbox the claim created under its own name)."""
    out: dict[str, Any] = apply_json_patch(sb, adoption_patch(cl, sb, template()))
    if cold:
        out["metadata"]["labels"][c.LABEL_LAUNCH_TYPE] = c.LAUNCH_TYPE_COLD
    return out


def snap(cl: dict[str, Any] | None = None, **kw: Any) -> Snapshot:
    base: dict[str, Any] = {"pool": pool(), "template": template(), "now": T0 + timedelta(milliseconds=300)}
    base.update(kw)
    return Snapshot(claim=cl or claim(), **base)


# --------------------------------------------------------------------------- resolution order


def test_unbound_claim_asks_the_warm_queue_first() -> None:
    assert resolve(snap()) == NeedCandidate("ns/pool")


def test_candidate_is_adopted_with_the_guarded_patch() -> None:
    cand = member("pool-a")
    res = resolve(snap(warm_consulted=True, candidate=cand))
    assert isinstance(res, Adopt)
    assert res.sandbox is cand
    assert res.ops[:2] == [
        {"op": "test", "path": "/metadata/uid", "value": "pool-a-uid"},
        {"op": "test", "path": "/metadata/ownerReferences", "value": cand["metadata"]["ownerReferences"]},
    ]


def test_empty_pool_cold_starts_at_once() -> None:
    res = resolve(snap(warm_consulted=True))
    assert isinstance(res, Create)
    assert res.body["metadata"]["name"] == "c1"


def test_unnetworked_candidates_hold_a_young_claim_briefly() -> None:
    young = snap(warm_consulted=True, pending=3, now=T0 + timedelta(milliseconds=1700))
    assert resolve(young) == Pending(pytest.approx(0.3))
    assert resolve(replace(young, now=T0 + timedelta(milliseconds=200))) == Pending(0.5)
    old = replace(young, now=T0 + timedelta(seconds=2))
    assert isinstance(resolve(old), Create)  # grace over: cold


@pytest.mark.parametrize("field", ["env", "volumeClaimTemplates"])
def test_env_or_vcts_force_a_cold_start(field: str) -> None:
    value: Any = (
        [{"name": "K", "value": "v"}] if field == "env" else [{"metadata": {"name": "d"}, "spec": {}}]
    )
    tmpl = template(envVarsInjectionPolicy="Allowed", volumeClaimTemplatesPolicy="Allowed")
    res = resolve(snap(claim(**{field: value}), template=tmpl))
    assert isinstance(res, Create)


def test_missing_pool_or_template() -> None:
    res = resolve(snap(warm_consulted=True, pool=None, template=None))
    assert isinstance(res, Failed)
    assert isinstance(res.error, WarmPoolNotFound)
    res = resolve(snap(warm_consulted=True, template=None))
    assert isinstance(res, Failed)
    assert isinstance(res.error, TemplateNotFound)
    assert str(res.error) == 'SandboxTemplate "tmpl" not found'


def test_invalid_metadata_fails_before_anything_else() -> None:
    cl = claim(additionalPodMetadata={"labels": {"nodomain": "x"}})
    res = resolve(snap(cl))
    assert isinstance(res, Failed)
    assert isinstance(res.error, InvalidMetadata)


def test_persisted_binding_wins_and_never_adopts_again() -> None:
    cl = claim(status={"sandbox": {"name": "pool-a"}})
    bound = owned_by(member("pool-a"), cl)
    res = resolve(
        snap(cl, status_sandbox=bound, owned=(bound,), candidate=member("pool-b"), warm_consulted=True)
    )
    assert isinstance(res, Bound)
    assert res.sandbox is bound
    assert res.writes == ()


def test_owned_sandbox_found_without_any_claim_record() -> None:
    """Crash after the takeover, before the status write: the ownership index finds it (no intent record)."""
    cl = claim()
    bound = owned_by(member("pool-a"), cl)
    res = resolve(snap(cl, owned=(bound,)))
    assert isinstance(res, Bound)
    assert res.sandbox is bound


def test_same_name_sandbox_not_controlled_is_an_error() -> None:
    foreign = member("c1", owner_kind=c.KIND_SANDBOX_CLAIM)
    res = resolve(snap(same_name=foreign))
    assert isinstance(res, Failed)
    assert isinstance(res.error, ReconcilerError)
    assert str(res.error) == (
        'sandbox "c1" is not controlled by claim "c1". Please use a different claim name or delete the sandbox manually'
    )


def test_controlled_same_name_sandbox_is_reused_and_labelled_cold() -> None:
    cl = claim()
    cold = owned_by(member("c1"), cl)
    del cold["metadata"]["labels"][c.LABEL_LAUNCH_TYPE]
    res = resolve(snap(cl, same_name=cold))
    assert isinstance(res, Bound)
    assert res.writes[0].patch == {"metadata": {"labels": {c.LABEL_LAUNCH_TYPE: "cold"}}}


def test_assignment_record_of_upstream_controller_is_completed() -> None:
    cl = claim(annotations={c.ANNOTATION_SANDBOX_NAME: "pool-a"})
    res = resolve(snap(cl, assigned=member("pool-a")))
    assert isinstance(res, Adopt)
    assert res.sandbox["metadata"]["name"] == "pool-a"


@pytest.mark.parametrize(
    "assigned",
    [None, member("pool-a", owner_kind=c.KIND_SANDBOX_CLAIM), member("pool-a", pool_name="other")],
    ids=["gone", "another claim's", "wrong pool"],
)
def test_stale_assignment_record_is_dropped(assigned: dict[str, Any] | None) -> None:
    cl = claim(annotations={c.ANNOTATION_SANDBOX_NAME: "pool-a"})
    res = resolve(snap(cl, assigned=assigned))
    assert res == NeedCandidate("ns/pool", drop_reference=True)


def test_bound_sandbox_metadata_is_synced_with_one_merge_patch() -> None:
    cl = claim(
        additionalPodMetadata={"labels": {"sandbox.users.io/t": "2"}},
        labels={c.LABEL_CREATED_BY: "go-client"},
    )
    bound = owned_by(member("pool-a"), claim())  # adopted before the claim asked for more metadata
    cl["metadata"]["uid"] = "c1-uid"
    cl["status"] = {"sandbox": {"name": "pool-a"}}
    res = resolve(snap(cl, status_sandbox=bound))
    assert isinstance(res, Bound)
    assert len(res.writes) == 1
    patch = res.writes[0].patch
    assert patch == {
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {"sandbox.users.io/t": "2", c.LABEL_CREATED_BY: "go-client"}}
            }
        },
        "metadata": {"labels": {c.LABEL_CREATED_BY: "go-client"}},
    }


def test_bound_sandbox_without_template_forwards_ready_unless_claim_needs_metadata() -> None:
    cl = claim(status={"sandbox": {"name": "pool-a"}})
    bound = owned_by(member("pool-a"), cl)
    res = resolve(snap(cl, status_sandbox=bound, template=None))
    assert isinstance(res, Bound)
    assert res.error is None
    cl2 = claim(
        status={"sandbox": {"name": "pool-a"}}, additionalPodMetadata={"labels": {"sandbox.users.io/t": "1"}}
    )
    res = resolve(snap(cl2, status_sandbox=bound, template=None))
    assert isinstance(res, Bound)
    assert isinstance(res.error, TemplateNotFound)
    assert str(res.error).startswith("failed to get template for metadata propagation: SandboxTemplate")


def test_stray_second_sandbox_is_released_once_the_binding_is_persisted() -> None:
    cl = claim(status={"sandbox": {"name": "pool-a"}})
    a, b = owned_by(member("pool-a"), cl), owned_by(member("pool-b"), cl)
    res = resolve(snap(cl, status_sandbox=a, owned=(a, b)))
    assert isinstance(res, Bound)
    assert res.sandbox is a
    assert [(w.name, w.delete_uid) for w in res.writes] == [("pool-b", "pool-b-uid")]
    unpersisted = resolve(
        snap(claim(), owned=(b, a))
    )  # no binding yet: pick deterministically, delete nothing
    assert isinstance(unpersisted, Bound)
    assert unpersisted.writes == ()


# --------------------------------------------------------------------------- expiry


def test_expiry_marks_first_then_acts() -> None:
    lifecycle = {"shutdownTime": ts(T0 - timedelta(seconds=1)), "shutdownPolicy": "Delete"}
    step = decide_expiry(claim(lifecycle=lifecycle), T0)
    assert isinstance(step, MarkExpired)
    assert step.ready["reason"] == "ClaimExpired"
    marked = claim(lifecycle=lifecycle, status={"conditions": [ready_cond("False", "ClaimExpired")]})
    assert decide_expiry(marked, T0) == DeleteClaim("Delete")
    assert decide_expiry(marked, T0).propagation == "Background"  # type: ignore[union-attr]
    fg = claim(lifecycle={**lifecycle, "shutdownPolicy": "DeleteForeground"}, status=marked["status"])
    assert decide_expiry(fg, T0).propagation == "Foreground"  # type: ignore[union-attr]
    retain = claim(lifecycle={**lifecycle, "shutdownPolicy": "Retain"}, status=marked["status"])
    assert decide_expiry(retain, T0) == Continue(True, -1.0)


def test_retain_teardown_deletes_own_sandbox_and_skips_foreign() -> None:
    cl = claim(status={"sandbox": {"name": "pool-a"}})
    ours = owned_by(member("pool-a"), cl)
    res = resolve_expired(snap(cl, status_sandbox=ours))
    assert isinstance(res, Bound)
    assert [(w.name, w.delete_uid) for w in res.writes] == [("pool-a", "pool-a-uid")]
    cold = owned_by(member("c1"), claim(), cold=True)
    res = resolve_expired(snap(claim(), same_name=cold))  # no binding: the claim's own name
    assert isinstance(res, Bound)
    assert res.writes[0].name == "c1"
    foreign = member("c1", owner_kind=c.KIND_SANDBOX_CLAIM)
    res = resolve_expired(snap(claim(), same_name=foreign))
    assert isinstance(res, Failed)
    assert res.error is not None
    assert res.error.reason == "ClaimExpired"
    assert resolve_expired(snap(claim())) == Failed(None)


def test_legacy_policy_deleted_only_when_claim_controlled() -> None:
    cl = claim()
    ours = {
        "metadata": {"ownerReferences": [{**owned_by(member("x"), cl)["metadata"]["ownerReferences"][0]}]}
    }
    assert legacy_policy_to_delete(cl, ours)
    assert not legacy_policy_to_delete(cl, {"metadata": {"name": "c1-network-policy"}})
    assert not legacy_policy_to_delete(cl, None)


# --------------------------------------------------------------------------- claim metadata + readiness


READY_STEPS = [
    (False, False, False, ReadyStep.NOTHING),
    (True, False, False, ReadyStep.DRAIN_BACKFILL),
    (True, True, True, ReadyStep.DRAIN_BACKFILL),
    (False, True, True, ReadyStep.DRAIN),  # a flap or resume after the first Ready
    (False, True, False, ReadyStep.RECORD),
]


@pytest.mark.parametrize(("old", "new", "stamped", "want"), READY_STEPS)
def test_readiness_step(old: bool, new: bool, stamped: bool, want: ReadyStep) -> None:
    assert readiness_step(old_ready=old, new_ready=new, first_ready_stamped=stamped) is want


def test_first_warm_pass_records_the_candidate_and_first_observed_before_the_status() -> None:
    cl = claim()
    candidate = member("pool-a")  # still the pool's: the intent goes out alongside its takeover
    patch = decide_claim_intent(cl, sandbox=candidate, first_observed=T0, persist_observed=True)
    assert patch.body() == {
        "metadata": {
            "annotations": {
                c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT: "2026-01-01T12:00:00Z",
                c.ANNOTATION_SANDBOX_NAME: "pool-a",
            },
            "managedFields": [{}],
        }
    }


APPLY_ENTRY = {"manager": "kubectl", "operation": "Apply", "apiVersion": "extensions.agents.x-k8s.io/v1beta1"}
UPDATE_ENTRY = {
    "manager": "python-httpx",
    "operation": "Update",
    "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
}


@pytest.mark.parametrize(
    ("entries", "reset"),
    [
        (None, True),  # the cache strips entries of claims nobody applied
        ([UPDATE_ENTRY], True),  # created by POST (SDK, kubectl create) or client-side apply
        ([UPDATE_ENTRY, APPLY_ENTRY], False),  # server-side applied: apply reads them
        ([APPLY_ENTRY], False),
    ],
)
def test_the_intent_patch_drops_managed_fields_unless_the_claim_was_applied(
    entries: list[dict[str, str]] | None, reset: bool
) -> None:
    cl = claim()
    if entries is not None:
        cl["metadata"]["managedFields"] = entries
    patch = decide_claim_intent(cl, sandbox=member("pool-a"), first_observed=T0, persist_observed=True)
    assert ("managedFields" in patch.body()["metadata"]) is reset
    if reset:
        assert patch.body()["metadata"]["managedFields"] == [{}]  # kube-apiserver's reset form, not []


def test_a_reset_alone_is_never_a_write() -> None:
    settled = claim(
        annotations={c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT: "x", c.ANNOTATION_SANDBOX_NAME: "pool-a"}
    )
    sb = owned_by(member("pool-a"), settled)
    patch = decide_claim_intent(settled, sandbox=sb, first_observed=T0, persist_observed=True)
    assert patch.empty
    assert patch.body() == {"metadata": {}}


def test_first_ready_stamp_is_the_only_write_after_the_status() -> None:
    cl = claim(annotations={c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT: "x", c.ANNOTATION_SANDBOX_NAME: "p"})
    patch = decide_first_ready(cl, ready_step=ReadyStep.RECORD, now=T0 + timedelta(milliseconds=40))
    assert patch.body() == {
        "metadata": {"annotations": {c.ANNOTATION_CLAIM_FIRST_READY_AT: "2026-01-01T12:00:00.04Z"}}
    }
    assert decide_first_ready(cl, ready_step=ReadyStep.NOTHING, now=T0).empty
    assert decide_first_ready(cl, ready_step=ReadyStep.DRAIN, now=T0).empty


def test_observability_disabled_keeps_first_observed_in_memory_only() -> None:
    cl = claim()
    sb = owned_by(member("pool-a"), cl)
    patch = decide_claim_intent(
        cl, sandbox=sb, first_observed=T0, persist_observed=False, trace_context='{"traceparent":"x"}'
    )
    assert patch.annotations == {c.ANNOTATION_SANDBOX_NAME: "pool-a"}


def test_nothing_to_persist_on_a_settled_claim() -> None:
    cl = claim(
        annotations={
            c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT: "x",
            c.ANNOTATION_SANDBOX_NAME: "pool-a",
            c.ANNOTATION_CLAIM_FIRST_READY_AT: "y",
        }
    )
    sb = owned_by(member("pool-a"), cl)
    assert decide_claim_intent(cl, sandbox=sb, first_observed=T0, persist_observed=True).empty
    assert decide_first_ready(cl, ready_step=ReadyStep.DRAIN_BACKFILL, now=T0).empty


def test_cold_claims_get_no_assignment_record_and_backfill_unknown() -> None:
    cl = claim(annotations={c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT: "x"})
    cold = owned_by(member("c1"), cl, cold=True)
    assert decide_claim_intent(cl, sandbox=cold, first_observed=T0, persist_observed=True).empty
    patch = decide_first_ready(cl, ready_step=ReadyStep.DRAIN_BACKFILL, now=T0)
    assert patch.annotations == {c.ANNOTATION_CLAIM_FIRST_READY_AT: "unknown"}


def test_stale_references_removed_and_legacy_label_migrated() -> None:
    cl = claim(
        annotations={c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT: "x", c.ANNOTATION_SANDBOX_NAME: "gone"}
    )
    patch = decide_claim_intent(
        cl, sandbox=None, first_observed=T0, persist_observed=True, drop_reference=True
    )
    assert patch.body() == {
        "metadata": {"annotations": {c.ANNOTATION_SANDBOX_NAME: None}, "managedFields": [{}]}
    }
    legacy = claim(
        labels={c.LABEL_SANDBOX_NAME_LEGACY: "pool-a"},
        annotations={c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT: "x"},
    )
    sb = owned_by(member("pool-a"), legacy)
    patch = decide_claim_intent(legacy, sandbox=sb, first_observed=T0, persist_observed=True)
    assert patch.body() == {
        "metadata": {
            "annotations": {c.ANNOTATION_SANDBOX_NAME: "pool-a"},
            "labels": {c.LABEL_SANDBOX_NAME_LEGACY: None},
            "managedFields": [{}],
        }
    }


def test_existing_launch_type_is_never_overwritten_and_unnetworked_binding_is_kept() -> None:
    cl = claim(status={"sandbox": {"name": "c1"}})
    sb = owned_by(member("c1", ips=(), ready=False), cl)  # named like the claim, but labelled warm
    res = resolve(snap(cl, status_sandbox=sb))
    assert isinstance(res, Bound)
    assert res.sandbox is sb
    assert res.writes == ()
