"""Object builders and a small in-memory harness for the claim controller's unit tests.

`World` runs the real `ClaimReconciler` against `kube.testing.FakeClient` (the project's in-memory API
double) with a store that mirrors the fake synchronously; `lag()` freezes that mirror to simulate an
informer that has not caught up yet. Pool members are fed to the warm queue through the real
`WarmQueueFeeder`, as the Sandbox informer would.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.controllers.claim.observability import ClaimMetrics, ObservedTimes
from agent_sandbox.controllers.claim.queue import WarmQueue
from agent_sandbox.controllers.claim.reconciler import ClaimConfig, ClaimReconciler
from agent_sandbox.controllers.claim.store import Freshest
from agent_sandbox.controllers.claim.watches import WarmQueueFeeder
from agent_sandbox.controllers.indexes import INDEX_SANDBOX_CLAIM_UID, sandbox_claim_uid_index
from agent_sandbox.kube import (
    NETWORK_POLICY,
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    Object,
    Request,
    ResourceKind,
    Result,
    ServerError,
)
from agent_sandbox.kube.metrics import REGISTRY
from agent_sandbox.kube.testing import FakeClient

NS = "ns"
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
POOL_UID = "pool-uid-1"


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def template(name: str = "tmpl", *, ns: str = NS, **spec: Any) -> Object:
    body: dict[str, Any] = {
        "podTemplate": {
            "metadata": {"labels": {"app": "demo"}, "annotations": {"team": "x"}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        }
    }
    body.update(spec)
    return {"metadata": {"name": name, "namespace": ns, "uid": f"{name}-uid"}, "spec": body}


def pool(
    name: str = "pool", *, tmpl: str = "tmpl", ns: str = NS, uid: str = POOL_UID, strategy: str | None = None
) -> Object:
    spec: dict[str, Any] = {"replicas": 3, "sandboxTemplateRef": {"name": tmpl}}
    if strategy:
        spec["updateStrategy"] = {"type": strategy}
    return {"metadata": {"name": name, "namespace": ns, "uid": uid}, "spec": spec}


def claim(
    name: str = "c1",
    *,
    pool_name: str = "pool",
    ns: str = NS,
    uid: str | None = None,
    created: datetime = T0,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> Object:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": uid or f"{name}-uid",
        "creationTimestamp": ts(created),
        "generation": 1,
    }
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    body: dict[str, Any] = {"metadata": meta, "spec": {"warmPoolRef": {"name": pool_name}, **spec}}
    if status:
        body["status"] = status
    return body


def ready_cond(
    status: str = "True", reason: str = c.REASON_DEPENDENCIES_READY, at: datetime = T0
) -> dict[str, Any]:
    return {"type": "Ready", "status": status, "reason": reason, "message": "m", "lastTransitionTime": ts(at)}


def member(
    name: str,
    *,
    pool_name: str = "pool",
    pool_uid: str = POOL_UID,
    ns: str = NS,
    ready: bool = True,
    ips: tuple[str, ...] = ("10.0.0.1",),
    node: str = "",
    tmpl: str = "tmpl",
    template_hash: str | None = None,
    created: datetime = T0 - timedelta(minutes=1),
    pod_annotations: dict[str, str] | None = None,
    owner_kind: str = c.KIND_SANDBOX_WARM_POOL,
    controller: bool = True,
    spec: dict[str, Any] | None = None,
) -> Object:
    """A warm pool member as the pool controller builds it (§3.8), with a Sandbox-controller status."""
    labels = {
        c.LABEL_WARM_POOL_SANDBOX: naming.name_hash(pool_name),
        c.LABEL_SANDBOX_TEMPLATE_REF_HASH: naming.name_hash(tmpl),
        c.LABEL_LAUNCH_TYPE: c.LAUNCH_TYPE_WARM,
        c.LABEL_CREATED_BY: c.CREATED_BY_CONTROLLER,
        c.LABEL_SANDBOX_POD_TEMPLATE_HASH: "aaaa0000",
        c.LABEL_SANDBOX_TEMPLATE_HASH: template_hash or "bbbb0000",
    }
    pod_meta = {
        "labels": {"app": "demo", **{k: v for k, v in labels.items() if k != c.LABEL_LAUNCH_TYPE}},
        "annotations": {"team": "x", c.ANNOTATION_SAFE_TO_EVICT: "true", **(pod_annotations or {})},
    }
    status: dict[str, Any] = {"conditions": [ready_cond("True" if ready else "False")]}
    if ips:
        status["podIPs"] = list(ips)
    if node:
        status["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"{name}-uid",
            "creationTimestamp": ts(created),
            "labels": labels,
            "annotations": {c.ANNOTATION_SANDBOX_TEMPLATE_REF: tmpl},
            "ownerReferences": [
                {
                    "apiVersion": c.EXTENSIONS_API_VERSION,
                    "kind": owner_kind,
                    "name": pool_name,
                    "uid": pool_uid,
                    "controller": controller,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec
        or {
            "podTemplate": {
                "metadata": pod_meta,
                "spec": {
                    "containers": [{"name": "main", "image": "busybox"}],
                    "automountServiceAccountToken": False,
                    "dnsPolicy": "None",
                    "dnsConfig": {"nameservers": ["8.8.8.8", "1.1.1.1"]},
                },
            }
        },
        "status": status,
    }


class MirrorStore:
    """`Store` reading the FakeClient directly (a cache with zero lag), or a frozen copy during `lag()`."""

    def __init__(self, fake: FakeClient) -> None:
        self.fake = fake
        self.frozen: dict[ResourceKind, list[Object]] | None = None

    def _objects(self, kind: ResourceKind) -> list[Object]:
        if self.frozen is not None:
            return self.frozen.get(kind, [])
        return self.fake.objects(kind)

    def get(self, kind: ResourceKind, namespace: str, name: str) -> Object | None:
        for obj in self._objects(kind):
            meta = obj["metadata"]
            if meta["name"] == name and meta.get("namespace", "") == namespace:
                return obj
        return None

    def by_index(self, kind: ResourceKind, index: str, value: str, namespace: str) -> list[Object]:
        assert (kind, index) == (SANDBOX, INDEX_SANDBOX_CLAIM_UID), (kind, index)
        return [
            o
            for o in self._objects(kind)
            if o["metadata"].get("namespace") == namespace and value in sandbox_claim_uid_index(o)
        ]

    def freeze(self) -> None:
        kinds = (SANDBOX, SANDBOX_CLAIM, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, NETWORK_POLICY)
        self.frozen = {k: self.fake.objects(k) for k in kinds}


@dataclass
class Recorder:
    events: list[tuple[str, str, str, str]] = field(default_factory=list)

    def event(self, regarding: Object, type_: str, reason: str, action: str, note: str) -> None:
        self.events.append((regarding["metadata"]["name"], reason, action, note))


class World:
    """A claim reconciler over an in-memory API; see the module docstring."""

    def __init__(self, *objects: tuple[ResourceKind, Object], config: ClaimConfig | None = None) -> None:
        self.fake = FakeClient(*objects)
        self.fake.add_index(SANDBOX, INDEX_SANDBOX_CLAIM_UID, sandbox_claim_uid_index)
        self.store = MirrorStore(self.fake)
        self.queue = WarmQueue()
        self.fresh = Freshest()
        self.observed = ObservedTimes()
        self.events = Recorder()
        self.now = T0 + timedelta(milliseconds=300)
        self.woken: list[object] = []
        self.reconciler = ClaimReconciler(
            store=self.store,
            api=self.fake,  # type: ignore[arg-type]
            authoritative=self.fake,  # type: ignore[arg-type]
            queue=self.queue,
            observed=self.observed,
            fresh=self.fresh,
            events=self.events,  # type: ignore[arg-type]
            metrics=ClaimMetrics(),
            config=config or ClaimConfig(),
            now=lambda: self.now,
        )
        self.feeder = WarmQueueFeeder(self.queue, self.fresh, self.woken.append)
        self.feed()

    def feed(self) -> None:
        """Replay every Sandbox as an informer add (idempotent for keys already queued)."""
        for sb in self.fake.objects(SANDBOX):
            self.feeder.on_add(sb)

    async def reconcile(self, name: str = "c1", ns: str = NS) -> Result:
        return await self.reconciler.reconcile(Request(ns, name))

    @contextlib.contextmanager
    def lag(self) -> Iterator[None]:
        """Reads see the state as of now until the block ends (writes still go through)."""
        self.store.freeze()
        try:
            yield
        finally:
            self.store.frozen = None

    def get(self, kind: ResourceKind, name: str, ns: str = NS) -> Object:
        obj = self.store.get(kind, ns, name)
        assert obj is not None, f"{kind.kind} {name} not found"
        return obj

    def find(self, kind: ResourceKind, name: str, ns: str = NS) -> Object | None:
        return MirrorStore(self.fake).get(kind, ns, name)

    def writes(self) -> list[tuple[str, str, str | None]]:
        """(verb, kind, name) of every mutating call so far."""
        return [
            (v, k, n) for v, k, _ns, n in self.fake.actions if v in ("create", "update", "patch", "delete")
        ]

    def clear_actions(self) -> None:
        self.fake.actions.clear()


def claim_ready(obj: Object) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond["type"] == "Ready":
            found: dict[str, Any] = cond
            return found
    return None


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def standard(
    *members: Object, tmpl: Object | None = None, pl: Object | None = None
) -> list[tuple[ResourceKind, Object]]:
    """Template + pool + members, ready to pass to `World`."""
    objs: list[tuple[ResourceKind, Object]] = [
        (SANDBOX_TEMPLATE, tmpl or template()),
        (SANDBOX_WARM_POOL, pl or pool()),
    ]
    objs.extend((SANDBOX, copy.deepcopy(m)) for m in members)
    return objs


def is_first_ready_stamp(kind: Any, body: Any, **kw: Any) -> bool:
    """Whether a patch call is the claim's post-Ready `claim-first-ready-at` stamp."""
    if kind is not SANDBOX_CLAIM or kw.get("subresource") is not None or not isinstance(body, dict):
        return False
    return c.ANNOTATION_CLAIM_FIRST_READY_AT in ((body.get("metadata") or {}).get("annotations") or {})


def fail_metadata_once(world: World) -> None:
    """Make the next first-ready stamp (a claim metadata patch after the status write) fail once with a 500."""
    real = world.fake.patch
    failed = False

    async def patch(kind: Any, name: str, body: Any, **kw: Any) -> Any:
        nonlocal failed
        if not failed and is_first_ready_stamp(kind, body, **kw):
            failed = True
            raise ServerError(500, "InternalError", "stamp failed")
        return await real(kind, name, body, **kw)

    world.fake.patch = patch  # type: ignore[method-assign]
