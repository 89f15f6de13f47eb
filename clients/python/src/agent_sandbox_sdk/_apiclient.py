"""The bearer token of a `kubernetes` / `kubernetes_asyncio` client `Configuration` passed as `api_client`.

Those clients refresh credentials through the Configuration itself: `load_kube_config` installs a
`refresh_api_key_hook` that re-runs an exec credential plugin once its token expires (EKS tokens last 15
minutes), `load_incluster_config` one that re-reads the rotated service-account token file, and
kubernetes_asyncio's `refresh_token` task rewrites `api_key` in place. The clients call the hook and read
`api_key` before every request; so does `ConfigurationAuth`. Until December 6 the SDK copied the token once,
and an application that handed upstream's SDK its `ApiClient` got 401s from the first expiry on.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncGenerator, Generator
from typing import Any

import httpx2

__all__ = ["ConfigurationAuth", "configuration_header"]

#: The api_key identifiers the kubernetes clients have used for the bearer token (old, current).
_IDENTIFIERS = ("authorization", "BearerToken")


def configuration_header(cfg: Any) -> str | None:
    """The Authorization header a Configuration holds now (its api_key and api_key_prefix), or None."""
    keys = getattr(cfg, "api_key", None) or {}
    prefixes = getattr(cfg, "api_key_prefix", None) or {}
    for identifier in _IDENTIFIERS:
        token = keys.get(identifier)
        if token:
            prefix = prefixes.get(identifier, "")
            value = f"{prefix} {token}".strip() if prefix else str(token)
            return value if value.lower().startswith("bearer ") else f"Bearer {value}"
    return None


def _run_in_thread(awaitable: Any) -> None:
    """An async hook met by the sync client: run on a private loop, off any loop the caller may be inside."""
    failure: list[BaseException] = []

    def run() -> None:
        async def wait() -> None:
            await awaitable

        try:
            asyncio.run(wait())
        except BaseException as err:  # re-raised in the caller's thread
            failure.append(err)

    thread = threading.Thread(target=run, name="kube-config-refresh")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


class ConfigurationAuth(httpx2.Auth):
    """Authorization from a kubernetes Configuration, refreshed as the kubernetes clients refresh it."""

    def __init__(self, configuration: Any) -> None:
        self._cfg = configuration

    def _hook(self) -> Any:
        hook = getattr(self._cfg, "refresh_api_key_hook", None)
        return hook(self._cfg) if callable(hook) else None

    def _apply(self, request: httpx2.Request) -> None:
        header = configuration_header(self._cfg)
        if header is not None:
            request.headers["Authorization"] = header

    def sync_auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        result = self._hook()
        if inspect.isawaitable(result):
            _run_in_thread(result)
        self._apply(request)
        yield request

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        result = self._hook()
        if inspect.isawaitable(result):
            await result
        self._apply(request)
        yield request
