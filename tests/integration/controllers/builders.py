"""Manifests and small reads shared by the controller integration tests (one template + pool setup)."""

from __future__ import annotations

from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api.kinds import SANDBOX, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL
from agent_sandbox.api.naming import name_hash
from agent_sandbox.kube import ApiClient, Object

EXT = SANDBOX_TEMPLATE.api_version


def template_body(
    name: str = "tmpl",
    *,
    image: str = "busybox",
    labels: dict[str, str] | None = None,
    pod: dict[str, Any] | None = None,
    **spec: Any,
) -> Object:
    """A SandboxTemplate: one `main` container of `image` (or the whole pod spec `pod`), pod `labels`."""
    pod_template: dict[str, Any] = {"spec": pod or {"containers": [{"name": "main", "image": image}]}}
    if labels:
        pod_template["metadata"] = {"labels": labels}
    return {
        "apiVersion": EXT,
        "kind": SANDBOX_TEMPLATE.kind,
        "metadata": {"name": name},
        "spec": {"podTemplate": pod_template, **spec},
    }


def pool_body(
    name: str = "pool", replicas: int = 1, template: str = "tmpl", strategy: str | None = None
) -> Object:
    """A SandboxWarmPool of `replicas` members of `template` (`strategy`: spec.updateStrategy.type)."""
    spec: dict[str, Any] = {"replicas": replicas, "sandboxTemplateRef": {"name": template}}
    if strategy:
        spec["updateStrategy"] = {"type": strategy}
    return {"apiVersion": EXT, "kind": SANDBOX_WARM_POOL.kind, "metadata": {"name": name}, "spec": spec}


def claim_body(name: str, pool: str = "pool", **spec: Any) -> Object:
    """A SandboxClaim drawing from `pool`."""
    return {
        "apiVersion": EXT,
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": pool}, **spec},
    }


async def create_template_and_pool(
    kube: ApiClient,
    namespace: str,
    *,
    replicas: int,
    template: Object | None = None,
    pool: str = "pool",
    strategy: str | None = None,
) -> Object:
    """Create `template` (default: `template_body()`) and a pool of it; returns the created pool."""
    template = template or template_body()
    await kube.create(SANDBOX_TEMPLATE, template, namespace=namespace)
    body = pool_body(pool, replicas, template["metadata"]["name"], strategy)
    return await kube.create(SANDBOX_WARM_POOL, body, namespace=namespace)


async def pool_members(kube: ApiClient, namespace: str, pool: str = "pool") -> list[Object]:
    """Every Sandbox carrying the pool's `warm-pool-sandbox` label (members, and ones claimed away)."""
    return await kube.list(
        SANDBOX, namespace=namespace, label_selector={c.LABEL_WARM_POOL_SANDBOX: name_hash(pool)}
    )
