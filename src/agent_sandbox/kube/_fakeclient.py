"""In-memory implementation of Reader/IndexedReader/Writer/StatusWriter/ListWatcher for unit tests.

Semantics (kept close to the API server where controllers can observe the difference):

* Objects are keyed by (group, plural, namespace, name); the version is ignored (no conversion).
* Every write bumps one global resourceVersion; creates set uid, creationTimestamp, generation=1;
  writes that change anything outside metadata/status bump `metadata.generation`.
* `update`/`patch` with `metadata.resourceVersion` set are optimistic-concurrency checked (`Conflict`).
  Main-resource writes keep the stored `status`; status writes change only `status`.
* Strategic-merge and apply patches are applied as JSON merge patches (no schema here).
* Delete honours uid/resourceVersion preconditions; with finalizers it only sets deletionTimestamp and
  the object disappears when the last finalizer is removed. Unless propagation is Orphan, a dependent
  (ownerReference to the deleted uid) is deleted when none of its other owners exists, else that reference
  is dropped - the garbage collector's rule, simplified (at once, no blockOwnerDeletion).
* Returned objects are deep copies (tests can mutate them freely).
* `watch()` replays the event log after the given resourceVersion, then follows new writes; `compact()`
  makes older resourceVersions raise `Gone`; `WatchControl.close_all()` ends open watches.
* `inject_error(verb, ...)` makes the next matching call raise; `actions` records every call.
* `set_write_gate(gate)`: as `ApiClient`, `gate()` runs before every write and may refuse it by raising.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ._patch import apply_json_patch, apply_merge_patch
from ._protocols import StatusViaSubresource
from ._resources import ResourceKind
from ._selectors import compile_selector
from ._types import LabelSelector, ListPage, Object, PatchType, PropagationPolicy, WatchEvent
from .errors import AlreadyExists, Conflict, Gone, Invalid, NotFound

__all__ = ["FakeClient", "WatchControl"]

_TypeKey = tuple[str, str]
_Key = tuple[str, str, str, str]


def _type_key(kind: ResourceKind) -> _TypeKey:
    return (kind.group, kind.plural)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Injected:
    verb: str
    kind: ResourceKind | None
    name: str | None
    error: BaseException
    times: int


@dataclass
class WatchControl:
    """Handles to the open fake watches, so tests can end them (forcing a re-watch)."""

    queues: list[asyncio.Queue[WatchEvent | BaseException | None]] = field(default_factory=list)

    def close_all(self, error: BaseException | None = None) -> None:
        """End every open watch, normally (None) or by raising `error` in the consumer."""
        for q in self.queues:
            q.put_nowait(error)


class FakeClient(StatusViaSubresource):
    """In-memory API server stand-in; see the module docstring for semantics."""

    def __init__(self, *objects: tuple[ResourceKind, Object]) -> None:
        self._store: dict[_Key, Object] = {}
        self._rv = itertools.count(1)
        self._last_rv = 0
        self._compacted = 0
        self._log: dict[_TypeKey, list[tuple[int, str, Object]]] = {}
        self._watchers: dict[_TypeKey, list[asyncio.Queue[WatchEvent | BaseException | None]]] = {}
        self._indexes: dict[tuple[_TypeKey, str], Callable[[Object], list[str]]] = {}
        self._injected: list[_Injected] = []
        self._write_gate: Callable[[], None] | None = None
        self.actions: list[tuple[str, str, str | None, str | None]] = []
        self.watch_control = WatchControl()
        for kind, obj in objects:
            self._create_sync(kind, copy.deepcopy(obj), obj.get("metadata", {}).get("namespace"))

    # ----------------------------------------------------------------- test hooks

    def inject_error(
        self,
        verb: str,
        error: BaseException,
        *,
        kind: ResourceKind | None = None,
        name: str | None = None,
        times: int = 1,
    ) -> None:
        """Make the next `times` calls of `verb` (get/list/create/update/patch/delete/watch, or "*")
        on `kind`/`name` (None = any) raise `error`."""
        self._injected.append(_Injected(verb, kind, name, error, times))

    def add_index(self, kind: ResourceKind, name: str, fn: Callable[[Object], list[str]]) -> None:
        """Register an index for `list_by_index` (same contract as `Cache.add_index`)."""
        self._indexes[(_type_key(kind), name)] = fn

    def compact(self) -> None:
        """Forget the event log: watches from any older resourceVersion now raise `Gone`."""
        self._compacted = self._last_rv
        self._log.clear()

    @property
    def resource_version(self) -> str:
        """The latest resourceVersion issued."""
        return str(self._last_rv)

    def objects(self, kind: ResourceKind) -> list[Object]:
        """Synchronous peek at all stored objects of a kind (deep copies)."""
        tk = _type_key(kind)
        return [copy.deepcopy(o) for k, o in self._store.items() if k[:2] == tk]

    def set_write_gate(self, gate: Callable[[], None] | None) -> None:
        """Run `gate()` before every write (see `ApiClient.set_write_gate`)."""
        self._write_gate = gate

    def _record(self, verb: str, kind: ResourceKind, namespace: str | None, name: str | None) -> None:
        if self._write_gate is not None and verb in (
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
        ):
            self._write_gate()
        self.actions.append((verb, kind.kind, namespace, name))
        for inj in self._injected:
            if inj.verb in (verb, "*") and inj.kind in (None, kind) and inj.name in (None, name):
                inj.times -= 1
                if inj.times <= 0:
                    self._injected.remove(inj)
                raise inj.error

    # ----------------------------------------------------------------- internals

    def _key(self, kind: ResourceKind, namespace: str | None, name: str) -> _Key:
        return (kind.group, kind.plural, (namespace or "") if kind.namespaced else "", name)

    def _emit(self, kind: ResourceKind, etype: str, obj: Object) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        tk = _type_key(kind)
        self._log.setdefault(tk, []).append((rv, etype, copy.deepcopy(obj)))
        for q in self._watchers.get(tk, []):
            q.put_nowait(WatchEvent(etype, copy.deepcopy(obj)))  # type: ignore[arg-type]

    def _bump(self, obj: Object) -> None:
        self._last_rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(self._last_rv)

    def _create_sync(self, kind: ResourceKind, obj: Object, namespace: str | None) -> Object:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise Invalid(422, "Invalid", "metadata.name: Required value")
        if kind.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        key = self._key(kind, meta.get("namespace"), meta["name"])
        if key in self._store:
            raise AlreadyExists(409, "AlreadyExists", f'{kind.plural} "{meta["name"]}" already exists')
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta["generation"] = 1
        self._bump(obj)
        self._store[key] = obj
        self._emit(kind, "ADDED", obj)
        return copy.deepcopy(obj)

    def _existing(self, kind: ResourceKind, namespace: str | None, name: str) -> Object:
        obj = self._store.get(self._key(kind, namespace, name))
        if obj is None:
            raise NotFound(404, "NotFound", f'{kind.plural} "{name}" not found')
        return obj

    def _write(self, kind: ResourceKind, old: Object, new: Object, subresource: str | None) -> Object:
        new_rv = new.get("metadata", {}).get("resourceVersion")
        if new_rv and new_rv != old["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified; please apply your changes")
        if subresource == "status":
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = copy.deepcopy(new["status"])
            else:
                merged.pop("status", None)
        else:
            merged = copy.deepcopy(new)
            meta = merged.setdefault("metadata", {})
            for immutable in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp"):
                if immutable in old["metadata"]:
                    meta[immutable] = old["metadata"][immutable]
            meta["generation"] = old["metadata"].get("generation", 1)
            if "status" in old:
                merged["status"] = old["status"]
            else:
                merged.pop("status", None)
            if _spec_part(merged) != _spec_part(old):
                meta["generation"] += 1
        merged["apiVersion"], merged["kind"] = kind.api_version, kind.kind
        self._bump(merged)
        meta = merged["metadata"]
        key = self._key(kind, meta.get("namespace"), meta["name"])
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self._store[key]
            self._emit(kind, "DELETED", merged)
        else:
            self._store[key] = merged
            self._emit(kind, "MODIFIED", merged)
        return copy.deepcopy(merged)

    def _delete_sync(self, kind: ResourceKind, obj: Object, propagation: PropagationPolicy | None) -> Object:
        meta = obj["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = _now()
                self._bump(obj)
                self._emit(kind, "MODIFIED", obj)
            return copy.deepcopy(obj)
        del self._store[self._key(kind, meta.get("namespace"), meta["name"])]
        self._bump(obj)
        self._emit(kind, "DELETED", obj)
        if propagation != "Orphan":
            self._collect_dependents(meta["uid"])
        return copy.deepcopy(obj)

    def _collect_dependents(self, uid: str) -> None:
        for key, dep in list(self._store.items()):
            refs = dep["metadata"].get("ownerReferences") or []
            if key not in self._store or not any(r.get("uid") == uid for r in refs):
                continue
            group, version = _split_api_version(dep["apiVersion"])
            kind = ResourceKind(group, version, dep["kind"], key[1], namespaced=bool(key[2]))
            live = {o["metadata"].get("uid") for o in self._store.values()}
            if any(r.get("uid") != uid and r.get("uid") in live for r in refs):
                dep["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
                self._bump(dep)
                self._emit(kind, "MODIFIED", dep)
            else:
                self._delete_sync(kind, dep, "Background")

    # ----------------------------------------------------------------- Reader

    async def get(
        self, kind: ResourceKind, name: str, *, namespace: str | None = None, subresource: str | None = None
    ) -> Object:
        self._record("get", kind, namespace, name)
        return copy.deepcopy(self._existing(kind, namespace, name))

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        field_selector: str | None = None,
    ) -> list[Object]:
        self._record("list", kind, namespace, None)
        return [copy.deepcopy(o) for o in self._select(kind, namespace, label_selector, field_selector)]

    def _select(
        self, kind: ResourceKind, namespace: str | None, selector: LabelSelector | None, fields: str | None
    ) -> builtins.list[Object]:
        match = compile_selector(selector)
        field_eq = dict(f.split("=", 1) for f in fields.replace("==", "=").split(",")) if fields else {}
        tk = _type_key(kind)
        out = []
        for key, obj in self._store.items():
            if key[:2] != tk or (namespace and kind.namespaced and key[2] != namespace):
                continue
            if not match(obj["metadata"].get("labels") or {}):
                continue
            if field_eq and not all(_field(obj, f) == v for f, v in field_eq.items()):
                continue
            out.append(obj)
        return out

    async def list_by_index(
        self, kind: ResourceKind, index: str, value: str, *, namespace: str | None = None
    ) -> builtins.list[Object]:
        self._record("list", kind, namespace, None)
        fn = self._indexes.get((_type_key(kind), index))
        if fn is None:
            raise KeyError(f"no index {index!r} for {kind.kind}")
        return [copy.deepcopy(o) for o in self._select(kind, namespace, None, None) if value in fn(o)]

    # ----------------------------------------------------------------- Writer / StatusWriter

    async def create(
        self,
        kind: ResourceKind,
        obj: Object,
        *,
        namespace: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Object:
        ns = namespace or obj.get("metadata", {}).get("namespace")
        self._record("create", kind, ns, obj.get("metadata", {}).get("name"))
        return self._create_sync(kind, copy.deepcopy(obj), ns)

    async def update(
        self,
        kind: ResourceKind,
        obj: Object,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> Object:
        meta = obj["metadata"]
        self._record("update", kind, meta.get("namespace"), meta["name"])
        old = self._existing(kind, meta.get("namespace"), meta["name"])
        return self._write(kind, old, obj, subresource)

    async def patch(
        self,
        kind: ResourceKind,
        name: str,
        patch: Object | Sequence[Object],
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool | None = None,
    ) -> Object:
        self._record("patch", kind, namespace, name)
        old = self._existing(kind, namespace, name)
        try:
            if patch_type is PatchType.JSON:
                new = apply_json_patch(old, patch)  # type: ignore[arg-type]
            else:
                new = apply_merge_patch(old, patch)
        except ValueError as exc:
            raise Invalid(422, "Invalid", str(exc)) from exc
        if patch_type is not PatchType.JSON and not (patch.get("metadata") or {}).get("resourceVersion"):  # type: ignore[union-attr]
            new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        return self._write(kind, old, new, subresource)

    async def delete(
        self,
        kind: ResourceKind,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: PropagationPolicy | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> Object:
        self._record("delete", kind, namespace, name)
        obj = self._existing(kind, namespace, name)
        if uid and obj["metadata"]["uid"] != uid:
            raise Conflict(409, "Conflict", "Precondition failed: UID in precondition does not match")
        if resource_version and obj["metadata"]["resourceVersion"] != resource_version:
            raise Conflict(
                409, "Conflict", "Precondition failed: ResourceVersion in precondition does not match"
            )
        return self._delete_sync(kind, obj, propagation_policy)

    async def delete_all_of(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        propagation_policy: PropagationPolicy | None = None,
    ) -> None:
        self._record("deletecollection", kind, namespace, None)
        for obj in list(self._select(kind, namespace, label_selector, None)):
            self._delete_sync(kind, obj, propagation_policy)

    # ----------------------------------------------------------------- ListWatcher

    async def list_page(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
    ) -> ListPage:
        self._record("list", kind, namespace, None)
        items = [copy.deepcopy(o) for o in self._select(kind, namespace, label_selector, field_selector)]
        start = int(continue_token or 0)
        end = len(items) if not limit else start + limit
        token = str(end) if end < len(items) else ""
        return ListPage(items[start:end], str(self._last_rv), token)

    def watch(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        allow_bookmarks: bool = True,
        timeout_seconds: int | None = None,
    ) -> AsyncIterator[WatchEvent]:
        self._record("watch", kind, namespace, None)
        return self._watch(kind, namespace, label_selector, resource_version)

    async def _watch(
        self, kind: ResourceKind, namespace: str | None, selector: LabelSelector | None, rv: str | None
    ) -> AsyncIterator[WatchEvent]:
        since = int(rv or self._last_rv)
        if since < self._compacted:
            raise Gone(410, "Expired", f"too old resource version: {since} ({self._compacted})")
        match = compile_selector(selector)
        tk = _type_key(kind)
        q: asyncio.Queue[WatchEvent | BaseException | None] = asyncio.Queue()
        for ev_rv, etype, obj in self._log.get(tk, []):
            if ev_rv > since:
                q.put_nowait(WatchEvent(etype, copy.deepcopy(obj)))  # type: ignore[arg-type]
        self._watchers.setdefault(tk, []).append(q)
        self.watch_control.queues.append(q)
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                meta = item.object["metadata"]
                if namespace and kind.namespaced and meta.get("namespace") != namespace:
                    continue
                if item.type != "BOOKMARK" and not match(meta.get("labels") or {}):
                    continue
                yield item
        finally:
            self._watchers[tk].remove(q)
            self.watch_control.queues.remove(q)

    def send_bookmark(self, kind: ResourceKind) -> None:
        """Deliver a BOOKMARK at the current resourceVersion to open watches of `kind`."""
        bookmark = {
            "apiVersion": kind.api_version,
            "kind": kind.kind,
            "metadata": {"resourceVersion": self.resource_version},
        }
        for q in self._watchers.get(_type_key(kind), []):
            q.put_nowait(WatchEvent("BOOKMARK", copy.deepcopy(bookmark)))


def _spec_part(obj: Object) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _field(obj: Object, path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "" if node is None else str(node)


def _split_api_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version
