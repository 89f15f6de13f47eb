"""Shared fixtures: one real local control plane per test worker, per-test namespaces, an async client.

The `cluster` fixture starts a dev cluster (etcd + kube-apiserver + kube-controller-manager + kube-scheduler +
kwok) the first time an integration or e2e test asks for it, and stops it at the end of the session. If it
cannot start, every test that needs it errors: CI fails rather than reporting success without a cluster.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from agent_sandbox.devcluster import ClusterConfig, DevCluster
from tests.helpers import wait_for

# No per-example time limit for the property tests: Hypothesis' default (200 ms) is a timed assertion, and
# on a loaded CI box an example whose first run imports a module exceeded it (December 7). Speed lives in
# benchmarks/. The profile is process-wide, so clients/python/tests collected in the same run get it too.
settings.register_profile("agent-sandbox", deadline=None)
settings.load_profile("agent-sandbox")

if TYPE_CHECKING:
    from agent_sandbox.kube import ApiClient


def _cluster_name() -> str:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return f"pytest-{worker}-{os.getpid()}"


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    """A running local control plane for this test worker (2 kwok nodes)."""
    nodes = int(os.environ.get("AGENT_SANDBOX_TEST_NODES", "2"))
    started = DevCluster.up(ClusterConfig(name=_cluster_name(), nodes=nodes))
    try:
        yield started
    finally:
        _down(started, request)


def _down(cluster: DevCluster, request: pytest.FixtureRequest) -> None:
    """Stop a session's cluster; when a test of this worker failed, keep every component's log first.

    The logs (the controller's included) go to `<cache>/failed/<cluster>-<time>/`, printed on stderr, so an
    intermittent CI failure can be read afterwards instead of only from the assertion.
    """
    if os.environ.get("AGENT_SANDBOX_KEEP_CLUSTER") == "1":
        return
    failed = request.session.testsfailed > 0
    cluster.down(quiet=not failed, keep_logs=failed)


@pytest.fixture(scope="session")
def fault_cluster(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    """A second control plane for destructive tests (component restarts, lost nodes), audit log on.

    Separate from `cluster` so a restart never disturbs other tests' clients. Modules using it carry
    `pytest.mark.xdist_group("faults")` (the suite runs with `--dist loadgroup`), so one worker hosts it.
    """
    started = DevCluster.up(ClusterConfig(name=f"{_cluster_name()}-faults", nodes=2, audit_log=True))
    try:
        yield started
    finally:
        _down(started, request)


def new_namespace(cluster: DevCluster) -> str:
    """Create a namespace (and wait for its `default` ServiceAccount); the caller deletes it."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = cluster.admin()
    status, body = admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    assert status == 201, body
    wait_for(
        lambda: admin.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200,
        what=f"default ServiceAccount in {name}",
    )
    return name


@pytest.fixture
def namespace(cluster: DevCluster) -> Iterator[str]:
    """A fresh namespace (with its `default` ServiceAccount), deleted after the test."""
    name = new_namespace(cluster)
    try:
        yield name
    finally:
        cluster.admin().request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def fault_namespace(fault_cluster: DevCluster) -> Iterator[str]:
    """`namespace`, on the fault cluster."""
    name = new_namespace(fault_cluster)
    try:
        yield name
    finally:
        fault_cluster.admin().request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture(scope="session")
async def fault_kube(fault_cluster: DevCluster) -> AsyncIterator[ApiClient]:
    """`kube`, for the fault cluster."""
    from agent_sandbox.kube import ApiClient

    client = await ApiClient.from_kubeconfig(str(fault_cluster.kubeconfig))
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture(scope="session")
async def kube(cluster: DevCluster) -> AsyncIterator[ApiClient]:
    """The project's async API client, authenticated as cluster admin."""
    from agent_sandbox.kube import ApiClient

    client = await ApiClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        yield client
    finally:
        await client.close()
