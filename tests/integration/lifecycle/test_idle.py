"""Idle auto-suspend on the real control plane: the real controller (`--sandbox-lifecycle`), real runtimes.

A Sandbox (or its template) with `lifecycle.agents.x-k8s.io/idle-timeout` is suspended once nothing used it
for that long, recording why; traffic straight to the pod (bypassing any router) and a running command keep
it Running, because the controller asks the runtime before suspending. Sandboxes that did not ask are never
touched, and a bad setting is reported as a Warning Event naming the annotation.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import EVENT, SANDBOX, SANDBOX_TEMPLATE, ApiClient, Object
from tests.helpers import controller_metrics, eventually
from tests.integration.devcluster.runtime_helpers import RUNTIME_IMAGE
from tests.integration.lifecycle.helpers import execute, get_or_none, ready_ip, runtime_template

pytestmark = pytest.mark.integration


def runtime_sandbox(name: str, annotations: dict[str, str] | None = None, **meta: Any) -> Object:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name, "annotations": annotations or {}, **meta},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "runtime", "image": RUNTIME_IMAGE}]}}},
    }


def mode(sb: Object | None) -> str:
    return str(((sb or {}).get("spec") or {}).get("operatingMode") or "Running")


async def suspended(kube: ApiClient, ns: str, name: str, within: float = 60) -> Object:
    async def probe() -> Object | None:
        sb = await get_or_none(kube, SANDBOX, name, ns)
        return sb if mode(sb) == "Suspended" else None

    return await eventually(probe, f"{name} suspended", within=within)


async def test_idle_sandbox_is_suspended_with_the_reason(
    kube: ApiClient, namespace: str, controller: Started, cluster: DevCluster
) -> None:
    await kube.create(
        SANDBOX, runtime_sandbox("idle", {lc.ANNOTATION_IDLE_TIMEOUT: "3s"}), namespace=namespace
    )
    await kube.create(SANDBOX, runtime_sandbox("untouched"), namespace=namespace)
    await ready_ip(kube, namespace, "idle")
    start = time.monotonic()
    sb = await suspended(kube, namespace, "idle")
    assert time.monotonic() - start >= 1.0  # not before its timeout (it became Ready just now)
    ann = sb["metadata"]["annotations"]
    assert ann[lc.ANNOTATION_SUSPEND_REASON] == "Idle"
    assert lc.ANNOTATION_SUSPENDED_AT in ann

    async def event() -> Object | None:
        for ev in await kube.list(EVENT, namespace=namespace):
            if (ev.get("regarding") or {}).get("name") == "idle" and ev.get("reason") == "Suspended":
                return ev
        return None

    assert "without activity" in (await eventually(event, "a Suspended event"))["note"]
    assert 'agent_sandbox_lifecycle_suspends_total{cause="Idle"}' in controller_metrics(cluster)
    assert mode(await kube.get(SANDBOX, "untouched", namespace=namespace)) == "Running"


async def test_traffic_that_bypasses_the_router_and_running_commands_keep_it_running(
    kube: ApiClient, namespace: str, controller: Started, http: aiohttp.ClientSession
) -> None:
    await kube.create(
        SANDBOX, runtime_sandbox("busy", {lc.ANNOTATION_IDLE_TIMEOUT: "3s"}), namespace=namespace
    )
    ip = await ready_ip(kube, namespace, "busy")
    # Direct requests to the pod (no router, no activity annotation) for twice the timeout.
    for _ in range(6):
        await execute(http, ip, "true")
        await asyncio.sleep(1)
    assert mode(await kube.get(SANDBOX, "busy", namespace=namespace)) == "Running"
    # One long command, no requests at all: still busy.
    body = orjson.dumps({"command": "sleep 7"})
    async with http.post(f"http://{ip}:8888/execute", data=body) as resp:
        assert resp.status == 200
    assert mode(await kube.get(SANDBOX, "busy", namespace=namespace)) == "Running"
    sb = await suspended(kube, namespace, "busy", within=30)
    assert sb["metadata"]["annotations"][lc.ANNOTATION_SUSPEND_REASON] == "Idle"


async def test_template_setting_applies_and_bad_values_are_reported(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    template = runtime_template("idle-tmpl", annotations={lc.ANNOTATION_IDLE_TIMEOUT: "2s"})
    await kube.create(SANDBOX_TEMPLATE, template, namespace=namespace)
    body = runtime_sandbox("from-template", annotations={"agents.x-k8s.io/sandbox-template-ref": "idle-tmpl"})
    await kube.create(SANDBOX, body, namespace=namespace)
    await suspended(kube, namespace, "from-template")

    await kube.create(
        SANDBOX, runtime_sandbox("bad", {lc.ANNOTATION_IDLE_TIMEOUT: "ten minutes"}), namespace=namespace
    )

    async def warning() -> Object | None:
        for ev in await kube.list(EVENT, namespace=namespace):
            if (ev.get("regarding") or {}).get("name") == "bad" and ev.get(
                "reason"
            ) == "InvalidLifecycleSettings":
                return ev
        return None

    ev = await eventually(warning, "an InvalidLifecycleSettings event")
    assert ev["type"] == "Warning"
    assert 'lifecycle.agents.x-k8s.io/idle-timeout="ten minutes"' in ev["note"]
    assert mode(await kube.get(SANDBOX, "bad", namespace=namespace)) == "Running"
