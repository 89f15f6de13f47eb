"""The informer cache: one informer per kind, created lazily, read through the `IndexedReader` protocol.

Owns: per-kind cache options (label/field selector scoping such as `--cache-label-selectors`, transforms
such as the Pod diet of controllers spec §1.1; managedFields are stripped by default, §5.5), the
informer registry, starting informers (also ones first requested after start), waiting for sync, and
`CachedClient` - the manager's default client that reads from the cache and writes to the API server.

Does not own: list/watch mechanics (`_informer`) or HTTP (`_client`).

Failure modes: reads of a kind whose informer has not synced yet wait for it; `get` of an unknown key
raises `NotFound` exactly like the API server. Objects returned are shared with the store: read-only.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Sequence
from dataclasses import dataclass, field

from ._client import ApiClient
from ._clock import REAL_CLOCK, Clock
from ._informer import IndexFunc, Informer, Transform, strip_managed_fields
from ._protocols import ListWatcher
from ._resources import ResourceKind
from ._types import LabelSelector, Object, PatchType, PropagationPolicy
from .errors import NotFound

__all__ = ["Cache", "CacheOptions", "CachedClient", "KindOptions"]

DEFAULT_RESYNC = 10 * 3600.0
"""controller-runtime's default informer resync period (10 h, controllers spec §0.5)."""


@dataclass(frozen=True, slots=True)
class KindOptions:
    """Per-kind cache scoping.

    Attributes:
        label_selector: server-side label selector for list/watch (e.g. "agents.x-k8s.io/sandbox-name-hash").
        field_selector: server-side field selector.
        namespace: watch one namespace only (None: all).
        transform: replaces the default transform (which only strips managedFields).
    """

    label_selector: LabelSelector | None = None
    field_selector: str | None = None
    namespace: str | None = None
    transform: Transform | None = strip_managed_fields


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """Cache-wide options; `by_kind` overrides the defaults for individual kinds."""

    by_kind: dict[ResourceKind, KindOptions] = field(default_factory=dict)
    namespace: str | None = None
    resync_period: float | None = DEFAULT_RESYNC


class Cache:
    """Lazily created informers behind a read-only client interface (implements `IndexedReader`)."""

    def __init__(
        self, lw: ListWatcher, options: CacheOptions | None = None, *, clock: Clock = REAL_CLOCK
    ) -> None:
        self._lw = lw
        self._options = options or CacheOptions()
        self._clock = clock
        self._informers: dict[ResourceKind, Informer] = {}
        self._tg: asyncio.TaskGroup | None = None

    def set_kind_options(self, kind: ResourceKind, options: KindOptions) -> None:
        """Set scoping for `kind`; must happen before its informer is created.

        Raises:
            RuntimeError: the informer already exists.
        """
        if kind in self._informers:
            raise RuntimeError(f"informer for {kind.kind} already created; set options earlier")
        self._options.by_kind[kind] = options

    def informer(self, kind: ResourceKind) -> Informer:
        """The informer of `kind`, created (and started, if the cache runs) on first request."""
        inf = self._informers.get(kind)
        if inf is None:
            opts = self._options.by_kind.get(kind, KindOptions())
            inf = Informer(
                self._lw,
                kind,
                namespace=opts.namespace or self._options.namespace,
                label_selector=opts.label_selector,
                field_selector=opts.field_selector,
                transform=opts.transform,
                resync_period=self._options.resync_period,
                clock=self._clock,
            )
            self._informers[kind] = inf
            if self._tg is not None:
                self._tg.create_task(inf.run(), name=f"informer-{kind.plural}")
        return inf

    @property
    def informers(self) -> dict[ResourceKind, Informer]:
        return dict(self._informers)

    def add_index(self, kind: ResourceKind, name: str, fn: IndexFunc) -> None:
        """Register a field index on `kind` (controller-runtime `IndexField`)."""
        self.informer(kind).add_index(name, fn)

    # ------------------------------------------------------------------ lifecycle

    @property
    def started(self) -> bool:
        return self._tg is not None

    async def start(self) -> None:
        """Run every informer (including ones created later) until cancelled.

        Informers run in this method's TaskGroup, so an informer crashing on a bug fails the cache (and
        the manager) instead of silently going stale.
        """
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                for kind, inf in self._informers.items():
                    tg.create_task(inf.run(), name=f"informer-{kind.plural}")
                await asyncio.Event().wait()
        finally:
            self._tg = None

    async def wait_for_sync(self) -> None:
        """Wait until every informer created so far has synced (bound it with `asyncio.timeout`)."""
        for inf in list(self._informers.values()):
            await inf.wait_for_sync()

    # ------------------------------------------------------------------ IndexedReader

    async def _synced(self, kind: ResourceKind) -> Informer:
        inf = self.informer(kind)
        if not inf.has_synced:
            await inf.wait_for_sync()
        return inf

    async def get(self, kind: ResourceKind, name: str, *, namespace: str | None = None) -> Object:
        """Cached object; raises `NotFound` if absent from the cache."""
        inf = await self._synced(kind)
        obj = inf.get(f"{namespace}/{name}" if namespace and kind.namespaced else name)
        if obj is None:
            raise NotFound(404, "NotFound", f'{kind.plural} "{name}" not found')
        return obj

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        field_selector: str | None = None,
    ) -> list[Object]:
        """Cached objects; field selectors support only `metadata.name`/`metadata.namespace` equality."""
        inf = await self._synced(kind)
        objs = inf.list(namespace, label_selector)
        if field_selector:
            objs = _field_filter(objs, field_selector)
        return objs

    async def list_by_index(
        self, kind: ResourceKind, index: str, value: str, *, namespace: str | None = None
    ) -> builtins.list[Object]:
        inf = await self._synced(kind)
        return inf.by_index(index, value, namespace)


