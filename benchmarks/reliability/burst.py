"""Claim bursts that keep going while the control plane misbehaves.

Owns: creating the template, pool and claims of one burst with retries across API outages (an API server
or etcd restart makes requests fail with connection errors, 5xx or 429 for seconds), and waiting until a
namespace has settled (every claim Ready, the pool whole again) by polling lists, which survive restarts
where a watch would need care.

A create whose response was lost may have been applied: a retry that answers AlreadyExists counts as
created (the object is there, exactly once, because names are unique).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import controller_ref
from agent_sandbox.kube import (
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    AlreadyExists,
    ApiClient,
    KubeError,
    Object,
    ServerError,
    TooManyRequests,
    TransportError,
)

__all__ = [
    "EXT",
    "Burst",
    "Settled",
    "claim_body",
    "create_claims",
    "create_template_and_pool",
    "is_ready",
    "retrying",
    "settle",
]

T = TypeVar("T")
EXT = f"{c.EXTENSIONS_GROUP}/v1beta1"
_TRANSIENT = (TransportError, ServerError, TooManyRequests)


def is_ready(obj: Object) -> bool:
    return any(
        cd.get("type") == "Ready" and cd.get("status") == "True"
        for cd in (obj.get("status") or {}).get("conditions") or ()
    )


async def retrying(call: Callable[[], Awaitable[T]], *, within: float = 120.0, what: str = "request") -> T:
    """Run an API call, retrying transient failures (connection errors, 5xx, 429) for `within` seconds."""
    deadline = time.monotonic() + within
    delay = 0.1
    while True:
        try:
            return await call()
        except _TRANSIENT as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: still failing after {within:.0f}s: {exc}") from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


def template_body(name: str = "tmpl", pod_spec: dict[str, Any] | None = None) -> Object:
    spec = pod_spec or {"containers": [{"name": "main", "image": "busybox"}]}
    return {
        "apiVersion": EXT,
        "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": spec}},
    }


async def create_template_and_pool(
    api: ApiClient,
    namespace: str,
    replicas: int,
    *,
    pool: str = "pool",
    template: str = "tmpl",
    pod_spec: dict[str, Any] | None = None,
) -> None:
    """A template and a pool of `replicas` members of it (retried across outages)."""
    await _create(api, SANDBOX_TEMPLATE, template_body(template, pod_spec), namespace)
    body = {
        "apiVersion": EXT,
        "kind": "SandboxWarmPool",
        "metadata": {"name": pool},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}},
    }
    await _create(api, SANDBOX_WARM_POOL, body, namespace)


def claim_body(name: str, pool: str = "pool") -> Object:
    return {
        "apiVersion": EXT,
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": pool}},
    }


async def _create(api: ApiClient, kind: Any, body: Object, namespace: str) -> bool:
    """Create, retrying transient failures; True if this call created it, False if it already existed."""

    async def once() -> bool:
        try:
            await api.create(kind, body, namespace=namespace)
        except AlreadyExists:
            return False
        return True

    return await retrying(once, what=f"create {kind.kind} {body['metadata']['name']}")


@dataclass
class Burst:
    """When each claim of a burst was sent, and how many creates had to be retried."""

    namespace: str
    sent: dict[str, float] = field(default_factory=dict)  # claim -> epoch seconds of the first attempt
    already_existed: int = 0  # creates whose retry found the object (the lost response had applied)


async def create_claims(
    api: ApiClient,
    namespace: str,
    names: Sequence[str],
    *,
    pool: str = "pool",
    concurrency: int = 50,
    burst: Burst | None = None,
) -> Burst:
    """Create one claim per name (at most `concurrency` in flight), retrying across outages."""
    out = burst or Burst(namespace)
    gate = asyncio.Semaphore(concurrency)

    async def one(name: str) -> None:
        async with gate:
            out.sent.setdefault(name, time.time())
            if not await _create(api, SANDBOX_CLAIM, claim_body(name, pool), namespace):
                out.already_existed += 1

    await asyncio.gather(*(one(n) for n in names))
    return out


@dataclass(frozen=True)
class Settled:
    """A namespace after its burst: every claim and Sandbox, and when the wait ended."""

    claims: list[Object]
    sandboxes: list[Object]
    at: float  # epoch seconds
    complete: bool  # every claim Ready and the pool whole again


async def _lists(api: ApiClient, namespace: str) -> tuple[list[Object], list[Object]]:
    claims = await retrying(lambda: api.list(SANDBOX_CLAIM, namespace=namespace), what="list claims")
    sandboxes = await retrying(lambda: api.list(SANDBOX, namespace=namespace), what="list sandboxes")
    return claims, sandboxes


def pool_ready_members(sandboxes: Sequence[Object], pool: str = "pool") -> int:
    """Sandboxes controlled by the pool and Ready."""
    count = 0
    for sb in sandboxes:
        ref = controller_ref(sb["metadata"])
        if (
            ref is not None
            and ref.get("kind") == "SandboxWarmPool"
            and ref.get("name") == pool
            and is_ready(sb)
        ):
            count += 1
    return count


async def settle(
    api: ApiClient,
    namespace: str,
    *,
    claims: int,
    replicas: int,
    within: float,
    pool: str = "pool",
    interval: float = 1.0,
) -> Settled:
    """Poll until `claims` claims are Ready and the pool has `replicas` Ready members (or `within` passes)."""
    deadline = time.monotonic() + within
    while True:
        got_claims, sandboxes = await _lists(api, namespace)
        done = (
            len(got_claims) == claims
            and all(is_ready(cl) for cl in got_claims)
            and pool_ready_members(sandboxes, pool) >= replicas
        )
        if done or time.monotonic() > deadline:
            return Settled(got_claims, sandboxes, time.time(), done)
        await asyncio.sleep(interval)


async def ready_count(api: ApiClient, namespace: str) -> int:
    """How many claims in the namespace are Ready (0 while the API is unreachable)."""
    return (await ready_counts(api, namespace, ()))[0]


async def ready_counts(api: ApiClient, namespace: str, names: Sequence[str]) -> tuple[int, int]:
    """Ready claims in the namespace, and how many of them are among `names`, from one list (0, 0 on error)."""
    try:
        listed = await api.list(SANDBOX_CLAIM, namespace=namespace)
    except KubeError:
        return 0, 0
    ready = [cl["metadata"]["name"] for cl in listed if is_ready(cl)]
    wanted = set(names)
    return len(ready), sum(1 for name in ready if name in wanted)
