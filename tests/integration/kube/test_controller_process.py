"""The `agent-sandbox-controller` process: probes, metrics, clean SIGTERM, flag errors, leader hand-over."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import install_crds
from agent_sandbox.devcluster.identity import controller_kubeconfig, grant_leader_election
from tests.helpers import listen_port, wait_for

pytestmark = pytest.mark.integration

LEASE_METRIC = 'leader_election_master_status{name="a3317529.agent-sandbox.x-k8s.io"}'


class Proc:
    def __init__(self, kubeconfig: Path, *flags: str, log: Path) -> None:
        self.metrics = listen_port()
        self.health = listen_port()
        self.log = log
        argv = [
            sys.executable,
            "-m",
            "agent_sandbox.controllers.main",
            f"--kubeconfig={kubeconfig}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics}",
            f"--health-probe-bind-address=127.0.0.1:{self.health}",
            # The conversion webhook has its own tests; here the process shape is under test.
            "--enable-webhook=false",
            *flags,
        ]
        self._out = log.open("w")
        self.popen = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT)

    def get(self, port: int, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""

    def metric(self, line_prefix: str) -> float | None:
        status, body = self.get(self.metrics, "/metrics")
        if status != 200:
            return None
        for line in body.splitlines():
            if line.startswith(line_prefix + " "):
                return float(line.split()[-1])
        return None

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        code = self.popen.wait(timeout=60)
        self._out.close()
        return code

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=30)
        self._out.close()


@pytest.fixture(scope="module")
def crds(cluster: DevCluster) -> None:
    """The project's CRDs: the registered controllers' informers need them to sync."""
    install_crds(cluster)


@pytest.fixture
def procs(cluster: DevCluster, namespace: str, crds: None) -> Iterator[list[Proc]]:
    # The install grants Leases only in its own namespace; these replicas elect in the test's (docs/install.md).
    grant_leader_election(cluster, namespace)
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


def test_serves_probes_and_metrics_and_exits_0_on_sigterm(
    cluster: DevCluster, namespace: str, procs: list[Proc], tmp_path: Path
) -> None:
    p = Proc(
        controller_kubeconfig(cluster),
        f"--leader-election-namespace={namespace}",
        "--extensions",
        log=tmp_path / "ctrl.log",
    )
    procs.append(p)
    wait_for(lambda: p.get(p.health, "/healthz") == (200, "ok"), what="/healthz")
    assert p.get(p.health, "/readyz") == (200, "ok")
    wait_for(lambda: p.metric(LEASE_METRIC) == 1.0, what="leadership")
    status, body = p.get(p.metrics, "/metrics")
    assert status == 200
    assert "agent_sandbox_build_info{" in body
    assert "rest_client_requests_total{" in body
    for controller in ("sandbox", "sandboxclaim", "sandboxtemplate", "sandboxwarmpool"):
        assert f'controller_runtime_max_concurrent_reconciles{{controller="{controller}"}}' in body
    assert "process_cpu_seconds_total" in body
    assert p.get(p.metrics, "/debug/pprof/profile")[0] == 404  # pprof off by default
    assert p.stop() == 0, p.log.read_text()
    assert "received SIGTERM" in p.log.read_text()


def test_invalid_flags_exit_non_zero_naming_the_flag(cluster: DevCluster, tmp_path: Path) -> None:
    cases = {
        "--sandbox-warm-pool-max-refill-rate=NaN": (1, "--sandbox-warm-pool-max-refill-rate"),
        "--api-connections=0": (1, "--api-connections"),
        "--kube-api-qps=fast": (2, "-kube-api-qps"),
        "--no-such-flag": (2, "-no-such-flag"),
    }
    for flag, (code, name) in cases.items():
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agent_sandbox.controllers.main",
                f"--kubeconfig={cluster.kubeconfig}",
                flag,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == code, (flag, proc.stderr)
        assert name in proc.stderr, (flag, proc.stderr)


def test_second_replica_takes_over_within_2s_after_graceful_stop(
    cluster: DevCluster, namespace: str, procs: list[Proc], tmp_path: Path
) -> None:
    flags = (f"--leader-election-namespace={namespace}", "--zap-log-level=debug")
    first = Proc(controller_kubeconfig(cluster), *flags, log=tmp_path / "first.log")
    procs.append(first)
    wait_for(lambda: first.metric(LEASE_METRIC) == 1.0, what="first replica leads")
    second = Proc(controller_kubeconfig(cluster), *flags, log=tmp_path / "second.log")
    procs.append(second)
    wait_for(lambda: second.metric(LEASE_METRIC) == 0.0, what="second replica standing by")
    # Probes and metrics are served by the standby too.
    assert second.get(second.health, "/readyz") == (200, "ok")

    assert first.stop() == 0, first.log.read_text()
    stopped_at = time.monotonic()
    wait_for(lambda: second.metric(LEASE_METRIC) == 1.0, what="second replica leads", interval=0.02)
    handover = time.monotonic() - stopped_at
    assert handover <= 2.0, f"hand-over took {handover:.2f}s"
    assert second.stop() == 0
