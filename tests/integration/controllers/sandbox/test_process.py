"""The Sandbox controller inside the real `agent-sandbox-controller` process: restart and leader failover.

These complement `tests/integration/kube/test_controller_process.py` (probes, signals, Lease hand-over of the
bare process): here the processes reconcile Sandboxes, and the assertions are about children - a crashed
and restarted controller must not recreate or duplicate them, and after the leader is killed the other
replica takes over and keeps reconciling. Processes are started and killed by PID by the tests themselves.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.api.constants import ANNOTATION_POD_NAME
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import grant_lease_namespace, install_crds
from agent_sandbox.devcluster.identity import controller_kubeconfig
from agent_sandbox.kube import POD, PVC, SANDBOX, SERVICE, ApiClient, Object
from tests import helpers

pytestmark = pytest.mark.integration

LEASE_METRIC = 'leader_election_master_status{name="a3317529.agent-sandbox.x-k8s.io"}'
RECONCILES = 'controller_runtime_reconcile_total{controller="sandbox",result="success"}'


class Controller:
    """One `agent-sandbox-controller` process (Sandbox controller only, no webhook)."""

    def __init__(self, cluster: DevCluster, log: Path, *flags: str) -> None:
        self.metrics, self.health, self.log = helpers.listen_port(cluster), helpers.listen_port(cluster), log
        grant_lease_namespace(cluster, flags)  # the install grants Leases in its own namespace only
        argv = [
            sys.executable,
            "-m",
            "agent_sandbox.controllers.main",
            f"--kubeconfig={controller_kubeconfig(cluster)}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics}",
            f"--health-probe-bind-address=127.0.0.1:{self.health}",
            "--enable-webhook=false",
            "--sandbox-concurrent-workers=8",
            *flags,
        ]
        self._out = log.open("w")
        self.popen = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT)

    def _get(self, port: int, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except OSError:
            return 0, ""

    def ready(self) -> bool:
        return self._get(self.health, "/readyz")[0] == 200

    def metric(self, name: str) -> float | None:
        status, body = self._get(self.metrics, "/metrics")
        if status != 200:
            return None
        for line in body.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return None

    def kill(self) -> None:
        """Crash it (SIGKILL): no graceful shutdown, the Lease is not released."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=30)
        self._out.close()

    def tail(self) -> str:
        return "\n".join(self.log.read_text().splitlines()[-30:])


@pytest.fixture
def controllers(cluster: DevCluster, tmp_path: Path) -> Iterator[Callable[..., Controller]]:
    install_crds(cluster)
    started: list[Controller] = []

    def start(*flags: str) -> Controller:
        proc = Controller(cluster, tmp_path / f"controller-{len(started)}.log", *flags)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


eventually = functools.partial(helpers.eventually, within=30.0)


def _sandbox(name: str, **spec: Any) -> Object:
    vct = [
        {
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }
    ]
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {
            "podTemplate": {
                "spec": {
                    "containers": [{"name": "main", "image": "busybox", "ports": [{"containerPort": 80}]}]
                }
            },
            "service": True,
            "volumeClaimTemplates": vct,
            **spec,
        },
    }


async def _ready(kube: ApiClient, name: str, ns: str, within: float = 30.0) -> Object:
    async def probe() -> Object | None:
        sb = await kube.get(SANDBOX, name, namespace=ns)
        conds = {c["type"]: c["status"] for c in (sb.get("status") or {}).get("conditions") or ()}
        return sb if conds.get("Ready") == "True" else None

    return await eventually(probe, f"Sandbox {name} Ready", within=within)


async def _children(kube: ApiClient, ns: str) -> dict[str, list[tuple[str, str]]]:
    out = {}
    for kind in (POD, SERVICE, PVC):
        out[kind.kind] = sorted(
            (o["metadata"]["name"], o["metadata"]["uid"]) for o in await kube.list(kind, namespace=ns)
        )
    return out


async def _await_ready_process(proc: Controller) -> None:
    async def probe() -> bool:
        if proc.popen.poll() is not None:
            pytest.fail(f"controller exited with {proc.popen.returncode}:\n{proc.tail()}")
        return proc.ready()

    await eventually(probe, "controller /readyz", within=60)


async def test_restart_neither_recreates_nor_duplicates_children(
    controllers: Callable[..., Controller], kube: ApiClient, namespace: str
) -> None:
    first = controllers("--leader-elect=false")
    await _await_ready_process(first)
    await kube.create(SANDBOX, _sandbox("sb"), namespace=namespace)
    before_sb = await _ready(kube, "sb", namespace)
    before = await _children(kube, namespace)
    assert before["Pod"][0][0] == "sb"
    assert len(before["Service"]) == 1
    assert len(before["PersistentVolumeClaim"]) == 1
    pod_rv = (await kube.get(POD, "sb", namespace=namespace))["metadata"]["resourceVersion"]

    first.kill()
    second = controllers("--leader-elect=false")
    await _await_ready_process(second)

    # Barrier: the new process reconciles (its initial list enqueued "sb" too, before "sb2").
    await kube.create(SANDBOX, _sandbox("sb2"), namespace=namespace)
    await _ready(kube, "sb2", namespace)

    async def reconciled_both() -> bool:
        return (second.metric(RECONCILES) or 0) >= 2

    await eventually(reconciled_both, "two reconciles in the restarted controller")
    after = await _children(kube, namespace)
    for kind, items in before.items():
        assert [
            i for i in after[kind] if not i[0].startswith("sb2") and not i[0].endswith("-sb2")
        ] == items, kind
    pod = await kube.get(POD, "sb", namespace=namespace)
    assert pod["metadata"]["resourceVersion"] == pod_rv  # not even patched
    after_sb = await kube.get(SANDBOX, "sb", namespace=namespace)
    assert after_sb["status"] == before_sb["status"]
    assert after_sb["metadata"]["annotations"][ANNOTATION_POD_NAME] == "sb"


async def test_leader_failover_keeps_reconciling_sandboxes(
    controllers: Callable[..., Controller], kube: ApiClient, namespace: str
) -> None:
    flags = ("--leader-elect=true", f"--leader-election-namespace={namespace}")
    procs = [controllers(*flags), controllers(*flags)]
    for proc in procs:
        await _await_ready_process(proc)

    async def one_leader() -> Controller | None:
        leaders = [p for p in procs if p.metric(LEASE_METRIC) == 1.0]
        return leaders[0] if len(leaders) == 1 else None

    leader = await eventually(one_leader, "exactly one leader", within=60)
    follower = next(p for p in procs if p is not leader)
    await kube.create(SANDBOX, _sandbox("sb1"), namespace=namespace)
    await _ready(kube, "sb1", namespace)
    assert (follower.metric(RECONCILES) or 0) == 0  # the follower never reconciles

    leader.kill()
    await kube.create(SANDBOX, _sandbox("sb2"), namespace=namespace)
    # Crash failover waits for the Lease to expire (15 s) before the follower takes over.
    await _ready(kube, "sb2", namespace, within=90)
    assert follower.metric(LEASE_METRIC) == 1.0
    assert (follower.metric(RECONCILES) or 0) > 0
    children = await _children(kube, namespace)
    assert [n for n, _ in children["Pod"]] == ["sb1", "sb2"]
    assert [n for n, _ in children["Service"]] == ["sb1", "sb2"]
    assert [n for n, _ in children["PersistentVolumeClaim"]] == ["data-sb1", "data-sb2"]
