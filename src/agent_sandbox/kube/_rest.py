"""One API server's HTTP layer (client-go's RESTClient): how a request reaches the server and comes back.

Owns: every HTTP exchange with the API server (raw requests and watch streams), client-side QPS/burst
throttling (`--kube-api-qps`/`--kube-api-burst`), connection pooling (`--api-connections`,
`--separate-watch-connection`), authentication refresh on 401, 429 retries, the write gate, and the
`rest_client_*` metrics. Does not own what the requests mean (the typed verbs of `_client.ApiClient`),
caching (see `_informer`/`_cache`) or retries of failed writes (the work queue's rate limiter does that).

Failure modes: HTTP failures raise the `ApiError` subclass chosen by `errors.error_from_status`;
connection problems raise `TransportError` / `Timeout`, chained to the aiohttp exception. Idempotent GETs
are retried once on a dropped keep-alive connection; 429s are retried (up to 10 times) after the
server's Retry-After, like client-go.

Performance notes: the session is created lazily inside the running loop; URLs are pre-encoded strings
(`yarl.URL(..., encoded=True)`) so yarl does not re-quote them; labelled metric children are cached.
"""

from __future__ import annotations

import asyncio
import itertools
import platform
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import urlsplit

import aiohttp
import orjson
from yarl import URL

from .. import __version__
from ..api.errortext import describe_error
from ._config import ClusterConfig, ExecAuth
from ._ratelimit import TokenBucket
from ._types import WatchEvent
from ._writegate import GatedConnector
from .errors import ApiError, NotLeader, Timeout, TransportError, error_from_status
from .metrics import REST_CLIENT_DURATION, REST_CLIENT_REQUESTS

__all__ = ["WATCH_BOOKMARK_GAP", "RestClient"]

_JSON = "application/json"
# client-go's per-connection HTTP/2 stream ceiling is ~100; with HTTP/1.1 one connection carries one
# request at a time, so each "API connection" is a pool of this many sockets.
_CONNS_PER_SHARD = 100
_MAX_429_RETRIES = 10
#: Longest silence on a watch with bookmarks before it is taken for dead (the API server's watch cache sends
#: a bookmark about every 60 s to watchers that allow them).
WATCH_BOOKMARK_GAP = 100.0


