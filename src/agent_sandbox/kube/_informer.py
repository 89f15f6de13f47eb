"""Informer: a list+watch mirror of one resource type, with indexes and event handlers.

Owns: keeping an in-memory store equal to the API server's view of one kind (optionally scoped by
namespace / label selector / field selector), resuming watches from the last seen resourceVersion
(bookmarks advance it without events), relisting on 410 Gone, secondary indexes, and fanning
add/update/delete notifications out to handlers. Objects are transformed (managedFields stripped by
default) before they enter the store.

Does not own: what handlers do with events (they usually enqueue keys and must be cheap and synchronous)
or which informers exist (see `_cache`).

Failure modes: a watch that ends normally is resumed from the last resourceVersion; a 410 (at watch
start or as an ERROR event) triggers a relist that diffs the new list against the store, emitting
adds/updates/deletes for what was missed; other API/transport errors back off (0.8 s doubling to 30 s,
jittered) and resume. Handler exceptions are logged and swallowed so one bad handler cannot stall the
informer.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ..api.errortext import describe_error
from ._clock import REAL_CLOCK, Clock
from ._protocols import ListWatcher
from ._resources import ResourceKind
from ._rest import WATCH_BOOKMARK_GAP
from ._selectors import compile_selector
from ._types import LabelSelector, Object, WatchEvent, object_key
from .errors import Gone, KubeError, Timeout

__all__ = ["EventHandler", "HandlerFuncs", "IndexFunc", "Informer", "Transform", "strip_managed_fields"]

log = logging.getLogger("agent_sandbox.kube.informer")

IndexFunc = Callable[[Object], Iterable[str]]
"""Maps an object to the index values it should be found under (empty: not indexed)."""
Transform = Callable[[Object], Object]
"""Applied to every object before it is stored; may mutate and return its argument."""


def strip_managed_fields(obj: Object) -> Object:
    """Default transform: drop `metadata.managedFields` (controllers spec §5.5)."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


class EventHandler(Protocol):
    """Receives informer notifications synchronously; keep them cheap (typically: enqueue a key)."""

    def on_add(self, obj: Object) -> None: ...

    def on_update(self, old: Object, new: Object) -> None: ...

    def on_delete(self, obj: Object) -> None: ...


@dataclass(frozen=True, slots=True)
class HandlerFuncs:
    """Function adapter for `EventHandler`; a None field ignores that event."""

    add: Callable[[Object], None] | None = None
    update: Callable[[Object, Object], None] | None = None
    delete: Callable[[Object], None] | None = None

    def on_add(self, obj: Object) -> None:
        if self.add is not None:
            self.add(obj)

    def on_update(self, old: Object, new: Object) -> None:
        if self.update is not None:
            self.update(old, new)

    def on_delete(self, obj: Object) -> None:
        if self.delete is not None:
            self.delete(obj)