def _field_filter(objs: list[Object], selector: str) -> list[Object]:
    wanted = {}
    for part in selector.split(","):
        key, _, value = part.replace("==", "=").partition("=")
        if key not in ("metadata.name", "metadata.namespace"):
            raise ValueError(f"cache field selector supports metadata.name/namespace only, not {key!r}")
        wanted[key.split(".")[1]] = value
    return [o for o in objs if all(o["metadata"].get(k, "") == v for k, v in wanted.items())]


class CachedClient:
    """Reads from the cache, writes to the API server (implements `Client` and `IndexedReader`)."""

    def __init__(self, cache: Cache, api: ApiClient) -> None:
        self.cache = cache
        self.api = api

    async def get(self, kind: ResourceKind, name: str, *, namespace: str | None = None) -> Object:
        return await self.cache.get(kind, name, namespace=namespace)

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        field_selector: str | None = None,
    ) -> list[Object]:
        return await self.cache.list(
            kind, namespace=namespace, label_selector=label_selector, field_selector=field_selector
        )

    async def list_by_index(
        self, kind: ResourceKind, index: str, value: str, *, namespace: str | None = None
    ) -> builtins.list[Object]:
        return await self.cache.list_by_index(kind, index, value, namespace=namespace)

    async def create(self, kind: ResourceKind, obj: Object, *, namespace: str | None = None) -> Object:
        return await self.api.create(kind, obj, namespace=namespace)

    async def update(self, kind: ResourceKind, obj: Object) -> Object:
        return await self.api.update(kind, obj)

    async def patch(
        self,
        kind: ResourceKind,
        name: str,
        patch: Object | Sequence[Object],
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
    ) -> Object:
        return await self.api.patch(kind, name, patch, namespace=namespace, patch_type=patch_type)

    async def delete(
        self,
        kind: ResourceKind,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: PropagationPolicy | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> Object:
        return await self.api.delete(
            kind,
            name,
            namespace=namespace,
            propagation_policy=propagation_policy,
            uid=uid,
            resource_version=resource_version,
        )

    async def delete_all_of(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        propagation_policy: PropagationPolicy | None = None,
    ) -> None:
        await self.api.delete_all_of(
            kind, namespace=namespace, label_selector=label_selector, propagation_policy=propagation_policy
        )

    async def update_status(self, kind: ResourceKind, obj: Object) -> Object:
        return await self.api.update_status(kind, obj)

    async def patch_status(
        self,
        kind: ResourceKind,
        name: str,
        patch: Object | Sequence[Object],
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
    ) -> Object:
        return await self.api.patch_status(kind, name, patch, namespace=namespace, patch_type=patch_type)
