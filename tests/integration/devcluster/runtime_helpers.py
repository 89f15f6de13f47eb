"""Shared by the local-runner tests: runtime pod specs and a warm pool of runtime sandboxes."""

from __future__ import annotations

from typing import Any

from agent_sandbox.kube import SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, ApiClient

EXT = "extensions.agents.x-k8s.io/v1beta1"
RUNTIME_IMAGE = "ghcr.io/agent-sandbox/agent-sandbox-runtime:dev"


def runtime_pod_spec(**container: Any) -> dict[str, Any]:
    return {"containers": [{"name": "runtime", "image": RUNTIME_IMAGE, **container}]}


async def create_runtime_pool(kube: ApiClient, namespace: str, *, replicas: int, name: str = "pool") -> None:
    """A SandboxTemplate `rt` with the runtime image and a warm pool of it."""
    template = {
        "apiVersion": EXT,
        "kind": "SandboxTemplate",
        "metadata": {"name": "rt"},
        "spec": {"podTemplate": {"spec": runtime_pod_spec()}},
    }
    pool = {
        "apiVersion": EXT,
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "rt"}},
    }
    await kube.create(SANDBOX_TEMPLATE, template, namespace=namespace)
    await kube.create(SANDBOX_WARM_POOL, pool, namespace=namespace)
