"""A small dev server that the browser test runs *inside* a sandbox (written there with `files.write`,
started with `commands.run`): a page with a script, an upload echo, a response held open between two
chunks, a revalidated resource, cookies, a download and a WebSocket echo (with a Jupyter-style
subprotocol). It uses only aiohttp (a dependency of this project, so the local runner's
Python has it).

    python browser_app.py <host> <port> <lifetime seconds>

It exits by itself after its lifetime, so a test that dies half-way leaves no server behind.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys

from aiohttp import WSMsgType, web

PAGE = """<!doctype html>
<html><head><title>sandbox app</title><script src="/app.js"></script></head>
<body><p id="who">loading</p></body></html>
"""

# The page's own script: fills #who from /whoami, proving a sub-resource and a fetch went through too.
SCRIPT = """
window.addEventListener("DOMContentLoaded", async () => {
  const r = await fetch("/whoami");
  document.getElementById("who").textContent = await r.text();
});
"""


async def page(_: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html")


async def script(_: web.Request) -> web.Response:
    return web.Response(text=SCRIPT, content_type="text/javascript")


async def whoami(_: web.Request) -> web.Response:
    return web.Response(text=os.environ.get("HOSTNAME", ""))


async def echo(request: web.Request) -> web.Response:
    body = await request.read()
    return web.json_response({"length": len(body), "sha256": hashlib.sha256(body).hexdigest()})


async def cached(request: web.Request) -> web.Response:
    """A revalidated resource: the browser's second fetch carries If-None-Match and gets a 304."""
    if request.headers.get("If-None-Match") == '"v1"':
        request.app["revalidated"] += 1
        return web.Response(status=304, headers={"ETag": '"v1"'})
    return web.Response(text="cached body", headers={"ETag": '"v1"', "Cache-Control": "no-cache"})


async def stats(request: web.Request) -> web.Response:
    return web.json_response({"revalidated": request.app["revalidated"]})


async def login(_: web.Request) -> web.Response:
    """Two Set-Cookie headers: a proxy that folds them into one loses a cookie."""
    response = web.Response(text="ok")
    response.set_cookie("session", "s1", path="/")
    response.set_cookie("theme", "dark", path="/")
    return response


async def cookies(request: web.Request) -> web.Response:
    return web.json_response(dict(request.cookies))


async def download(request: web.Request) -> web.Response:
    """`n` bytes, byte i being i % 251 (so a dropped or repeated chunk shows)."""
    n = int(request.query["n"])
    pattern = bytes(range(251)) * (n // 251 + 1)
    return web.Response(body=pattern[:n], content_type="application/octet-stream")


async def held(request: web.Request) -> web.StreamResponse:
    """One chunk now, the second only after /release: the client can read the first only if every hop
    streams (a buffering proxy would deliver nothing until the client gives up)."""
    release: asyncio.Event = request.app["release"]
    release.clear()
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    await response.write(b"first\n")
    await release.wait()
    await response.write(b"second\n")
    await response.write_eof()
    return response


async def release(request: web.Request) -> web.Response:
    request.app["release"].set()
    return web.Response(text="released")


async def websocket(request: web.Request) -> web.WebSocketResponse:
    """Echo; the text `close:<code>` makes the server close with that code and reason `bye`."""
    ws = web.WebSocketResponse(max_msg_size=64 << 20, protocols=("v1.kernel.websocket.jupyter.org",))
    await ws.prepare(request)
    async for msg in ws:
        if msg.type == WSMsgType.TEXT and msg.data.startswith("close:"):
            await ws.close(code=int(msg.data.removeprefix("close:")), message=b"bye")
        elif msg.type == WSMsgType.TEXT:
            await ws.send_str(msg.data)
        elif msg.type == WSMsgType.BINARY:
            await ws.send_bytes(msg.data)
    return ws


async def serve(host: str, port: int, lifetime: float) -> None:
    app = web.Application(client_max_size=64 << 20)
    app["release"] = asyncio.Event()
    app["revalidated"] = 0
    app.add_routes(
        [web.get(path, handler) for path, handler in (
            ("/", page), ("/app.js", script), ("/whoami", whoami), ("/cached", cached), ("/stats", stats),
            ("/login", login), ("/cookies", cookies), ("/download", download), ("/held", held),
            ("/release", release), ("/ws", websocket),
        )]
        + [web.post("/echo", echo)]
    )  # fmt: skip
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    await asyncio.sleep(lifetime)
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
