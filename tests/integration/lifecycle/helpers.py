"""Shared by the lifecycle tests: runtime templates that opt into the lifecycle features, and small probes."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from agent_sandbox.api.lifecycle import CLAIM_ENV_FIELD_PATH
from agent_sandbox.kube import SANDBOX, ApiClient, NotFound, Object
from tests.helpers import eventually, is_ready
from tests.integration.devcluster.runtime_helpers import EXT, RUNTIME_IMAGE

CLAIM_ENV_VOLUME = {
    "name": "claim-env",
    "downwardAPI": {"items": [{"path": "claim-env", "fieldRef": {"fieldPath": CLAIM_ENV_FIELD_PATH}}]},
}
CLAIM_ENV_MOUNT = {"name": "claim-env", "mountPath": "/var/run/agent-sandbox"}


def runtime_template(
    name: str, *, claim_env: bool = False, annotations: dict[str, str] | None = None, **spec: Any
) -> Object:
    """A SandboxTemplate running the project's runtime; `claim_env` projects the claim env annotation."""
    container: dict[str, Any] = {"name": "runtime", "image": RUNTIME_IMAGE}
    pod_spec: dict[str, Any] = {"containers": [container]}
    if claim_env:
        container["volumeMounts"] = [CLAIM_ENV_MOUNT]
        pod_spec["volumes"] = [CLAIM_ENV_VOLUME]
    return {
        "apiVersion": EXT,
        "kind": "SandboxTemplate",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"podTemplate": {"spec": pod_spec}, **spec},
    }


def pool_body(name: str, template: str, replicas: int) -> Object:
    return {
        "apiVersion": EXT,
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}},
    }


def claim_body(name: str, pool: str, **spec: Any) -> Object:
    return {
        "apiVersion": EXT,
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": pool}, **spec},
    }


async def get_or_none(kube: ApiClient, kind: Any, name: str, ns: str) -> Object | None:
    try:
        return await kube.get(kind, name, namespace=ns)
    except NotFound:
        return None


async def ready_ip(kube: ApiClient, ns: str, name: str, within: float = 60) -> str:
    """The pod IP of Sandbox `name` once it is Ready."""

    async def probe() -> str | None:
        sb = await get_or_none(kube, SANDBOX, name, ns)
        ips = ((sb or {}).get("status") or {}).get("podIPs") or []
        return str(ips[0]) if sb is not None and is_ready(sb) and ips else None

    return await eventually(probe, f"Sandbox {name} Ready with a pod IP", within=within)


async def execute(http: aiohttp.ClientSession, ip: str, command: str, port: int = 8888) -> dict[str, Any]:
    """Legacy `POST /execute` straight to a pod IP (bypassing any router)."""
    async with http.post(f"http://{ip}:{port}/execute", data=orjson.dumps({"command": command})) as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


async def through(
    http: aiohttp.ClientSession,
    router: Any,
    sandbox: str,
    namespace: str,
    command: str = "sh -c 'echo $HOSTNAME'",
) -> tuple[int, Any]:
    """Legacy `POST /execute` through a router by Sandbox name: (status, JSON body)."""
    headers = {"X-Sandbox-ID": sandbox, "X-Sandbox-Namespace": namespace}
    url = f"http://127.0.0.1:{router.http_port}/execute"
    async with http.post(url, data=orjson.dumps({"command": command}), headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def router_metrics(router: Any) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{router.metrics_port}/metrics") as resp,
    ):
        return await resp.text()


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total
