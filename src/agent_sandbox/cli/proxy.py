"""`agent-sandbox proxy CLAIM PORT`: a local HTTP address for a port inside a sandbox, through the router.

A browser cannot add the router's `X-Sandbox-*` headers, so the app an agent built in a sandbox (a dev server,
a notebook) could not be opened from one. This listens on a local address and forwards every request - bodies
streamed both ways, WebSockets relayed frame by frame (pings and close handshakes included) - to the router
with the routing headers added. Like `kubectl port-forward`, it runs until Ctrl-C, which stops it at once
(open WebSockets get 1001 "going away", streams are cut); unlike it, it needs only the router (no pod access).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import sys
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from types import SimpleNamespace

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from agent_sandbox_sdk._shared import router_token_headers

from .output import inform

__all__ = ["ListenError", "SandboxProxy", "serve_proxy"]

log = logging.getLogger(__name__)

# Hop-by-hop (RFC 9110 §7.6.1) and what the proxy sets itself: never copied from one side to the other.
# A request's Content-Length is kept: without it the body would go on chunked, which some servers refuse
# (Python's http.server reads only Content-Length bodies).
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
_WS_HANDSHAKE = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions"})
# Headers aiohttp's client adds when the request has none: the sandbox must see only what the browser sent
# (`Accept-Encoding: gzip, deflate` added for a client that did not ask made it receive compressed bytes).
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent")
# Close codes a close frame may carry (RFC 6455 §7.4.1-§7.4.2, IANA registry): 1005, 1006 and 1015 only
# describe a closure locally and must never be sent.
_SENDABLE_CLOSE = frozenset({1000, 1001, 1002, 1003, *range(1007, 1015)})
# Ctrl-C: how long an open WebSocket's peer gets to answer our 1001 before its connection is dropped.
_STOP_GRACE = 1.0
# A refused WebSocket handshake's body passed on to the client (router and app errors are small).
_ERROR_BODY_LIMIT = 1 << 20

_WebSocket = aiohttp.ClientWebSocketResponse | web.WebSocketResponse
# The refused handshake's body, read by the trace hook below while aiohttp still holds the response.
_handshake_body: ContextVar[list[bytes] | None] = ContextVar("_handshake_body", default=None)


class ListenError(Exception):
    """The local address could not be listened on (the port is taken, the address is not this host's)."""


class _TokenFile:
    """`--router-token-file`, read again whenever it changes: kubelet rotates a projected service-account
    token by swapping the file, and a proxy left running for hours must not keep sending the expired one."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""

    def authorization(self) -> str:
        """`Bearer <token>` as the file now reads; `ValueError` when it cannot be read or is empty."""
        try:
            st = os.stat(self.path)  # follows kubelet's `..data` symlink: a swap is a new inode
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                token = Path(self.path).read_text().strip()
                if not token:
                    raise ValueError(f"--router-token-file {self.path} is empty")
                self._token, self._stamp = token, stamp
        except OSError as err:
            raise ValueError(f"--router-token-file {self.path}: {err.strerror or err}") from None
        return router_token_headers(self._token)[
            "Authorization"
        ]  # a `Bearer ` prefix in the file is not doubled


def _valid(code: int | None) -> bool:
    """Whether a close frame may carry `code`."""
    return code is not None and (code in _SENDABLE_CLOSE or 3000 <= code <= 4999)


def _sendable(code: int | None) -> int:
    """`code` if a close frame may carry it; else what stands for it (no code -> 1000, reserved -> 1001)."""
    if code is not None and _valid(code):
        return code
    return int(aiohttp.WSCloseCode.OK if code in (0, 1005) else aiohttp.WSCloseCode.GOING_AWAY)


def _direct(router_url: str) -> bool:
    """Whether the router is reached by address (nothing in front of it can route on `Host`)."""
    host = URL(router_url).host or ""
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _keep_refused_body(
    _: aiohttp.ClientSession, __: SimpleNamespace, params: aiohttp.TraceRequestEndParams
) -> None:
    """Read a refused WebSocket handshake's body before `ws_connect` closes the response unread."""
    box = _handshake_body.get()
    if box is None or params.response.status == 101:
        return
    body = b""
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
        while len(body) < _ERROR_BODY_LIMIT:
            chunk = await params.response.content.read(_ERROR_BODY_LIMIT - len(body))
            if not chunk:
                break
            body += chunk
    box.append(body)


class SandboxProxy:
    """An aiohttp application that sends everything it receives to one sandbox port through the router.

    `token_file`: re-read for each request (when it changed); its token replaces any `Authorization` in
    `routing`.
    """

    def __init__(self, router_url: str, routing: Mapping[str, str], *, token_file: str | None = None) -> None:
        self.router_url = router_url.rstrip("/")
        self.routing = dict(routing)
        self._token = _TokenFile(token_file) if token_file else None
        self._router = URL(self.router_url)
        # Behind an ingress or a Gateway with host names `Host` selects the router: sent only when the router
        # is reached by address, so that it names the proxy in `X-Forwarded-Host` (what the app redirects to).
        self._pass_host = _direct(self.router_url)
        self._session: aiohttp.ClientSession | None = None
        self._active: set[asyncio.Task[object]] = set()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=0)  # bodies are streamed, never held whole
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_startup.append(self._start)
        app.on_shutdown.append(self._stop_requests)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _: web.Application) -> None:
        trace = aiohttp.TraceConfig()
        trace.on_request_end.append(_keep_refused_body)
        self._session = aiohttp.ClientSession(
            # No connection limit (aiohttp's default is 100): WebSockets and event streams hold theirs for
            # as long as the page is open, and the 101st request would wait for one of them to end.
            connector=aiohttp.TCPConnector(limit=0),
            # No decompression: the browser gets the sandbox's bytes and Content-Encoding as they were sent.
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=_NO_AUTO_HEADERS,
            trace_configs=[trace],
        )

    async def _stop_requests(self, _: web.Application) -> None:
        """Ctrl-C: end what is still open now, instead of aiohttp's wait for handlers (60 s, twice)."""
        tasks = [task for task in self._active if not task.done()]
        for task in tasks:
            task.cancel()  # a WebSocket relay closes both ends with 1001 first; a stream is cut
        if tasks:
            await asyncio.wait(tasks, timeout=_STOP_GRACE * 2)

    async def _stop(self, _: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def _headers(self, request: web.Request, *, websocket: bool = False) -> CIMultiDict[str]:
        """The client's headers as the router must get them: each header the proxy sets (routing, token,
        `Host`) replaces every client header of that name in any letter case - a plain dict kept a client's
        `authorization` beside the proxy's `Authorization`, and the router (as Go's `Header.Get`) read the
        client's first. Repeated client headers (`Cookie`, `Accept`) go on as they came."""
        skip = _HOP_BY_HOP | (_WS_HANDSHAKE if websocket else frozenset())
        tokens = {t.strip().lower() for t in request.headers.get("Connection", "").split(",")}
        headers: CIMultiDict[str] = CIMultiDict(
            (name, value)
            for name, value in request.headers.items()
            if name.lower() not in skip
            and name.lower() not in tokens
            and not name.lower().startswith("x-sandbox-")
        )
        headers.update(self.routing)  # CIMultiDict.update replaces all values of a name, in any case
        if self._token is not None:
            headers["Authorization"] = self._token.authorization()
        if self._pass_host:
            headers["Host"] = self._local(request)
        return headers

    @staticmethod
    def _local(request: web.Request) -> str:
        """The address the client used: its `Host`, else the socket it reached."""
        host = request.headers.get("Host")
        if host:
            return host
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        if not sockname:
            return "localhost"
        return f"[{sockname[0]}]:{sockname[1]}" if ":" in sockname[0] else f"{sockname[0]}:{sockname[1]}"

    def _location(self, request: web.Request, value: str) -> str:
        """An absolute redirect to the router (or to this address with the router's scheme) sent back here.

        An app that builds redirects from `X-Forwarded-Host`/`-Proto` (docs/router.md § Browsers) names the
        router when `Host` could not be passed, and `https` when the router is reached over TLS.
        """
        try:
            url = URL(value)
        except ValueError:
            return value
        if not url.is_absolute() or url.host is None:
            return value
        local = self._local(request)
        target = (url.scheme.lower(), url.host.lower(), url.port)
        router = (self._router.scheme, (self._router.host or "").lower(), self._router.port)
        try:
            mine = URL(f"{self._router.scheme}://{local}")
        except ValueError:
            return value
        path = url.raw_path
        if target == router:
            # Requests go to the router URL + the client's path: a redirect into the router's path (say
            # /router of https://gw.example.com/router) comes back as the path after it, and one outside it
            # is not this sandbox's (the proxy would send it to /router/<path>).
            prefix = self._router.raw_path.rstrip("/")
            if prefix:
                if path != prefix and not path.startswith(prefix + "/"):
                    return value
                path = path[len(prefix) :] or "/"
        elif target != (mine.scheme, (mine.host or "").lower(), mine.port):
            return value
        query = f"?{url.raw_query_string}" if url.raw_query_string else ""
        fragment = f"#{url.raw_fragment}" if url.raw_fragment else ""
        return f"http://{local}{path}{query}{fragment}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        self._active.add(task)
        try:
            try:
                headers = self._headers(request, websocket=_is_websocket(request))
            except ValueError as err:  # the token file went missing or empty
                return web.json_response({"detail": str(err)}, status=502)
            if _is_websocket(request):
                return await self._websocket(request, headers)
            return await self._http(request, headers)
        finally:
            self._active.discard(task)

    async def _http(self, request: web.Request, headers: CIMultiDict[str]) -> web.StreamResponse:
        assert self._session is not None
        try:
            upstream = await self._session.request(
                request.method,
                self.router_url + request.path_qs,
                headers=headers,
                data=request.content if request.body_exists else None,
                allow_redirects=False,
            )
        except ConnectionError:  # the client left during its upload
            return _abort(request, web.StreamResponse())
        except aiohttp.ClientError as err:
            return web.json_response({"detail": f"router {self.router_url}: {err}"}, status=502)
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                lname = name.lower()
                if lname in _HOP_BY_HOP or lname == "content-length":  # set below
                    continue
                response.headers.add(name, self._location(request, value) if lname == "location" else value)
            if upstream.headers.get("Content-Length") is not None:
                response.content_length = int(upstream.headers["Content-Length"])
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (ConnectionError, aiohttp.ClientError) as err:
                # The client went (a cancelled download, a closed event stream) or the sandbox did: neither
                # is this proxy's error, and the client must not see a truncated body as a complete one.
                log.debug("%s %s ended early: %r", request.method, request.path, err)
                return _abort(request, response)
            return response

    async def _websocket(self, request: web.Request, headers: CIMultiDict[str]) -> web.StreamResponse:
        assert self._session is not None
        protocols = [
            p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
        ]
        headers.popall("Sec-WebSocket-Protocol", None)  # ws_connect sends `protocols` itself
        refused: list[bytes] = []
        _handshake_body.set(refused)
        try:
            # No message size limit on either side (aiohttp's default is 4 MiB): a relay does not decide how
            # large a notebook's output or an app's upload may be; the two ends have their own limits.
            # Pings, pongs and close frames are the two ends' business: relayed, never answered here.
            upstream = await self._session.ws_connect(
                self.router_url + request.path_qs,
                headers=headers,
                protocols=protocols,
                autoping=False,
                autoclose=False,
                max_msg_size=0,
            )
        except aiohttp.WSServerHandshakeError as err:
            if err.status == 101:  # the router or app said yes, but not in a way aiohttp accepts
                return web.json_response({"detail": f"WebSocket handshake: {err.message}"}, status=502)
            # The router's or the app's own answer (401 expired token, 404, 429, 502 sandbox gone).
            response = web.Response(status=err.status, body=refused[0] if refused else b"")
            for name, value in (err.headers or {}).items():
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                    response.headers.add(name, value)
            return response
        except aiohttp.ClientError as err:
            return web.json_response({"detail": f"router {self.router_url}: {err}"}, status=502)
        finally:
            _handshake_body.set(None)
        client = web.WebSocketResponse(
            protocols=[upstream.protocol] if upstream.protocol else (),
            max_msg_size=0,
            autoping=False,
            autoclose=False,
        )
        try:
            await client.prepare(request)
        except BaseException:
            await upstream.close(code=int(aiohttp.WSCloseCode.GOING_AWAY))
            raise
        try:
            await _relay(client, upstream)
        except asyncio.CancelledError:  # Ctrl-C: both ends are told, as a server going down tells them
            with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
                await asyncio.wait_for(
                    asyncio.gather(
                        client.close(code=int(aiohttp.WSCloseCode.GOING_AWAY), message=b"proxy stopped"),
                        upstream.close(code=int(aiohttp.WSCloseCode.GOING_AWAY)),
                    ),
                    _STOP_GRACE,
                )
            raise
        finally:
            if not upstream.closed:
                await upstream.close(code=int(aiohttp.WSCloseCode.GOING_AWAY))
        return client


def _is_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


def _abort(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """Drop the client's connection; the response is returned only for aiohttp, whose write of the end of
    the body then fails quietly (a chunked body must not end with its last-chunk as if complete)."""
    if request.transport is not None:
        request.transport.close()
    return response


# `_pump`'s code when it stopped because its sink failed, not its source: the sink's side is the one gone.
_SINK_GONE = -1


async def _pump(source: _WebSocket, sink: _WebSocket) -> tuple[bool, int, bytes]:
    """Relay frames until the source stops: (it sent a close frame, its code, its reason), or
    (False, `_SINK_GONE`, b"") when sending to the sink failed."""
    while True:
        message = await source.receive()
        kind = message.type
        try:
            if kind == aiohttp.WSMsgType.TEXT:
                await sink.send_str(message.data)
            elif kind == aiohttp.WSMsgType.BINARY:
                await sink.send_bytes(message.data)
            elif kind == aiohttp.WSMsgType.PING:
                await sink.ping(message.data)
            elif kind == aiohttp.WSMsgType.PONG:
                await sink.pong(message.data)
            elif kind == aiohttp.WSMsgType.CLOSE:  # the code and reason go on as they were sent
                return True, int(message.data), str(message.extra or "").encode()
            else:  # CLOSING, CLOSED, ERROR: the peer went without a close frame of its own
                return False, 0, b""
        except ConnectionError:
            return False, _SINK_GONE, b""


async def _relay(client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse) -> None:
    """Relay both ways; the side that closes first has its close handshake completed by the other end.

    The close is passed on and the other end's answer awaited before the closing side gets its own answer,
    as if the two were connected: a browser whose server closes gets a clean close (`wasClean`). A side
    that goes without a close frame (a deleted sandbox, a killed browser) leaves the other with 1001.
    """
    to_upstream = asyncio.ensure_future(_pump(client, upstream))
    to_client = asyncio.ensure_future(_pump(upstream, client))
    going_away = int(aiohttp.WSCloseCode.GOING_AWAY)
    try:
        await asyncio.wait([to_upstream, to_client], return_when=asyncio.FIRST_COMPLETED)
        first = to_upstream if to_upstream.done() else to_client
        clean, code, reason = first.result()
        browser_ended = (first is to_upstream) != (code == _SINK_GONE)
        if browser_ended:
            if not clean:  # nothing more to read from the browser
                to_upstream.cancel()
            # close() from here is aiohttp's way to stop the other pump's receive(); it then awaits the
            # sandbox's answering close frame.
            await upstream.close(code=_sendable(code) if clean else going_away, message=reason)
            await asyncio.gather(to_upstream, to_client, return_exceptions=True)
            if clean:  # the browser's close answered with the sandbox's code (its own when there was none)
                answer = upstream.close_code
                await client.close(code=_sendable(answer if _valid(answer) else code))
        else:
            # The browser side's reader must be stopped first: aiohttp's close() from another task would
            # drop the browser's connection before its answering close frame arrives.
            to_upstream.cancel()
            await asyncio.gather(to_upstream, return_exceptions=True)
            await client.close(code=_sendable(code) if clean else going_away, message=reason)
            answer = client.close_code
            reply = _sendable(answer if _valid(answer) else code) if clean else going_away
            await upstream.close(code=reply)
            await asyncio.gather(to_client, return_exceptions=True)
    finally:
        for task in (to_upstream, to_client):
            task.cancel()


def _listen_reason(err: OSError) -> str:
    """Why an address cannot be listened on, in the system's words.

    asyncio's message repeats the address, so a bind's errno is said by its text ("Address already in use"). A
    name that does not resolve is the resolver's `gaierror`, whose negative codes are not errnos: its own text
    ("Name or service not known"; until December 7 `os.strerror` made it "Unknown error -2").
    """
    if isinstance(err, socket.gaierror):
        return err.strerror or str(err)
    return os.strerror(err.errno) if err.errno else str(err)


async def serve_proxy(
    router_url: str,
    routing: Mapping[str, str],
    *,
    address: str,
    port: int,
    describe: str,
    token_file: str | None = None,
) -> None:
    """Serve until cancelled (Ctrl-C), after printing the local URL on standard output.

    Raises:
        ListenError: `address`:`port` cannot be listened on.
    """
    proxy = SandboxProxy(router_url, routing, token_file=token_file)
    # shutdown_timeout: only a backstop; open requests are ended by the proxy's own on_shutdown.
    runner = web.AppRunner(proxy.app(), access_log=None, shutdown_timeout=_STOP_GRACE)
    await runner.setup()
    try:
        site = web.TCPSite(runner, address, port)
        try:
            await site.start()
        except OSError as err:
            raise ListenError(f"cannot listen on {address}:{port}: {_listen_reason(err)}") from None
        bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        host = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        url = f"http://{host}:{bound[1]}/"
        if not inform(url):  # `>&-`: information, not the result - said on stderr, and the proxy serves on
            print(url, file=sys.stderr, flush=True)
        print(f"forwarding to {describe} through {router_url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        # Awake once a second, not idle for good: Python runs a signal's handler (asyncio's Ctrl-C) only in the
        # main thread's bytecode, and a SIGINT taken by another thread (kill(2) picks any thread of the process)
        # does not wake the loop out of epoll - a fresh-clone CI run once saw Ctrl-C ignored for 60 s.
        while True:  # noqa: ASYNC110 - no event to wait for: the point is to wake
            await asyncio.sleep(1.0)
    finally:
        await runner.cleanup()
