"""The local runner gives a runtime the Secrets and ConfigMaps its container's environment names, as a kubelet
does (devcluster/pod_env.py), on the real control plane with the real controller: `envFrom` a Secret, a
`configMapKeyRef`, `$(VAR)` in `args` expanded with the result; a Secret that does not exist yet keeps the
container from starting (CreateContainerConfigError on the pod, a `Failed` Event) until it is created. Until
December 7 the runner left all of these out: the sandbox ran without its API key, silently."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import CONFIG_MAP, EVENT, POD, SANDBOX, SECRET, ApiClient, NotFound
from tests.helpers import eventually
from tests.integration.devcluster.runtime_helpers import runtime_pod_spec
from tests.integration.devcluster.test_runner import execute, ready_sandbox_ip, sandbox

pytestmark = pytest.mark.integration


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


def _secret(name: str, **data: str) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}


def _agent_spec(secret: str) -> dict[str, Any]:
    return runtime_pod_spec(
        # read as runtime flags once expanded: /v1/metadata then serves the APP_* variables
        args=["--metadata-env-prefix=$(META_PREFIX)"],
        envFrom=[{"secretRef": {"name": secret}}],
        env=[
            {"name": "MODEL", "valueFrom": {"configMapKeyRef": {"name": "agent-cfg", "key": "model"}}},
            {"name": "META_PREFIX", "valueFrom": {"configMapKeyRef": {"name": "agent-cfg", "key": "prefix"}}},
            {"name": "APP_ENDPOINT", "value": "https://llm.example/$(MODEL)"},
        ],
    )


async def test_secret_env_from_config_map_key_and_args_expansion(
    kube: ApiClient, namespace: str, controller: Started, http: aiohttp.ClientSession
) -> None:
    await kube.create(SECRET, _secret("agent-creds", API_KEY="sk-test-123"), namespace=namespace)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "agent-cfg"}}
    await kube.create(CONFIG_MAP, {**config, "data": {"model": "m1", "prefix": "APP_"}}, namespace=namespace)
    await kube.create(SANDBOX, sandbox("agent", _agent_spec("agent-creds")), namespace=namespace)
    ip = await ready_sandbox_ip(kube, namespace, "agent")

    out = await execute(http, ip, "sh -c 'echo \"key=$API_KEY model=$MODEL endpoint=$APP_ENDPOINT\"'")
    assert out["stdout"] == "key=sk-test-123 model=m1 endpoint=https://llm.example/m1\n", out
    async with http.get(f"http://{ip}:8080/v1/metadata") as resp:
        assert await resp.json() == {"env": {"APP_ENDPOINT": "https://llm.example/m1"}}


async def test_a_missing_secret_keeps_the_container_waiting_until_it_exists(
    kube: ApiClient, namespace: str, controller: Started, http: aiohttp.ClientSession
) -> None:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "agent-cfg"}}
    await kube.create(CONFIG_MAP, {**config, "data": {"model": "m2", "prefix": "APP_"}}, namespace=namespace)
    await kube.create(SANDBOX, sandbox("late", _agent_spec("late-creds")), namespace=namespace)

    async def waiting() -> dict[str, Any] | None:
        try:
            pod = await kube.get(POD, "late", namespace=namespace)
        except NotFound:
            return None
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            state = (status.get("state") or {}).get("waiting")
            if state and state.get("reason") == "CreateContainerConfigError":
                return {"state": state, "status": status, "pod": pod}
        return None

    found = await eventually(waiting, "the pod's container waiting with CreateContainerConfigError")
    assert found["state"]["message"] == 'secret "late-creds" not found'
    assert found["status"]["ready"] is False
    assert "running" not in found["status"]["state"]
    conditions = {c["type"]: c for c in found["pod"]["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "False"

    async def failed_event() -> dict[str, Any] | None:
        for event in await kube.list(EVENT, namespace=namespace):
            if (event.get("regarding") or {}).get("name") == "late" and event.get("reason") == "Failed":
                return event
        return None

    event = await eventually(failed_event, "a Failed Event on the pod")
    assert (event["type"], event["note"]) == ("Warning", 'Error: secret "late-creds" not found')

    # The kubelet retries: once the Secret exists the container starts, with it.
    await kube.create(SECRET, _secret("late-creds", API_KEY="sk-late"), namespace=namespace)
    ip = await ready_sandbox_ip(kube, namespace, "late")
    out = await execute(http, ip, "sh -c 'echo \"$API_KEY $MODEL\"'")
    assert out["stdout"] == "sk-late m2\n", out
    pod = await kube.get(POD, "late", namespace=namespace)
    states = [s["state"] for s in pod["status"]["containerStatuses"]]
    assert [list(s) for s in states] == [["running"]]


async def test_a_restarted_container_reads_its_config_map_and_secret_again(
    kube: ApiClient, namespace: str, controller: Started, cluster: DevCluster, http: aiohttp.ClientSession
) -> None:
    """A kubelet builds a container's environment at every start: a Secret or ConfigMap changed while the
    runtime ran is not seen by it, and is seen once its container restarts (until December 7 the runner read
    them once per pod, and a crashed runtime came back with the old values)."""
    await kube.create(SECRET, _secret("rotating", API_KEY="sk-old"), namespace=namespace)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "agent-cfg"}}
    await kube.create(CONFIG_MAP, {**config, "data": {"model": "m1", "prefix": "APP_"}}, namespace=namespace)
    await kube.create(SANDBOX, sandbox("rot", _agent_spec("rotating")), namespace=namespace)
    ip = await ready_sandbox_ip(kube, namespace, "rot")
    show = "sh -c 'echo \"$API_KEY $MODEL\"'"
    assert (await execute(http, ip, show))["stdout"] == "sk-old m1\n"

    await kube.patch(
        SECRET, "rotating", {"data": _secret("rotating", API_KEY="sk-new")["data"]}, namespace=namespace
    )
    await kube.patch(CONFIG_MAP, "agent-cfg", {"data": {"model": "m2"}}, namespace=namespace)
    assert (await execute(http, ip, show))["stdout"] == "sk-old m1\n"  # the running container keeps its own

    cluster.crash_runtime(namespace, "rot")

    async def restarted() -> bool:
        pod = await kube.get(POD, "rot", namespace=namespace)
        ready = next((c["status"] for c in pod["status"]["conditions"] if c["type"] == "Ready"), None)
        return (ready, pod["status"]["containerStatuses"][0].get("restartCount", 0)) == ("True", 1)

    await eventually(restarted, "the crashed runtime's pod Ready again with restartCount 1", within=30)
    assert (await execute(http, ip, show))["stdout"] == "sk-new m2\n"
