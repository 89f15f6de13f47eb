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

from agent_sandbox.devcluster import ClusterConfig, DevCluster
from tests.helpers import wait_for

if TYPE_CHECKING:
    from agent_sandbox.kube import ApiClient


def _cluster_name() -> str:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return f"pytest-{worker}-{os.getpid()}"


@pytest.fixture(scope="session")
def cluster() -> Iterator[DevCluster]:
    """A running local control plane for this test worker (2 kwok nodes)."""
    nodes = int(os.environ.get("AGENT_SANDBOX_TEST_NODES", "2"))
    started = DevCluster.up(ClusterConfig(name=_cluster_name(), nodes=nodes))
    try:
        yield started
    finally:
        if os.environ.get("AGENT_SANDBOX_KEEP_CLUSTER") != "1":
            started.down(quiet=True)


@pytest.fixture
def namespace(cluster: DevCluster) -> Iterator[str]:
    """A fresh namespace (with its `default` ServiceAccount), deleted after the test."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = cluster.admin()
    status, body = admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    assert status == 201, body
    wait_for(
        lambda: admin.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200,
        what=f"default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        admin.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture(scope="session")
async def kube(cluster: DevCluster) -> AsyncIterator[ApiClient]:
    """The project's async API client, authenticated as cluster admin."""
    from agent_sandbox.kube import ApiClient

    client = await ApiClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        yield client
    finally:
        await client.close()
