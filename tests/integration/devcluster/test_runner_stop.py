"""Stopping the dev cluster's local runner: a second SIGTERM (or Ctrl-C) exits at once, leaving no command.

Runs on the fault cluster (the runner is stopped and started again there), never on the shared `cluster`.
Until December 7 both signals cancelled the runner's task: the second one interrupted the first one's drain
in the middle (the control listener and HTTP session were never closed, asyncio logged
`_GatheringFuture exception was never retrieved` and `Unclosed client session`), and the process still took
2.5 s to go.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import urllib.request
from pathlib import Path

import aiohttp
import orjson
import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started, is_ours, stop
from agent_sandbox.kube import POD, ApiClient, NotFound
from tests.helpers import eventually
from tests.integration.devcluster.runtime_helpers import runtime_pod_spec

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("faults")]

ERRORS = ("never retrieved", "Unclosed client session", "Unclosed connector", "Traceback")


def _runner(cluster: DevCluster) -> Started:
    return next(s for s in reversed(cluster.state.started) if s.name == "runner")


def _commands(marker: str) -> list[int]:
    """PIDs of live processes whose command line contains `marker`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


async def _pod_ip(kube: ApiClient, ns: str, name: str) -> str | None:
    try:
        pod = await kube.get(POD, name, namespace=ns)
    except NotFound:
        return None
    status = pod.get("status") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or ())
    return str(status["podIP"]) if ready and status.get("podIP") else None


@pytest.mark.parametrize("signals", [1, 2])
async def test_sigterm_drains_the_runtimes_and_a_second_one_exits_at_once(
    fault_cluster: DevCluster, fault_namespace: str, fault_kube: ApiClient, signals: int
) -> None:
    """One SIGTERM: every runtime drains (the command that ignores SIGTERM is killed after the 1 s grace and
    its request answered), then the runner exits. Two: the runner kills every command and exits at once."""
    cluster, ns = fault_cluster, fault_namespace
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rt"}, "spec": runtime_pod_spec()}
    await fault_kube.create(POD, pod, namespace=ns)
    ip = await eventually(lambda: _pod_ip(fault_kube, ns, "rt"), "runtime pod Ready with an IP", within=90)
    runner = _runner(cluster)
    assert is_ours(runner.pid, runner.exe)
    log_start = runner.log.stat().st_size
    # A command that ignores SIGTERM: only the SIGKILL after the drain's grace (1 s) would end it.
    marker = f"{random.randrange(10**8, 10**9)}"
    command = f"sh -c 'trap \"\" TERM; exec sleep {marker}'"

    async def execute() -> bytes:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
            http.post(f"http://{ip}:8888/execute", data=orjson.dumps({"command": command})) as resp,
        ):
            return await resp.read()

    request = asyncio.create_task(execute())
    try:
        await eventually(lambda: asyncio.to_thread(_commands, f"sleep {marker}"), "the command running")
        os.kill(runner.pid, signal.SIGTERM)
        if signals == 2:
            await asyncio.sleep(0.2)
            os.kill(runner.pid, signal.SIGTERM)
        last = time.monotonic()
        while is_ours(runner.pid, runner.exe) and time.monotonic() - last < 15:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        elapsed = time.monotonic() - last
        stop(runner, grace=0)  # reaps it (the test process started the cluster)
        await asyncio.sleep(0.2)
        left = await asyncio.to_thread(_commands, f"sleep {marker}")
        answer = (await asyncio.gather(asyncio.wait_for(request, 10), return_exceptions=True))[0]
    finally:
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
        if not is_ours(runner.pid, runner.exe):  # the fault cluster's other tests need a runner
            cluster.respawn("runner")
            port = cluster.state.ports["runner"]
            await eventually(lambda: asyncio.to_thread(_healthy, port), "the runner serving again")
    log = runner.log.read_bytes()[log_start:].decode(errors="replace")
    assert not left, f"commands left running after the runner exited: {left}"
    assert not [e for e in ERRORS if e in log], log[-3000:]
    if signals == 1:
        assert isinstance(answer, bytes), answer  # answered: the command was killed after the grace
        assert orjson.loads(answer)["exit_code"] == -9
        assert elapsed < 10, f"the runner exited {elapsed:.2f} s after SIGTERM\n{log[-3000:]}"
    else:
        assert elapsed < 1.5, f"the runner exited {elapsed:.2f} s after the second SIGTERM\n{log[-3000:]}"
        assert "received SIGTERM again: killing every command and exiting now" in log, log[-3000:]