class RestClient:
    """The HTTP layer of a client for one Kubernetes API server: pools, throttle, auth, write gate, metrics.

    `ApiClient` builds its typed verbs on `request`, `_json` and `_watch_stream`; the aiohttp session is
    opened lazily on first use inside the running loop. Use as `async with` or call `await close()`.
    """

    def __init__(
        self,
        config: ClusterConfig,
        *,
        qps: float = -1.0,
        burst: int = 10,
        connections: int = 1,
        separate_watch_connection: bool = False,
        user_agent: str | None = None,
        request_timeout: float = 60.0,
        connect_timeout: float = 10.0,
    ) -> None:
        """Create a client.

        Args:
            config: resolved server, TLS and auth settings (`load_config`).
            qps: client-side requests/s; <= 0 disables throttling (`--kube-api-qps`, default -1).
            burst: token-bucket burst (`--kube-api-burst`); must be > 0.
            connections: number of independent connection pools used round-robin (`--api-connections`).
            separate_watch_connection: give list/watch traffic its own pool (`--separate-watch-connection`).
            user_agent: User-Agent header; defaults to "agent-sandbox/<version> (<os>/<arch>) python".
            request_timeout: whole-request timeout for non-watch calls, seconds.
            connect_timeout: TCP+TLS connect timeout, seconds.
        """
        if burst <= 0:
            raise ValueError("burst must be > 0")
        if connections < 1:
            raise ValueError("connections must be >= 1")
        self.config = config
        self._base = config.server
        self._host = urlsplit(config.server).netloc
        self._bucket = TokenBucket(qps, burst)
        self._connections = connections
        self._separate_watch = separate_watch_connection
        self._sessions: list[aiohttp.ClientSession] = []
        self._watch_session: aiohttp.ClientSession | None = None
        self._rr = itertools.count()
        ua = (
            user_agent
            or f"agent-sandbox/{__version__} ({platform.system().lower()}/{platform.machine()}) python"
        )
        self._user_agent = ua
        self._base_headers = {"Accept": _JSON, "User-Agent": ua}
        # sock_connect, not connect: aiohttp's `connect` also counts waiting for a free pooled connection,
        # which under a burst (hundreds of requests in flight) is queueing, not a dead server.
        self._timeout = aiohttp.ClientTimeout(total=request_timeout, sock_connect=connect_timeout)
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        # Passed on every request (watches included): aiohttp takes neither an SNI override nor, for the
        # CONNECT tunnel, a proxy from the connector.
        self._route: dict[str, Any] = {}
        if config.tls_server_name:
            self._route["server_hostname"] = config.tls_server_name
        if config.proxy_url:
            self._route["proxy"] = config.proxy_url
        # An exec plugin that gives client certificates: its current one goes with every request (`_routed`).
        self._plugin = config.auth if isinstance(config.auth, ExecAuth) else None
        self._closed = False
        self._write_gate: Callable[[], None] | None = None
        self._metric_children: dict[tuple[str, str], Any] = {}
        self._duration_children: dict[str, Any] = {}

    @property
    def server(self) -> str:
        """Base URL of the API server."""
        return self._base

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close all connection pools. Idempotent."""
        self._closed = True
        sessions = [*self._sessions, *([self._watch_session] if self._watch_session else [])]
        self._sessions, self._watch_session = [], None
        for session in sessions:
            await session.close()

    def _new_session(self) -> aiohttp.ClientSession:
        connector = GatedConnector(
            self._check_write,
            limit=0,
            limit_per_host=_CONNS_PER_SHARD,
            ssl=self.config.ssl or False,
            keepalive_timeout=60.0,
        )
        # json_serialize is unused (we send bytes) but set for any helper that might use it.
        return aiohttp.ClientSession(
            connector=connector,
            headers=self._base_headers,
            json_serialize=lambda o: orjson.dumps(o).decode(),
            auto_decompress=True,
            skip_auto_headers=("Accept-Encoding",),
            # Without a kubeconfig proxy-url the API server is dialled directly, HTTP(S)_PROXY ignored
            # (client-go would honour them): CI runners and dev machines often set them for package
            # registries, and sending the controller's API traffic there would break or leak it.
            trust_env=False,
        )

    def _session(self, watch: bool = False) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("ApiClient is closed")
        if watch and self._separate_watch:
            if self._watch_session is None:
                self._watch_session = self._new_session()
            return self._watch_session
        if len(self._sessions) < self._connections:
            # Each shard is dialed on first use (spec §5.6).
            self._sessions.append(self._new_session())
            return self._sessions[-1]
        if self._connections == 1:
            return self._sessions[0]
        return self._sessions[next(self._rr) % self._connections]

    def _observe(self, method: str, code: str, elapsed: float) -> None:
        child = self._metric_children.get((code, method))
        if child is None:
            child = self._metric_children[(code, method)] = REST_CLIENT_REQUESTS.labels(
                code, method, self._host
            )
        child.inc()
        hist = self._duration_children.get(method)
        if hist is None:
            hist = self._duration_children[method] = REST_CLIENT_DURATION.labels(method, self._host)
        hist.observe(elapsed)

    def _routed(self) -> dict[str, Any]:
        """Per-request connection options; call after `_headers` (which runs an exec plugin when due).
        aiohttp keys pooled connections by `ssl`: a renewed plugin certificate gets new connections."""
        tls = self._plugin.tls if self._plugin is not None else None
        return self._route if tls is None else {**self._route, "ssl": tls}

    async def _headers(self, content_type: str | None) -> dict[str, str]:
        headers: dict[str, str] = {}
        auth = await self.config.auth.header()
        if auth:
            headers["Authorization"] = auth
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _check_write(self, method: str) -> None:
        if method != "GET" and self._write_gate is not None:
            self._write_gate()

    def set_write_gate(self, gate: Callable[[], None] | None) -> None:
        """Call `gate()` before every write (any method but GET), and again once its connection is
        acquired, right before it is sent; the gate raises to refuse the write.

        The manager installs one that raises `NotLeader` when leadership is not current. Clones do not
        inherit it (the leader elector's own clone must always be able to renew).
        """
        self._write_gate = gate

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: str = "",
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> bytes:
        """Send one request and return the raw response body; raise the mapped error on failure.

        Args:
            method: HTTP method.
            path: absolute API path ("/api/v1/namespaces/x/pods").
            query: pre-encoded query string without "?".
            body: request body bytes.
            content_type: Content-Type of `body`.
        """
        if not self._bucket.unlimited:
            delay = self._bucket.reserve()
            if delay > 0:
                await asyncio.sleep(delay)
        url = URL(f"{self._base}{path}?{query}" if query else f"{self._base}{path}", encoded=True)
        refreshed = dropped = False
        throttled = 0
        while True:
            headers = await self._headers(content_type)
            # Asked here (no connection is taken for a write that cannot go out) and again by the
            # connector once the connection is in hand (`GatedConnector`).
            self._check_write(method)
            # perf_counter, not loop.time(): uvloop's loop time has millisecond resolution and is cached per
            # loop iteration, so durations came out as 0 or whole milliseconds.
            start = time.perf_counter()
            try:
                async with self._session().request(
                    method, url, data=body, headers=headers, timeout=self._timeout, **self._routed()
                ) as resp:
                    data = await resp.read()
                    status = resp.status
                    retry_after = resp.headers.get("Retry-After")
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # A keep-alive socket closed by the server surfaces on reuse; GET is safe to resend once.
                if method == "GET" and not dropped:
                    dropped = True
                    continue
                self._observe(method, "<error>", time.perf_counter() - start)
                raise TransportError(f"{method} {path}: {describe_error(exc)}") from exc
            except TimeoutError as exc:
                self._observe(method, "<error>", time.perf_counter() - start)
                raise Timeout(f"{method} {path}: timed out") from exc
            except aiohttp.ClientError as exc:
                self._observe(method, "<error>", time.perf_counter() - start)
                if isinstance(exc.__cause__, NotLeader):  # refused at the socket (GatedTransport)
                    raise exc.__cause__ from None
                raise TransportError(f"{method} {path}: {describe_error(exc)}") from exc
            self._observe(method, str(status), time.perf_counter() - start)
            if status < 400:
                return data
            if status == 401 and not refreshed and await self.config.auth.refresh():
                refreshed = True
                continue
            wait = _retry_after_seconds(retry_after)
            if status == 429 and throttled < _MAX_429_RETRIES:
                throttled += 1
                await asyncio.sleep(wait if wait is not None else 1.0)
                continue
            raise error_from_status(status, data, retry_after=wait)

    async def _json(
        self,
        method: str,
        path: str,
        *,
        query: str = "",
        body: Any = None,
        content_type: str | None = None,
    ) -> Any:
        raw = body if body is None or isinstance(body, bytes) else orjson.dumps(body)
        data = await self.request(
            method, path, query=query, body=raw, content_type=content_type or (_JSON if raw else None)
        )
        return orjson.loads(data) if data else None

    async def _watch_stream(
        self, path: str, query: str, timeout_seconds: int | None, bookmarks: bool = False
    ) -> AsyncIterator[WatchEvent]:
        if not self._bucket.unlimited:
            delay = self._bucket.reserve()
            if delay > 0:
                await asyncio.sleep(delay)
        url = URL(f"{self._base}{path}?{query}", encoded=True)
        # No total timeout; a read gap longer than the server timeout (+ margin) means a dead connection - or,
        # with bookmarks, longer than WATCH_BOOKMARK_GAP: the watch cache sends one a minute. Without that, a
        # connection a proxy or NAT froze kept an informer on a stale view for up to 10 minutes (a router sent
        # a deleted sandbox's name to the pod that took its IP for 5, until December 6; client-go notices in
        # ~45 s by HTTP/2 ping).
        read_gap: float | None = (timeout_seconds + 30) if timeout_seconds else None
        if bookmarks:
            read_gap = min(read_gap or WATCH_BOOKMARK_GAP, WATCH_BOOKMARK_GAP)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout, sock_read=read_gap)
        headers = await self._headers(None)
        start = time.perf_counter()  # not loop.time(): see request()
        answered = False
        try:
            async with self._session(watch=True).get(
                url, headers=headers, timeout=timeout, **self._routed()
            ) as resp:
                # client-go's label: a watch is the GET it is sent as (`r.verb`), not "WATCH".
                self._observe("GET", str(resp.status), time.perf_counter() - start)
                answered = True
                if resp.status >= 400:
                    raise error_from_status(resp.status, await resp.read())
                buf = b""
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    if b"\n" not in chunk:
                        continue
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if line:
                            yield _decode_event(line)
                if buf.strip():
                    yield _decode_event(buf)
        except TimeoutError as exc:
            if not answered:
                self._observe("GET", "<error>", time.perf_counter() - start)
            raise Timeout(f"watch {path}: read timed out") from exc
        except aiohttp.ClientError as exc:
            # A watch that never got its response (refused, reset, TLS) is client-go's "<error>", as any
            # request's; one cut after its 200 was already counted (until December 7 neither was: a
            # 30 s API server outage moved `code="<error>"` by one).
            if not answered:
                self._observe("GET", "<error>", time.perf_counter() - start)
            raise TransportError(f"watch {path}: {describe_error(exc)}") from exc


def _retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _decode_event(line: bytes) -> WatchEvent:
    event = orjson.loads(line)
    etype: str = event.get("type", "")
    obj = event.get("object") or {}
    if etype == "ERROR":
        raise error_from_status(int(obj.get("code") or 500), obj)
    if etype not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
        raise ApiError(500, "InternalError", f"unknown watch event type {etype!r}")
    kind: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"] = etype  # type: ignore[assignment]
    return WatchEvent(kind, obj)
