"""A claim deleted while its warm takeover is in flight, on a real control plane (probe fleet11).

The controllers run in this process (a manager caching only the test's namespace, as in
tests/integration/controllers/sandbox/test_controller.py), so the window is made exact rather than raced for:
the claim's intent patch - sent alongside the takeover - first deletes the claim, then goes out and is
answered NotFound by the API server. kube-controller-manager's garbage collector plays its real part.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.context import ControllerContext
from agent_sandbox.controllers.main import SETUPS, setup_controllers
from agent_sandbox.controllers.options import Options
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import install_crds
from agent_sandbox.devcluster.identity import controller_kubeconfig
from agent_sandbox.kube import (
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_WARM_POOL,
    ApiClient,
    CacheOptions,
    Manager,
    ManagerOptions,
    NotFound,
)
from tests import helpers
from tests.integration.controllers.builders import claim_body, create_template_and_pool, pool_members

pytestmark = pytest.mark.integration

eventually = functools.partial(helpers.eventually, within=60.0)
ERRORS = "controller_runtime_reconcile_errors_total"


@pytest.fixture(scope="module")
def crds(cluster: DevCluster) -> None:
    install_crds(cluster)


@pytest.fixture
async def controller_api(cluster: DevCluster, crds: None) -> AsyncIterator[ApiClient]:
    api = await ApiClient.from_kubeconfig(str(controller_kubeconfig(cluster)))
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
async def manager(controller_api: ApiClient, namespace: str) -> AsyncIterator[Manager]:
    """Sandbox, warm pool and claim controllers in this process, caching only `namespace`."""
    options = ManagerOptions(
        metrics_bind_address="0",
        health_probe_bind_address="0",
        cache=CacheOptions(namespace=namespace),
        registry=CollectorRegistry(),
    )
    mgr = Manager(controller_api, options)
    wanted = {"sandbox", "sandboxwarmpool", "sandboxclaim"}
    setups = [s for s in SETUPS if s.name in wanted]
    setup_controllers(mgr, ControllerContext(Options(extensions=True, cluster_domain="test.local")), setups)
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.start(stop))
    try:
        await asyncio.wait_for(mgr.elected.wait(), 60)
        yield mgr
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def test_a_claim_deleted_during_its_takeover_is_no_error_and_its_member_is_collected(
    kube: ApiClient,
    controller_api: ApiClient,
    namespace: str,
    manager: Manager,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ns = namespace
    await create_template_and_pool(kube, ns, replicas=1)

    async def one_ready_member() -> str | None:
        pool = await kube.get(SANDBOX_WARM_POOL, "pool", namespace=ns)
        members = await pool_members(kube, ns)
        if (pool.get("status") or {}).get("readyReplicas") == 1 and len(members) == 1:
            return str(members[0]["metadata"]["name"])
        return None

    member = await eventually(one_ready_member, "the pool's member Ready")
    errors_before = REGISTRY.get_sample_value(ERRORS, {"controller": "sandboxclaim"}) or 0.0

    real_patch = controller_api.patch
    deleted = asyncio.Event()

    async def patch(kind: Any, name: str, body: Any, **kw: Any) -> Any:
        annotations = (
            ((body.get("metadata") or {}).get("annotations") or {}) if isinstance(body, dict) else {}
        )
        is_intent = (
            kind is SANDBOX_CLAIM
            and kw.get("subresource") is None
            and c.ANNOTATION_SANDBOX_NAME in annotations
        )
        if is_intent and not deleted.is_set():
            await kube.delete(SANDBOX_CLAIM, name, namespace=ns)  # the adoption window, held open
            deleted.set()
        return await real_patch(kind, name, body, **kw)

    controller_api.patch = patch  # type: ignore[method-assign]
    caplog.set_level(logging.INFO)
    await kube.create(SANDBOX_CLAIM, claim_body("c1"), namespace=ns)
    await asyncio.wait_for(deleted.wait(), 60)

    async def member_collected() -> bool:
        try:
            sb = await kube.get(SANDBOX, member, namespace=ns)
        except NotFound:
            return True
        ref = next((r for r in sb["metadata"].get("ownerReferences") or [] if r.get("controller")), {})
        assert ref.get("kind") in (c.KIND_SANDBOX_WARM_POOL, c.KIND_SANDBOX_CLAIM), ref
        return False

    # The takeover went through: the member is the dead claim's, and garbage collection deletes it.
    await eventually(member_collected, "the member owned by the deleted claim to be garbage-collected")
    await eventually(one_ready_member, "the pool refilled")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    assert (REGISTRY.get_sample_value(ERRORS, {"controller": "sandboxclaim"}) or 0.0) == errors_before
