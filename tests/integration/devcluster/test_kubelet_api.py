"""Runtime pods' kubelet API on the dev cluster (devcluster/kubelet_api.py): container logs written by the
runner, served by kwok, read through the API server's `pods/log` as `kubectl logs` reads them; `kubectl
port-forward` to a runtime pod's port. (The SDKs' pod tunnel modes: tests/integration/sdk/test_engines.py,
test_runner_sdk.py, the Go SDK's e2e suite.)"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.kubelet_api import LOGS, PORT_FORWARD
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import POD, SANDBOX, ApiClient, ApiError, NotFound
from tests.helpers import eventually
from tests.integration.devcluster.runtime_helpers import runtime_pod_spec

pytestmark = pytest.mark.integration


async def _log(kube: ApiClient, ns: str, pod: str, query: str = "") -> str:
    return (await kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}/log", query=query)).decode()


async def _log_once_served(kube: ApiClient, ns: str, pod: str) -> str | None:
    """The log, or None while there is none yet (400 "no logs found" until the runner publishes it)."""
    try:
        return await _log(kube, ns, pod)
    except ApiError as err:
        if err.status in (400, 404):
            return None
        raise


async def _restarts(kube: ApiClient, ns: str, pod: str) -> int:
    status = (await kube.get(POD, pod, namespace=ns)).get("status") or {}
    return int(((status.get("containerStatuses") or [{}])[0]).get("restartCount", 0))


async def test_kubectl_logs_shows_what_the_runtime_logged_and_previous_after_a_crash(
    kube: ApiClient, namespace: str, cluster: DevCluster
) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rt"}, "spec": runtime_pod_spec()}
    await kube.create(POD, pod, namespace=namespace)

    async def served() -> str | None:
        runtimes = [r for r in cluster.runtimes() if r["namespace"] == namespace and r["ready"]]
        return runtimes[0]["ip"] if runtimes else None

    ip = await eventually(served, "the runner serving the pod's runtime")
    first = await eventually(lambda: _log_once_served(kube, namespace, "rt"), "a container log")
    assert (
        f"INFO agent_sandbox.runtime.server: serving /workspace on {ip}: legacy 8888, rest 8080, grpc 9090"
        in first
    )
    assert first.count("\n") == 1  # only what the runtime logged for this pod, not for the runner's others
    with pytest.raises(ApiError) as no_previous:  # no previous instance yet: 400, as from a kubelet
        await _log(kube, namespace, "rt", "previous=true")
    assert no_previous.value.status == 400

    cluster.crash_runtime(namespace, "rt")

    async def previous_instance() -> str | None:
        if await _restarts(kube, namespace, "rt") != 1:
            return None
        try:  # kwok reads the runner's updated Logs object through its informer: a moment later
            return await _log(kube, namespace, "rt", "previous=true")
        except ApiError as err:
            if err.status == 400:
                return None
            raise

    previous = await eventually(previous_instance, "restartCount 1 and the previous instance's log")
    assert previous.startswith(first)  # the first instance's file, ended by its drain
    assert "INFO agent_sandbox.runtime.server: draining (shutdown timeout 0.0s)" in previous.splitlines()[-1]
    current = await _log(kube, namespace, "rt", "tailLines=1&timestamps=true")
    assert current.count("\n") == 1
    assert "serving /workspace" in current
    assert current[:4].isdigit()  # timestamps=true: the CRI line's time first

    files = (
        cluster.pod_logs
        / f"{namespace}_rt_{(await kube.get(POD, 'rt', namespace=namespace))['metadata']['uid']}"
    )
    assert sorted(p.name for p in (files / "runtime").iterdir()) == ["0.log", "1.log"]
    await kube.delete(POD, "rt", namespace=namespace, grace_period_seconds=0)

    async def gone() -> bool:
        for kind in (LOGS, PORT_FORWARD):
            try:
                await kube.get(kind, "rt", namespace=namespace)
                return False
            except NotFound:
                pass
        return not await asyncio.to_thread(files.exists)

    await eventually(
        gone, "Logs, PortForward (owned by the pod) and the log files removed with it", within=90
    )


async def test_a_sandbox_pods_log_is_its_runtimes(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    sandbox = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "sb"},
        "spec": {"podTemplate": {"spec": runtime_pod_spec()}},
    }
    await kube.create(SANDBOX, sandbox, namespace=namespace)
    text = await eventually(
        lambda: _log_once_served(kube, namespace, "sb"), "the Sandbox pod's log", within=90
    )
    assert "agent_sandbox.runtime.server: serving /workspace on 127." in text


async def test_kubectl_port_forward_reaches_the_runtime_on_the_pod(
    kube: ApiClient, namespace: str, cluster: DevCluster
) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pf"}, "spec": runtime_pod_spec()}
    await kube.create(POD, pod, namespace=namespace)

    async def ready() -> bool:  # as a user waits (`kubectl wait --for=condition=Ready`)
        conditions = ((await kube.get(POD, "pf", namespace=namespace)).get("status") or {}).get("conditions")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions or ())

    await eventually(ready, "the runtime pod Ready")
    argv = [str(cluster.binaries.path("kubectl")), f"--kubeconfig={cluster.kubeconfig}", "-n", namespace]
    forward = await asyncio.create_subprocess_exec(
        *argv, "port-forward", "pod/pf", ":8888", ":4321", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert forward.stdout is not None
        ports: dict[int, int] = {}
        while len(ports) < 2:  # "Forwarding from 127.0.0.1:<local> -> <remote>"
            line = (await asyncio.wait_for(forward.stdout.readline(), 30)).decode()
            assert line, "kubectl port-forward exited"
            if line.startswith("Forwarding from 127.0.0.1:"):
                local, remote = line.split("127.0.0.1:", 1)[1].split(" -> ")
                ports[int(remote)] = int(local)
        async with aiohttp.ClientSession() as http:
            body = {"command": "echo through the API server"}
            async with http.post(f"http://127.0.0.1:{ports[8888]}/execute", json=body) as resp:
                assert resp.status == 200
                assert (await resp.json())["stdout"] == "through the API server\n"
            # a port the runtime does not serve: kwok has no forward for it, the connection ends at once
            with pytest.raises(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{ports[4321]}/") as resp:
                    await resp.read()
    finally:
        # The failed forward to 4321 makes kubectl exit on its own ("error: lost connection to pod", seen in CI),
        # so it may be gone already.
        if forward.returncode is None:
            forward.terminate()
        await forward.wait()
