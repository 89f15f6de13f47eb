"""SandboxTemplate reconciler against the in-memory FakeClient (controllers spec §2, §6.2)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api.naming import template_ref_hash
from agent_sandbox.controllers.template import ForeignPolicyError, TemplateReconciler
from agent_sandbox.kube import NETWORK_POLICY, SANDBOX_TEMPLATE, Forbidden, Object, Request, Result
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

REQ = Request("ns", "tmpl")


def template_obj(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "tmpl", "namespace": "ns"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}}, **spec},
    }


async def test_first_pass_stamps_label_and_creates_policy_second_pass_writes_nothing() -> None:
    fake = FakeClient((SANDBOX_TEMPLATE, template_obj()))
    rec = TemplateReconciler(fake)
    assert await rec.reconcile(REQ) == Result()
    tmpl = await fake.get(SANDBOX_TEMPLATE, "tmpl", namespace="ns")
    assert tmpl["metadata"]["labels"][c.LABEL_SANDBOX_TEMPLATE_REF_HASH] == template_ref_hash("tmpl")
    pol = await fake.get(NETWORK_POLICY, "tmpl-network-policy", namespace="ns")
    assert pol["metadata"]["ownerReferences"][0]["uid"] == tmpl["metadata"]["uid"]
    rv_tmpl, rv_pol = tmpl["metadata"]["resourceVersion"], pol["metadata"]["resourceVersion"]

    writes_before = [a for a in fake.actions if a[0] in ("create", "update", "patch", "delete")]
    assert await rec.reconcile(REQ) == Result()
    writes_after = [a for a in fake.actions if a[0] in ("create", "update", "patch", "delete")]
    assert writes_after == writes_before
    assert (await fake.get(SANDBOX_TEMPLATE, "tmpl", namespace="ns"))["metadata"][
        "resourceVersion"
    ] == rv_tmpl
    assert (await fake.get(NETWORK_POLICY, "tmpl-network-policy", namespace="ns"))["metadata"][
        "resourceVersion"
    ] == rv_pol


async def test_drift_is_repaired_then_unmanaged_deletes_the_owned_policy() -> None:
    fake = FakeClient((SANDBOX_TEMPLATE, template_obj()))
    rec = TemplateReconciler(fake)
    await rec.reconcile(REQ)
    await fake.patch(NETWORK_POLICY, "tmpl-network-policy", {"spec": {"egress": []}}, namespace="ns")
    await rec.reconcile(REQ)
    pol = await fake.get(NETWORK_POLICY, "tmpl-network-policy", namespace="ns")
    assert pol["spec"]["egress"][0]["to"][0]["ipBlock"]["cidr"] == "0.0.0.0/0"

    await fake.patch(
        SANDBOX_TEMPLATE, "tmpl", {"spec": {"networkPolicyManagement": "Unmanaged"}}, namespace="ns"
    )
    await rec.reconcile(REQ)
    assert fake.objects(NETWORK_POLICY) == []


async def test_foreign_policy_is_never_touched_and_the_pass_fails() -> None:
    foreign = {"metadata": {"name": "tmpl-network-policy", "namespace": "ns"}, "spec": {"podSelector": {}}}
    fake = FakeClient((SANDBOX_TEMPLATE, template_obj()), (NETWORK_POLICY, foreign))
    rec = TemplateReconciler(fake)
    with pytest.raises(ForeignPolicyError):
        await rec.reconcile(REQ)
    (pol,) = fake.objects(NETWORK_POLICY)
    assert pol["spec"] == {"podSelector": {}}
    # Unmanaged: a foreign policy is left alone without an error.
    await fake.patch(
        SANDBOX_TEMPLATE, "tmpl", {"spec": {"networkPolicyManagement": "Unmanaged"}}, namespace="ns"
    )
    assert await rec.reconcile(REQ) == Result()
    assert len(fake.objects(NETWORK_POLICY)) == 1


async def test_missing_template_is_done() -> None:
    fake = FakeClient()
    assert await TemplateReconciler(fake).reconcile(REQ) == Result()
    assert [a for a in fake.actions if a[0] != "get"] == []


class RecordedEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str, str]] = []

    def event(self, regarding: Object, type_: str, reason: str, action: str, note: str) -> None:
        self.events.append((regarding["metadata"]["name"], type_, reason, action, note))


async def test_a_policy_create_the_api_server_refuses_is_a_warning_event_on_the_template() -> None:
    """warmpool-quirks.md #14: a refused NetworkPolicy create (quota, admission) is a `FailedCreate` Warning.

    Upstream emits no Events here (§2); its Sandboxes then run without their default-deny policy unseen.
    """
    quota = Forbidden(
        403,
        "Forbidden",
        'networkpolicies.networking.k8s.io "tmpl-network-policy" is forbidden: exceeded quota: q, '
        "requested: count/networkpolicies.networking.k8s.io=1, used: count/networkpolicies.networking.k8s.io=0, "
        "limited: count/networkpolicies.networking.k8s.io=0",
    )
    fake = FakeClient((SANDBOX_TEMPLATE, template_obj()))
    fake.inject_error("create", quota, kind=NETWORK_POLICY)
    events = RecordedEvents()
    rec = TemplateReconciler(fake, events=events)
    with pytest.raises(Forbidden):  # still retried with backoff (§2)
        await rec.reconcile(REQ)
    assert events.events == [
        (
            "tmpl",
            "Warning",
            c.EVENT_FAILED_CREATE,
            "Creating",
            "failed to create NetworkPolicy tmpl-network-policy: networkpolicies.networking.k8s.io "
            '"tmpl-network-policy" is forbidden: exceeded quota: q, requested: '
            "count/networkpolicies.networking.k8s.io=1, used: count/networkpolicies.networking.k8s.io=0, "
            "limited: count/networkpolicies.networking.k8s.io=0",
        )
    ]
    await rec.reconcile(REQ)  # admitted now: created, nothing more to say
    assert len(fake.objects(NETWORK_POLICY)) == 1
    assert len(events.events) == 1


async def test_a_policy_create_refused_in_a_terminating_namespace_is_no_event() -> None:
    from tests.unit.kube.test_namespace_terminating import terminating

    fake = FakeClient((SANDBOX_TEMPLATE, template_obj()))
    fake.inject_error(
        "create", terminating("tmpl-network-policy", "ns", "networkpolicies"), kind=NETWORK_POLICY
    )
    events = RecordedEvents()
    assert await TemplateReconciler(fake, events=events).reconcile(REQ) == Result()
    assert events.events == []
