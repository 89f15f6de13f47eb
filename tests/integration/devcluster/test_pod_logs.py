"""Runtime pods' container logs on the dev cluster: written by the runner, served by kwok, read through the
API server's `pods/log` as `kubectl logs` reads them (devcluster/pod_logs.py)."""

from __future__ import annotations

import asyncio

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.pod_logs import LOGS
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
        try:
            await kube.get(LOGS, "rt", namespace=namespace)
        except NotFound:
            return not await asyncio.to_thread(files.exists)
        return False

    await eventually(
        gone, "the Logs object (owned by the pod) and the log files removed with the pod", within=90
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
