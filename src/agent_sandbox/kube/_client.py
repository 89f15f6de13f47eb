"""The asyncio Kubernetes API client: the typed verbs (get, list, watch, create, patch...) of resource kinds.

`ApiClient` turns a `ResourceKind` descriptor and an operation's options into the API path, query string and
JSON body of one request; how that request reaches the server (pools, throttling, auth, retries, the write
gate, metrics) is `_rest.RestClient`'s, which it extends.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from ._config import load_config
from ._protocols import StatusViaSubresource
from ._resources import ResourceKind
from ._rest import RestClient
from ._types import LabelSelector, ListPage, Object, PatchType, PropagationPolicy, WatchEvent

__all__ = ["ApiClient", "selector_string"]


def selector_string(selector: LabelSelector | None) -> str | None:
    """Render a label selector (string or equality map) in the API's string syntax."""
    if selector is None or isinstance(selector, str):
        return selector
    return ",".join(f"{k}={v}" for k, v in selector.items())


def _query(params: Mapping[str, str | int | bool | None]) -> str:
    parts = []
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        parts.append(f"{key}={quote(str(value), safe='')}")
    return "&".join(parts)


class ApiClient(RestClient, StatusViaSubresource):
    """Async client for one Kubernetes API server.

    Construct with `ApiClient(config, ...)` or `ApiClient.from_kubeconfig(path)`; the aiohttp session is
    opened lazily on first use inside the running loop. Use as `async with` or call `await close()`.

    All methods take a `ResourceKind` descriptor first. Objects are plain dicts (see `_types.Object`).
    """

    @classmethod
    async def from_kubeconfig(
        cls, path: str | os.PathLike[str] | None = None, *, context: str | None = None, **kwargs: Any
    ) -> ApiClient:
        """Build a client from a kubeconfig (`--kubeconfig`, then `$KUBECONFIG`, in-cluster, ~/.kube/config).

        A coroutine so callers construct clients inside the loop that will use them; the synchronous
        equivalent is `ApiClient(load_config(path), ...)`. Extra keyword arguments go to the constructor
        (qps, burst, connections, ...).

        Raises:
            ConfigError: no usable configuration.
        """
        return cls(load_config(path, context=context), **kwargs)

    def clone(
        self, *, qps: float, burst: int, user_agent_suffix: str = "", request_timeout: float | None = None
    ) -> ApiClient:
        """A client for the same server and credentials with its own connection pool and token bucket.

        Nothing is shared but the configuration (TLS context, credentials), so the clone's requests never
        queue behind this client's: the leader elector renews its Lease through one (controller-runtime
        builds its leader-election client from a copy of the rest config the same way). Its session opens
        lazily in the loop that first uses it, so a clone may serve another thread's event loop.

        Args:
            qps: the clone's own requests/s (<= 0: unthrottled).
            burst: the clone's own token-bucket burst.
            user_agent_suffix: appended as "/<suffix>" to this client's User-Agent (client-go's
                `rest.AddUserAgent`), so the API server's logs and audit tell the clone's traffic apart.
            request_timeout: whole-request timeout in seconds (default: this client's).
        """
        ua = f"{self._user_agent}/{user_agent_suffix}" if user_agent_suffix else self._user_agent
        return ApiClient(
            self.config,
            qps=qps,
            burst=burst,
            user_agent=ua,
            request_timeout=self._request_timeout if request_timeout is None else request_timeout,
            connect_timeout=self._connect_timeout,
        )

    @property
    def default_namespace(self) -> str:
        """The kubeconfig context's namespace (the service account's namespace in-cluster)."""
        return self.config.namespace

    # ----------------------------------------------------------------- reads

    async def get(
        self, kind: ResourceKind, name: str, *, namespace: str | None = None, subresource: str | None = None
    ) -> Object:
        """GET one object (or a subresource such as "status" / "scale").

        Raises:
            NotFound: no such object.
        """
        obj: Object = await self._json("GET", kind.path(namespace, name, subresource))
        return obj

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
        """One list page with its resourceVersion and continue token (informers use this)."""
        query = _query(
            {
                "labelSelector": selector_string(label_selector),
                "fieldSelector": field_selector,
                "limit": limit,
                "continue": continue_token or None,
                "resourceVersion": resource_version,
                "resourceVersionMatch": resource_version_match,
            }
        )
        data = await self._json("GET", kind.path(namespace), query=query)
        items: list[Object] = data.get("items") or []
        # Lists omit apiVersion/kind on items; fill them so cached objects are self-describing.
        api_version, kind_name = kind.api_version, kind.kind
        for item in items:
            item["apiVersion"] = api_version
            item["kind"] = kind_name
        meta = data.get("metadata") or {}
        return ListPage(items, meta.get("resourceVersion", ""), meta.get("continue", "") or "")

    async def list(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> list[Object]:
        """List all matching objects (following continue tokens); `namespace=None` lists all namespaces."""
        items: list[Object] = []
        token: str | None = None
        while True:
            page = await self.list_page(
                kind,
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                limit=page_size,
                continue_token=token,
            )
            items.extend(page.items)
            if not page.continue_token:
                return items
            token = page.continue_token

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
        """Stream watch events (ADDED/MODIFIED/DELETED/BOOKMARK) until the server ends the watch.

        Raises:
            Gone: the resourceVersion is too old (HTTP 410 or an ERROR event with code 410): relist.
            ApiError: any other ERROR event or failed response.
            TransportError: the stream broke.
        """
        query = _query(
            {
                "watch": True,
                "labelSelector": selector_string(label_selector),
                "fieldSelector": field_selector,
                "resourceVersion": resource_version,
                "allowWatchBookmarks": allow_bookmarks or None,
                "timeoutSeconds": timeout_seconds,
            }
        )
        return self._watch_stream(kind.path(namespace), query, timeout_seconds, allow_bookmarks)

    # ----------------------------------------------------------------- writes

    async def create(
        self,
        kind: ResourceKind,
        obj: Object,
        *,
        namespace: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Object:
        """POST a new object; the namespace defaults to `obj.metadata.namespace`.

        Raises:
            AlreadyExists: the name is taken.
            Invalid: validation failed.
        """
        ns = namespace or obj.get("metadata", {}).get("namespace")
        query = _query({"fieldManager": field_manager, "dryRun": "All" if dry_run else None})
        created: Object = await self._json("POST", kind.path(ns), query=query, body=obj)
        return created

    async def update(
        self,
        kind: ResourceKind,
        obj: Object,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> Object:
        """PUT a whole object (optimistic concurrency through its `metadata.resourceVersion`).

        Raises:
            Conflict: the resourceVersion is stale.
        """
        meta = obj["metadata"]
        path = kind.path(meta.get("namespace"), meta["name"], subresource)
        updated: Object = await self._json(
            "PUT", path, query=_query({"fieldManager": field_manager}), body=obj
        )
        return updated

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
        """PATCH an object: merge (default), strategic-merge (built-in kinds only), JSON patch, or apply.

        Server-side apply requires `field_manager`; `force=True` takes ownership of conflicting fields.
        """
        if patch_type is PatchType.APPLY and not field_manager:
            raise ValueError("server-side apply needs a field_manager")
        if patch_type is PatchType.JSON and isinstance(patch, Mapping):
            raise TypeError("a JSON patch is a list of operations")
        query = _query({"fieldManager": field_manager, "force": force})
        patched: Object = await self._json(
            "PATCH", kind.path(namespace, name, subresource), query=query, body=patch, content_type=patch_type
        )
        return patched

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
        """DELETE one object, optionally guarded by uid/resourceVersion preconditions.

        Returns:
            The server's answer: the object (still present with deletionTimestamp if finalizers remain)
            or a Status.

        Raises:
            NotFound: already gone.
            Conflict: a precondition failed.
        """
        options: Object = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if uid or resource_version:
            pre: dict[str, str] = {}
            if uid:
                pre["uid"] = uid
            if resource_version:
                pre["resourceVersion"] = resource_version
            options["preconditions"] = pre
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        result: Object = await self._json("DELETE", kind.path(namespace, name), body=options)
        return result

    async def delete_all_of(
        self,
        kind: ResourceKind,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        propagation_policy: PropagationPolicy | None = None,
    ) -> None:
        """DELETE a collection (deletecollection verb) matching a label selector."""
        options: Object = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        query = _query({"labelSelector": selector_string(label_selector)})
        await self._json("DELETE", kind.path(namespace), query=query, body=options)

    # ----------------------------------------------------------------- status subresource

    # ----------------------------------------------------------------- discovery

    async def server_version(self) -> dict[str, Any]:
        """GET /version (also a cheap connectivity check)."""
        version: dict[str, Any] = await self._json("GET", "/version")
        return version