class Informer:
    """Mirror of one kind; run with `await informer.run()` (until cancelled)."""

    def __init__(
        self,
        lw: ListWatcher,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        field_selector: str | None = None,
        transform: Transform | None = strip_managed_fields,
        resync_period: float | None = None,
        page_size: int = 500,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        """Create an informer (nothing happens until `run()`).

        Args:
            lw: the API (an `ApiClient`, or a `FakeClient` in unit tests).
            kind: resource type to mirror.
            namespace: restrict to one namespace (None: all namespaces).
            label_selector / field_selector: server-side filters of list and watch.
            transform: applied to each object before storing (default strips managedFields).
            resync_period: if set, re-deliver every stored object as an update this often.
            page_size: list page size.
            clock: time source for backoff and resync.
        """
        self.kind = kind
        self._lw = lw
        self._namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._transform = transform
        self._resync = resync_period
        self._page_size = page_size
        self._clock = clock
        self._store: dict[str, Object] = {}
        self._indexers: dict[str, IndexFunc] = {}
        self._indices: dict[str, dict[str, set[str]]] = {}
        self._handlers: list[EventHandler] = []
        self._rv: str | None = None
        self._watching = False  # the current watch has delivered an event
        self._synced = asyncio.Event()
        self.relists = 0
        """Number of full lists performed (1 after the initial sync); tests and metrics read it."""

    # ------------------------------------------------------------------ store access

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    @property
    def resource_version(self) -> str | None:
        """Last resourceVersion observed (list, event or bookmark); None before the first list.

        Settable while the informer is not running: the next `run()` resumes watching from it (None
        forces a relist). A version the server no longer has makes that watch fail with 410 -> relist.
        """
        return self._rv

    @resource_version.setter
    def resource_version(self, value: str | None) -> None:
        self._rv = value

    async def wait_for_sync(self) -> None:
        """Return once the initial list has been stored."""
        await self._synced.wait()

    def get(self, key: str) -> Object | None:
        """Stored object by key ("ns/name" or "name"), or None."""
        return self._store.get(key)

    def list(self, namespace: str | None = None, label_selector: LabelSelector | None = None) -> list[Object]:
        """Stored objects, optionally filtered by namespace and label selector."""
        objs: Iterable[Object] = self._store.values()
        if namespace:
            prefix = namespace + "/"
            objs = [o for k, o in self._store.items() if k.startswith(prefix)]
        if label_selector:
            match = compile_selector(label_selector)
            objs = [o for o in objs if match(o["metadata"].get("labels") or {})]
        return list(objs)

    def keys(self) -> builtins.list[str]:
        return list(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def by_index(self, index: str, value: str, namespace: str | None = None) -> builtins.list[Object]:
        """Objects whose index function yielded `value` (optionally only in `namespace`).

        Raises:
            KeyError: no such index.
        """
        keys = self._indices[index].get(value)
        if not keys:
            return []
        store = self._store
        if namespace:
            prefix = namespace + "/"
            return [store[k] for k in keys if k.startswith(prefix)]
        return [store[k] for k in keys]

    def add_index(self, name: str, fn: IndexFunc) -> None:
        """Register an index (allowed at any time; existing objects are indexed immediately).

        Raises:
            ValueError: an index with that name already exists.
        """
        if name in self._indexers:
            raise ValueError(f"index {name!r} already registered for {self.kind.kind}")
        self._indexers[name] = fn
        bucket: dict[str, set[str]] = {}
        for key, obj in self._store.items():
            for value in fn(obj):
                bucket.setdefault(value, set()).add(key)
        self._indices[name] = bucket

    def add_handler(self, handler: EventHandler) -> None:
        """Subscribe a handler; if already synced it first receives an add for every stored object."""
        self._handlers.append(handler)
        if self.has_synced:
            for obj in list(self._store.values()):
                self._call(handler.on_add, obj)

    # ------------------------------------------------------------------ store mutation

    def _index_remove(self, key: str, obj: Object) -> None:
        for name, fn in self._indexers.items():
            bucket = self._indices[name]
            for value in fn(obj):
                keys = bucket.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del bucket[value]

    def _index_add(self, key: str, obj: Object) -> None:
        for name, fn in self._indexers.items():
            bucket = self._indices[name]
            for value in fn(obj):
                bucket.setdefault(value, set()).add(key)

    def _call(self, fn: Callable[..., None], *args: Object) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("informer %s: event handler failed", self.kind.kind)

    def _upsert(self, obj: Object) -> None:
        key = object_key(obj)
        old = self._store.get(key)
        self._store[key] = obj
        if self._indexers:
            if old is not None:
                self._index_remove(key, old)
            self._index_add(key, obj)
        for handler in self._handlers:
            if old is None:
                self._call(handler.on_add, obj)
            else:
                self._call(handler.on_update, old, obj)

    def _remove(self, key: str, fallback: Object) -> None:
        old = self._store.pop(key, None)
        if old is not None and self._indexers:
            self._index_remove(key, old)
        gone = old if old is not None else fallback
        for handler in self._handlers:
            self._call(handler.on_delete, gone)

    def _replace(self, items: builtins.list[Object], resource_version: str) -> None:
        """Install a fresh list: adds/updates for what is listed, deletes for what vanished."""
        fresh: dict[str, Object] = {}
        for item in items:
            obj = self._transform(item) if self._transform else item
            fresh[object_key(obj)] = obj
        for key in [k for k in self._store if k not in fresh]:
            self._remove(key, self._store[key])
        for key, obj in fresh.items():
            old = self._store.get(key)
            if old is not None and old["metadata"].get("resourceVersion") == obj["metadata"].get(
                "resourceVersion"
            ):
                continue
            self._upsert(obj)
        self._rv = resource_version
        self._synced.set()

    def _apply(self, event: WatchEvent) -> None:
        obj = event.object
        meta = obj.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if event.type == "BOOKMARK":
            if rv:
                self._rv = rv
            return
        if self._transform:
            obj = self._transform(obj)
        if event.type == "DELETED":
            self._remove(object_key(obj), obj)
        else:
            self._upsert(obj)
        if rv:
            self._rv = rv

    # ------------------------------------------------------------------ run loop

    async def _list(self) -> None:
        items: list[Object] = []
        token: str | None = None
        rv = ""
        while True:
            page = await self._lw.list_page(
                self.kind,
                namespace=self._namespace,
                label_selector=self._label_selector,
                field_selector=self._field_selector,
                limit=self._page_size,
                continue_token=token,
            )
            items.extend(page.items)
            rv = rv or page.resource_version
            if not page.continue_token:
                break
            token = page.continue_token
        self.relists += 1
        self._replace(items, rv)

    async def _watch(self) -> None:
        # client-go: server-side timeout randomised in [5 min, 10 min) so watches do not restart in lockstep.
        timeout = int(300 * (1 + random.random()))
        stream = self._lw.watch(
            self.kind,
            namespace=self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            resource_version=self._rv,
            allow_bookmarks=True,
            timeout_seconds=timeout,
        )
        loop = asyncio.get_running_loop()
        opened = loop.time()
        try:
            async for event in stream:
                self._watching = True
                self._apply(event)
        except Timeout:
            if loop.time() - opened < WATCH_BOOKMARK_GAP / 2:
                raise  # not a silent watch: the connection itself timed out (backoff applies)
            # Silent past the bookmark gap: a connection a proxy froze, or a server that sends no bookmarks.
            # Watched again at once from the last resourceVersion, as after the server's own timeout - no
            # backoff, no warning (the silence says nothing about the API server's health).
            log.info("informer %s: watch silent, re-opening it", self.kind.kind)

    async def run(self) -> None:
        """List, then watch forever (until cancelled); see module docstring for error handling."""
        resync = asyncio.create_task(self._resync_loop()) if self._resync else None
        backoff = 0.8
        try:
            while True:
                self._watching = False
                try:
                    if self._rv is None:
                        await self._list()
                    await self._watch()
                    backoff = 0.8
                except Gone:
                    log.info("informer %s: resourceVersion %s expired, relisting", self.kind.kind, self._rv)
                    self._rv = None
                except KubeError as exc:
                    if self._watching:
                        # The watch worked before it broke: a new outage starts from the shortest wait (a
                        # backoff kept from an earlier one delayed the next relist by 40 s, until December 6).
                        backoff = 0.8
                    delay = backoff * (1 + random.random() * 0.5)
                    log.warning(
                        "informer %s: %s; retrying in %.1fs", self.kind.kind, describe_error(exc), delay
                    )
                    await self._clock.sleep(delay)
                    backoff = min(backoff * 2, 30.0)
        finally:
            if resync is not None:
                resync.cancel()

    async def _resync_loop(self) -> None:
        assert self._resync is not None
        while True:
            await self._clock.sleep(self._resync)
            for obj in list(self._store.values()):
                for handler in self._handlers:
                    self._call(handler.on_update, obj, obj)
