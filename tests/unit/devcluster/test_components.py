"""Component command lines: loopback-only listeners, RBAC on, benchmark knobs reach the flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_sandbox.devcluster import components
from agent_sandbox.devcluster.binaries import Binaries
from agent_sandbox.devcluster.certs import write_cluster_pki
from agent_sandbox.devcluster.config import ClusterConfig

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> components.Layout:
    d = tmp_path_factory.mktemp("cluster")
    ports = dict(etcd_client=1, etcd_peer=2, apiserver=3, controller_manager=4, scheduler=5, kwok=6)
    pki = write_cluster_pki(d / "pki", service_ip="10.96.0.1")
    return components.Layout(d, ports, Binaries(Path("/bin-dir")), pki, "127.42.0.0/16")


def test_every_listener_binds_loopback(layout: components.Layout) -> None:
    cfg = ClusterConfig()
    argvs = [
        components.etcd_argv(layout, cfg),
        components.apiserver_argv(layout, cfg),
        components.controller_manager_argv(layout, cfg),
        components.scheduler_argv(layout),
        components.kwok_argv(layout),
    ]
    for argv in argvs:
        for arg in argv:
            if "://" in arg and "urls=" in arg and arg.split("=", 1)[1]:
                assert "127.0.0.1" in arg, arg
            if arg.startswith("--bind-address="):
                assert arg == "--bind-address=127.0.0.1"
    assert "--cidr=127.42.0.0/16" in components.kwok_argv(layout)


def test_apiserver_runs_rbac_and_the_configured_inflight_limits(layout: components.Layout) -> None:
    argv = components.apiserver_argv(
        layout, ClusterConfig(max_requests_inflight=2000, max_mutating_requests_inflight=1000)
    )
    assert "--authorization-mode=Node,RBAC" in argv
    assert "--max-requests-inflight=2000" in argv
    assert "--max-mutating-requests-inflight=1000" in argv


def test_etcd_fsync_knob(layout: components.Layout) -> None:
    assert "--unsafe-no-fsync" in components.etcd_argv(layout, ClusterConfig(etcd_unsafe_no_fsync=True))
    assert "--unsafe-no-fsync" not in components.etcd_argv(layout, ClusterConfig(etcd_unsafe_no_fsync=False))


def test_audit_log_flags_only_when_asked(layout: components.Layout) -> None:
    assert not [a for a in components.apiserver_argv(layout, ClusterConfig()) if a.startswith("--audit")]
    argv = components.apiserver_argv(layout, ClusterConfig(audit_log=True))
    assert f"--audit-policy-file={layout.directory / components.AUDIT_POLICY}" in argv
    assert f"--audit-log-path={layout.directory / 'logs' / components.AUDIT_LOG}" in argv
    # No rotation: 0 would mean the writer's default, 100 MB, and the reader follows one file.
    assert "--audit-log-maxsize=1000000" in argv
    assert "--audit-log-mode=blocking" in argv  # batch mode drops events under load: counts would lie


def test_extra_apiserver_flags_come_last_so_they_win(layout: components.Layout) -> None:
    flag = "--feature-gates=ListFromCacheSnapshot=false"
    assert flag not in components.apiserver_argv(layout, ClusterConfig())
    argv = components.apiserver_argv(layout, ClusterConfig(apiserver_extra_args=(flag, "--v=2")))
    assert argv[-2:] == [flag, "--v=2"]  # after the built-in --v=1: pflag keeps the last value
