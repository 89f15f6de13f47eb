"""Client-side protocols controllers depend on (controller-runtime's `client` interfaces, asyncio edition).

Owns the tiny interfaces: `Reader` (get, list), `IndexedReader` (+ list by a cache index), `Writer`
(create, update, patch, delete, delete_all_of), `StatusWriter` (the status subresource on its own),
`Client` (their composition) and `ListWatcher` (what an informer needs from the API).

Implementations: `ApiClient` (reads and writes the API server), `Cache` (reads from informers),
`CachedClient` (reads from the cache, writes to the API: the manager's default client) and
`testing.FakeClient` (all of them, in memory).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from ._resources import ResourceKind
from ._types import LabelSelector, ListPage, Object, PatchType, PropagationPolicy, WatchEvent

__all__ = ["Client", "IndexedReader", "ListWatcher", "Reader", "StatusWriter", "Writer"]


@runtime_checkable
class Reader(Protocol):
    """Reads objects. Objects returned by cache-backed readers are shared: do not mutate them."""

    async def get(self, kind: ResourceKind, name: str, *, namespace: str | None = None) -> Object:
        """Return one object. Raises `NotFound`."""
        ...

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        field_selector: str | None = None,
    ) -> list[Object]:
        """Return the matching objects; `namespace=None` means all namespaces."""
        ...


@runtime_checkable
class IndexedReader(Reader, Protocol):
    """A `Reader` with secondary indexes (cache field indexers)."""

    async def list_by_index(
        self, kind: ResourceKind, index: str, value: str, *, namespace: str | None = None
    ) -> list[Object]:
        """Return the objects whose index function produced `value`."""
        ...


@runtime_checkable
class Writer(Protocol):
    """Writes objects to the API server."""

    async def create(self, kind: ResourceKind, obj: Object, *, namespace: str | None = None) -> Object:
        """Create; raises `AlreadyExists`."""
        ...

    async def update(self, kind: ResourceKind, obj: Object) -> Object:
        """Replace (optimistic concurrency on metadata.resourceVersion); raises `Conflict`."""
        ...

    async def patch(
        self,
        kind: ResourceKind,
        name: str,
        patch: Object | Sequence[Object],
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
    ) -> Object:
        """Patch (merge by default)."""
        ...

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
        """Delete, optionally with uid/resourceVersion preconditions; raises `NotFound`, `Conflict`."""
        ...

    async def delete_all_of(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        propagation_policy: PropagationPolicy | None = None,
    ) -> None:
        """Delete every matching object."""
        ...


@runtime_checkable
class StatusWriter(Protocol):
    """Writes the status subresource only."""

    async def update_status(self, kind: ResourceKind, obj: Object) -> Object: ...

    async def patch_status(
        self,
        kind: ResourceKind,
        name: str,
        patch: Object | Sequence[Object],
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
    ) -> Object: ...


class _SubresourceWriter(Protocol):
    async def update(self, kind: ResourceKind, obj: Object, *, subresource: str | None = None) -> Object: ...

    async def patch(
        self,
        kind: ResourceKind,
        name: str,
        patch: Object | Sequence[Object],
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
        subresource: str | None = None,
    ) -> Object: ...


class StatusViaSubresource:
    """`StatusWriter` for any writer whose update/patch take `subresource=` (the real and fake clients)."""

    async def update_status(self: _SubresourceWriter, kind: ResourceKind, obj: Object) -> Object:
        """PUT the status subresource (only `status` of `obj` is applied by the server)."""
        return await self.update(kind, obj, subresource="status")

    async def patch_status(
        self: _SubresourceWriter,
        kind: ResourceKind,
        name: str,
        patch: Object | Sequence[Object],
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
    ) -> Object:
        """PATCH the status subresource."""
        return await self.patch(
            kind, name, patch, namespace=namespace, patch_type=patch_type, subresource="status"
        )


@runtime_checkable
class Client(Reader, Writer, StatusWriter, Protocol):
    """Reader + Writer + StatusWriter."""


class ListWatcher(Protocol):
    """The two calls an informer makes."""

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
    ) -> ListPage: ...

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
    ) -> AsyncIterator[WatchEvent]: ...
