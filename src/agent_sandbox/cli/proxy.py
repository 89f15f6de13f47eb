"""`agent-sandbox proxy CLAIM PORT`: a local HTTP address for a port inside a sandbox, through the router.

A browser cannot add the router's `X-Sandbox-*` headers, so the app an agent built in a sandbox (a dev server,
a notebook) could not be opened from one. This listens on a local address and forwards every request - bodies
streamed both ways, WebSockets relayed message by message - to the router with the routing headers added.
Like `kubectl port-forward`, it runs until Ctrl-C; unlike it, it needs only the router (no pod access).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping

import aiohttp
from aiohttp import web

__all__ = ["SandboxProxy", "serve_proxy"]

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
_WebSocket = aiohttp.ClientWebSocketResponse | web.WebSocketResponse


class SandboxProxy:
    """An aiohttp application that sends everything it receives to one sandbox port through the router."""

    def __init__(self, router_url: str, routing: Mapping[str, str]) -> None:
        self.router_url = router_url.rstrip("/")
        self.routing = dict(routing)
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=0)  # bodies are streamed, never held whole
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _: web.Application) -> None:
        # No decompression: the browser gets the sandbox's bytes and Content-Encoding as they were sent.
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )

    async def _stop(self, _: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def _headers(self, request: web.Request, *, websocket: bool = False) -> dict[str, str]:
        skip = _HOP_BY_HOP | (_WS_HANDSHAKE if websocket else frozenset())
        tokens = {t.strip().lower() for t in request.headers.get("Connection", "").split(",")}
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() not in skip
            and name.lower() not in tokens
            and not name.lower().startswith("x-sandbox-")
        }
        headers.update(self.routing)
        return headers

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        url = self.router_url + request.path_qs
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._websocket(request, url)
        try:
            upstream = await self._session.request(
                request.method,
                url,
                headers=self._headers(request),
                data=request.content if request.body_exists else None,
                allow_redirects=False,
            )
        except aiohttp.ClientError as err:
            return web.json_response({"detail": f"router {self.router_url}: {err}"}, status=502)
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":  # set below
                    response.headers.add(name, value)
            if upstream.headers.get("Content-Length") is not None:
                response.content_length = int(upstream.headers["Content-Length"])
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def _websocket(self, request: web.Request, url: str) -> web.StreamResponse:
        assert self._session is not None
        protocols = [
            p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
        ]
        headers = {
            k: v
            for k, v in self._headers(request, websocket=True).items()
            if k.lower() != "sec-websocket-protocol"
        }
        try:
            # No message size limit on either side (aiohttp's default is 4 MiB): a relay does not decide how
            # large a notebook's output or an app's upload may be; the two ends have their own limits.
            upstream = await self._session.ws_connect(
                url, headers=headers, protocols=protocols, autoping=True, max_msg_size=0
            )
        except aiohttp.WSServerHandshakeError as err:
            return web.json_response(
                {"detail": f"sandbox refused the WebSocket: {err.message}"}, status=err.status
            )
        except aiohttp.ClientError as err:
            return web.json_response({"detail": f"router {self.router_url}: {err}"}, status=502)
        client = web.WebSocketResponse(
            protocols=[upstream.protocol] if upstream.protocol else (), max_msg_size=0
        )
        await client.prepare(request)

        async def pump(source: _WebSocket, sink: _WebSocket) -> None:
            code, reason = int(aiohttp.WSCloseCode.OK), b""
            while True:
                message = await source.receive()
                if message.type == aiohttp.WSMsgType.TEXT:
                    await sink.send_str(message.data)
                elif message.type == aiohttp.WSMsgType.BINARY:
                    await sink.send_bytes(message.data)
                elif message.type == aiohttp.WSMsgType.CLOSE:  # the code and reason go on as they were sent
                    code, reason = int(message.data), str(message.extra or "").encode()
                    break
                else:  # CLOSING, CLOSED, ERROR: the peer went without a close frame of its own
                    code = source.close_code or int(aiohttp.WSCloseCode.GOING_AWAY)
                    break
            await sink.close(code=code, message=reason)

        async with upstream:
            _, pending = await asyncio.wait(
                [
                    asyncio.ensure_future(pump(client, upstream)),
                    asyncio.ensure_future(pump(upstream, client)),
                ],
                return_when=asyncio.FIRST_COMPLETED,
            )
            for task in pending:
                task.cancel()
        return client


async def serve_proxy(
    router_url: str, routing: Mapping[str, str], *, address: str, port: int, describe: str
) -> None:
    """Serve until cancelled (Ctrl-C), after printing the local URL on standard output."""
    runner = web.AppRunner(SandboxProxy(router_url, routing).app(), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, address, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        host = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        print(f"http://{host}:{bound[1]}/", flush=True)
        print(f"forwarding to {describe} through {router_url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
