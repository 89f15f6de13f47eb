"""The app `test_proxy_relay.py` starts inside a sandbox: `python proxy_relay_app.py HOST PORT`.

GET /echo: the request's headers as JSON. GET /redirect?to=URL: 302 to URL; GET /redirect: 302 to /echo
built from `X-Forwarded-Proto`/`-Host`, as a framework "behind a proxy" builds it. GET /hold: a response
that sends one line and then stays open. GET /ws: a WebSocket (pings answered by hand, so that it can tell
they reached it) that echoes text and obeys `ping:DATA` (it pings), `close:CODE:REASON` (it closes),
`drop` (its connection goes, with no close frame). GET /last-close: the close code its last WebSocket got.
"""

import asyncio
import sys

from aiohttp import WSMsgType, web

last_close: list[object] = [None]


async def echo(request: web.Request) -> web.Response:
    return web.json_response(dict(request.headers))


async def redirect(request: web.Request) -> web.Response:
    to = request.query.get("to")
    if to is None:
        proto = request.headers.get("X-Forwarded-Proto", "http")
        to = f"{proto}://{request.headers.get('X-Forwarded-Host')}/echo?from=redirect"
    raise web.HTTPFound(to)


async def hold(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"data: held\n\n")
    await asyncio.Event().wait()
    return response


async def ws(request: web.Request) -> web.WebSocketResponse:
    sock = web.WebSocketResponse(autoping=False, heartbeat=None)
    await sock.prepare(request)
    async for message in sock:
        if message.type == WSMsgType.PING:
            await sock.pong(message.data)
            await sock.send_str("got ping " + message.data.decode())
        elif message.type == WSMsgType.TEXT and message.data.startswith("ping:"):
            await sock.ping(message.data[5:].encode())
        elif message.type == WSMsgType.TEXT and message.data.startswith("close:"):
            _, code, reason = message.data.split(":", 2)
            await sock.close(code=int(code), message=reason.encode())
        elif message.type == WSMsgType.TEXT and message.data == "drop":
            assert request.transport is not None
            request.transport.abort()
        elif message.type == WSMsgType.TEXT:
            await sock.send_str(message.data)
    last_close[0] = sock.close_code
    return sock


async def last(request: web.Request) -> web.Response:
    return web.Response(text=str(last_close[0]))


app = web.Application()
app.router.add_get("/echo", echo)
app.router.add_get("/redirect", redirect)
app.router.add_get("/hold", hold)
app.router.add_get("/ws", ws)
app.router.add_get("/last-close", last)
web.run_app(app, host=sys.argv[1], port=int(sys.argv[2]), print=None)
