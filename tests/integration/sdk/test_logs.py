"""`follow_logs` (`agent-sandbox logs -f`, as `kubectl logs -f`): the runtime pod's log as it is written, through
the real API server and the dev cluster's kubelet API (kwok serves the CRI log file the runner keeps).

The test plays the container writing to its stdout by appending a CRI line to that file, which is what a
container runtime does; everything from the file to the SDK is the real path."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.kubelet_api import cri_line
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import (
    AsyncSandboxClient,
    Sandbox,
    SandboxClient,
    SandboxDirectConnectionConfig,
    SandboxRequestError,
)
from tests.helpers import signals_as_from_a_shell, wait_for

from .conftest import RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _log_file(cluster: DevCluster, namespace: str, pod: str) -> Path | None:
    status, obj = cluster.admin().request(
        "GET", f"/apis/kwok.x-k8s.io/v1alpha1/namespaces/{namespace}/logs/{pod}"
    )
    return Path(obj["spec"]["logs"][0]["logsFile"]) if status == 200 else None


def _runtime_sandbox(
    cluster: DevCluster, namespace: str, client: SandboxClient, replicas: int
) -> tuple[Sandbox, Path]:
    """A sandbox of a runtime pool, and the log file its container writes (what kwok serves)."""
    apply_pool(
        cluster, namespace, replicas=replicas, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}]
    )
    sandbox = client.create_sandbox("pool", namespace)
    path = wait_for(lambda: _log_file(cluster, namespace, sandbox.get_pod_name()), what="the pod's Logs")
    return sandbox, path


def _client(cluster: DevCluster, router: str) -> SandboxClient:
    return SandboxClient(SandboxDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig)


def _write(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(cri_line(text, stream="stdout"))


def test_follow_logs_streams_what_the_container_writes(
    cluster: DevCluster, namespace: str, controller: Started, router: str
) -> None:
    config = SandboxDirectConnectionConfig(api_url=router)
    with SandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox, path = _runtime_sandbox(cluster, namespace, client, replicas=2)
        follow = sandbox.follow_logs(tail_lines=1)
        assert "INFO agent_sandbox.runtime.server: serving /" in next(follow)  # the existing last line
        _write(path, "written after the follow began: é")
        got = ""
        while "written after the follow began: é\n" not in got:
            got += next(follow)
        follow.close()  # stops reading; the stream is released
        with pytest.raises(SandboxRequestError, match="400") as refused:
            next(sandbox.follow_logs(container="no-such-container"))
        assert "no-such-container" in str(refused.value)

    async def follow_async() -> str:
        async with AsyncSandboxClient(config, kubeconfig=cluster.kubeconfig) as aclient:
            handle = await aclient.create_sandbox("pool", namespace)
            pod = await handle.get_pod_name()
            apath = wait_for(lambda: _log_file(cluster, namespace, pod), what="the pod's Logs")
            text = ""
            async with asyncio.timeout(60):
                async for chunk in handle.follow_logs():
                    text += chunk
                    if "serving /" in text and "async line" not in text:
                        _write(apath, "async line")
                    if "async line\n" in text:
                        break
            return text

    assert "async line\n" in asyncio.run(follow_async())


def test_cli_logs_follow_until_ctrl_c(
    cluster: DevCluster, namespace: str, controller: Started, router: str
) -> None:
    with _client(cluster, router) as client:
        sandbox, path = _runtime_sandbox(cluster, namespace, client, replicas=1)
        cli = str(Path(sys.executable).with_name("agent-sandbox"))
        argv = [cli, "logs", "-f", "--tail", "1", sandbox.claim_name or "", "-n", namespace]
        proc = subprocess.Popen(
            [*argv, "--kubeconfig", str(cluster.kubeconfig), "--router-url", router],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # As from a shell: pytest-xdist's workers ignore SIGINT, and a Python started with it ignored
            # keeps ignoring it (no KeyboardInterrupt), so the CLI would never see the Ctrl-C.
            preexec_fn=signals_as_from_a_shell,
        )
        try:
            assert proc.stdout is not None
            assert "serving /" in proc.stdout.readline()
            _write(path, "a line for the CLI")
            assert proc.stdout.readline() == "a line for the CLI\n"  # printed as it arrives, not at exit
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 130
            assert proc.stderr is not None
            assert "Traceback" not in proc.stderr.read()
        finally:
            proc.kill()
            proc.wait()


def test_the_log_before_the_last_restart(
    cluster: DevCluster, namespace: str, controller: Started, router: str
) -> None:
    """`get_logs(previous=True)` / `agent-sandbox logs -p` (`kubectl logs -p`): why did the runtime restart?"""
    with _client(cluster, router) as client:
        sandbox, _ = _runtime_sandbox(cluster, namespace, client, replicas=1)
        with pytest.raises(SandboxRequestError, match="400"):  # no restart yet, as a kubelet answers
            sandbox.get_logs(previous=True)
        first = sandbox.get_logs()
        cluster.crash_runtime(namespace, sandbox.get_pod_name())

        def previous() -> str | None:
            try:
                return sandbox.get_logs(previous=True)
            except SandboxRequestError:
                return None  # not restarted yet, or kwok has not read the new Logs object

        before = wait_for(previous, timeout=60, what="the previous container's log")
        assert before.startswith(first)
        assert "draining" in before.splitlines()[-1]  # the first instance's end

        cli = str(Path(sys.executable).with_name("agent-sandbox"))
        common = ["-n", namespace, "--kubeconfig", str(cluster.kubeconfig), "--router-url", router]
        out = subprocess.run(
            [cli, "logs", "-p", sandbox.claim_name or "", *common], capture_output=True, text=True, timeout=60
        )
        assert (out.returncode, out.stdout) == (0, before)
        both = subprocess.run(
            [cli, "logs", "-p", "-f", sandbox.claim_name or "", *common],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert both.returncode == 2
        assert "cannot be combined" in both.stderr
