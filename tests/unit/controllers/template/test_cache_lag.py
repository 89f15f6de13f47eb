"""SandboxTemplate reconciler vs. a cache that has not caught up with its own writes (controllers spec §2).

The FakeClient is both the cache and the API server here; an injected NotFound on a policy `get` is the
informer that has not delivered the policy yet. A real-control-plane counterpart (reconcile error metric
stays 0): tests/integration/controllers/template/test_cache_lag.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent_sandbox.controllers.template import TemplateReconciler
from agent_sandbox.controllers.template.reconciler import CACHE_LAG_REQUEUE
from agent_sandbox.kube import NETWORK_POLICY, SANDBOX_TEMPLATE, Forbidden, NotFound, Request, Result
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

REQ = Request("ns", "tmpl")
POLICY = "tmpl-network-policy"


def template_obj(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "tmpl", "namespace": "ns"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}}, **spec},
    }


def policy_lags(fake: FakeClient, times: int = 1) -> None:
    """The next `times` cached reads of the policy do not show it yet."""
    fake.inject_error(
        "get", NotFound(404, "NotFound", "not in the cache yet"), kind=NETWORK_POLICY, times=times
    )


def writes(fake: FakeClient) -> list[tuple[str, str, str | None, str | None]]:
    return [a for a in fake.actions if a[0] in ("create", "update", "patch", "delete")]


async def test_the_pass_after_the_create_does_not_create_again_while_the_cache_lags() -> None:
    fake = FakeClient((SANDBOX_TEMPLATE, template_obj()))
    rec = TemplateReconciler(fake)
    assert await rec.reconcile(REQ) == Result()
    before = writes(fake)
    # The label patch's event re-queues the template before the policy's event arrived.
    policy_lags(fake)
    assert await rec.reconcile(REQ) == Result(requeue_after=CACHE_LAG_REQUEUE)
    assert writes(fake) == before
    # Once the cache shows it, the pass is a plain no-op again.
    assert await rec.reconcile(REQ) == Result()
    assert writes(fake) == before


async def test_a_create_answered_already_exists_is_a_quiet_requeue() -> None:
    """A policy the cache cannot show yet and this process did not write (a restart in between)."""
    fake = FakeClient((SANDBOX_TEMPLATE, template_obj()))
    await TemplateReconciler(fake).reconcile(REQ)
    pol = await fake.get(NETWORK_POLICY, POLICY, namespace="ns")
    restarted = TemplateReconciler(fake)
    policy_lags(fake)
    assert await restarted.reconcile(REQ) == Result(requeue_after=CACHE_LAG_REQUEUE)
    assert (await fake.get(NETWORK_POLICY, POLICY, namespace="ns")) == pol
    assert await restarted.reconcile(REQ) == Result()


async def test_an_update_from_a_stale_cached_version_is_a_quiet_requeue() -> None:
    fake = FakeClient((SANDBOX_TEMPLATE, template_obj()))
    await TemplateReconciler(fake).reconcile(REQ)
    wanted = await fake.get(NETWORK_POLICY, POLICY, namespace="ns")
    # Someone drifts the policy twice; the cache shows only the first change (older resourceVersion).
    await fake.patch(NETWORK_POLICY, POLICY, {"spec": {"egress": []}}, namespace="ns")
    first = await fake.get(NETWORK_POLICY, POLICY, namespace="ns")
    await fake.patch(NETWORK_POLICY, POLICY, {"spec": {"ingress": []}}, namespace="ns")
    cache = LaggingCache(fake)
    rec = TemplateReconciler(cache)  # type: ignore[arg-type]
    cache.serve_once(first)
    assert await rec.reconcile(REQ) == Result(requeue_after=CACHE_LAG_REQUEUE)
    # With the cache caught up the drift is repaired.
    assert await rec.reconcile(REQ) == Result()
    repaired = await fake.get(NETWORK_POLICY, POLICY, namespace="ns")
    assert (repaired["spec"]["ingress"], repaired["spec"]["egress"]) == (
        wanted["spec"]["ingress"],
        wanted["spec"]["egress"],
    )


async def test_the_answer_of_an_update_is_read_until_the_cache_shows_it() -> None:
    fake = FakeClient((SANDBOX_TEMPLATE, template_obj()))
    cache = LaggingCache(fake)
    rec = TemplateReconciler(cache)  # type: ignore[arg-type]
    await rec.reconcile(REQ)
    await fake.patch(NETWORK_POLICY, POLICY, {"spec": {"egress": []}}, namespace="ns")
    drifted = await fake.get(NETWORK_POLICY, POLICY, namespace="ns")
    assert await rec.reconcile(REQ) == Result()  # repairs the drift
    before = writes(fake)
    # The cache still shows the drifted copy; the overlay knows the repair: no second update (a 409).
    cache.serve_once(drifted)
    assert await rec.reconcile(REQ) == Result()
    assert writes(fake) == before


class LaggingCache:
    """The FakeClient, except that the next cached `get` of the policy answers an older copy."""

    def __init__(self, fake: FakeClient) -> None:
        self._fake = fake
        self._stale: dict[str, Any] | None = None

    def serve_once(self, stale: dict[str, Any]) -> None:
        self._stale = copy.deepcopy(stale)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fake, name)

    async def get(self, kind: Any, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        if self._stale is not None and kind == NETWORK_POLICY:
            stale, self._stale = self._stale, None
            return stale
        return await self._fake.get(kind, name, namespace=namespace)


async def test_a_policy_written_for_a_deleted_template_of_the_same_name_is_not_read_back() -> None:
    fake = FakeClient((SANDBOX_TEMPLATE, template_obj()))
    rec = TemplateReconciler(fake)
    await rec.reconcile(REQ)  # creates the policy; the cache (below) never shows it
    await fake.delete(SANDBOX_TEMPLATE, "tmpl", namespace="ns")  # garbage-collects the policy too
    await fake.create(SANDBOX_TEMPLATE, template_obj(), namespace="ns")
    assert fake.objects(NETWORK_POLICY) == []
    # The remembered policy names the old template as its controller: the new one gets its own.
    assert await rec.reconcile(REQ) == Result()
    (pol,) = fake.objects(NETWORK_POLICY)
    tmpl = await fake.get(SANDBOX_TEMPLATE, "tmpl", namespace="ns")
    assert pol["metadata"]["ownerReferences"][0]["uid"] == tmpl["metadata"]["uid"]


async def test_a_policy_create_refused_in_a_terminating_namespace_ends_the_pass_quietly() -> None:
    """Until December 6 a `reconciler error` (and backoff retries) until the namespace was gone."""
    from tests.unit.kube.test_namespace_terminating import rbac, terminating

    fake = FakeClient((SANDBOX_TEMPLATE, template_obj()))
    fake.inject_error(
        "create", terminating(POLICY, "ns", "networkpolicies.networking.k8s.io"), kind=NETWORK_POLICY
    )
    assert await TemplateReconciler(fake).reconcile(REQ) == Result()
    # Any other 403 (an RBAC grant missing) stays a failure.
    fake = FakeClient((SANDBOX_TEMPLATE, template_obj()))
    fake.inject_error("create", rbac(), kind=NETWORK_POLICY)
    with pytest.raises(Forbidden):
        await TemplateReconciler(fake).reconcile(REQ)
