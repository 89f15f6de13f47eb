"""Grants the controller needs from its first request: an informer's list is retried (logged) until the
grant appears; the start-up CRD patch is fatal with a message naming it (as upstream: the process exits 1
and its Deployment restarts it). The controller runs as the installed ServiceAccount and is restarted with
the grant already missing, as after an upgrade that shipped stale RBAC."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import CONTROLLER
from agent_sandbox.devcluster.identity import install_controller_rbac
from agent_sandbox.devcluster.processes import Started, is_ours, stop
from agent_sandbox.devcluster.rest import probe_http
from tests.helpers import wait_for
from tests.integration.install.conftest import sa_controller
from tests.integration.install.rbac import allowed, revoke, wait_for_quietly
from tests.integration.install.test_rbac import _claim, _create, _pool, _ready, _template

pytestmark = pytest.mark.integration


@pytest.fixture
def restartable(install_cluster: DevCluster) -> Iterator[tuple[list[str], dict[str, str]]]:
    """argv and environment of a controller started as the ServiceAccount (then stopped), for restarts."""
    with sa_controller(install_cluster) as started:
        argv = Path(f"/proc/{started.pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        environ = dict(
            line.split("=", 1)
            for line in Path(f"/proc/{started.pid}/environ").read_bytes().decode().split("\0")
            if line.startswith("AGENT_SANDBOX_")
        )
        stop(started)
        yield argv, environ


def _restart(cluster: DevCluster, argv: list[str], env: dict[str, str]) -> Started:
    return cluster.add_process(f"{CONTROLLER}-restarted", argv, env=env)


def _log(started: Started) -> str:
    return started.log.read_bytes().decode(errors="replace").replace('\\"', '"')


def test_forbidden_list_is_retried_until_granted(
    install_cluster: DevCluster, install_ns: str, restartable: tuple[list[str], dict[str, str]]
) -> None:
    cluster, ns = install_cluster, install_ns
    grant = ("extensions.agents.x-k8s.io", "sandboxclaims", "list")
    revoke(cluster, (grant,))
    assert not allowed(cluster, grant, ns)
    started = _restart(cluster, *restartable)
    try:
        expect = 'cannot list resource "sandboxclaims"'
        if not wait_for_quietly(lambda: _log(started).count(expect) >= 2, timeout=60):
            pytest.fail(f"no retried {expect!r} in the controller log:\n{_log(started)[-3000:]}")
        assert is_ours(started.pid, started.exe), "the controller exited"
        for obj in (_template(), _pool(), _claim()):
            _create(cluster, ns, obj)
    finally:
        install_controller_rbac(cluster)
    try:
        wait_for(lambda: _ready(cluster, ns, "SandboxClaim", "claim"), timeout=90, what="the claim Ready")
        assert is_ours(started.pid, started.exe), "the controller exited"
    finally:
        stop(started)


def test_forbidden_crd_patch_at_startup_exits_naming_the_grant(
    install_cluster: DevCluster, restartable: tuple[list[str], dict[str, str]]
) -> None:
    cluster = install_cluster
    grant = ("apiextensions.k8s.io", "customresourcedefinitions", "patch")
    revoke(cluster, (grant,))
    assert not allowed(cluster, grant, "")
    started = _restart(cluster, *restartable)
    try:
        wait_for(lambda: not is_ours(started.pid, started.exe), timeout=60, what="the controller to exit")
        assert 'cannot patch resource "customresourcedefinitions"' in _log(started)
        health = next(a for a in restartable[0] if a.startswith("--health-probe-bind-address="))
        assert not probe_http(f"http://{health.split('=', 1)[1]}/readyz")
    finally:
        stop(started)
