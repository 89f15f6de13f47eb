"""A small REST backend for the router benchmark (`python -m benchmarks.router.backend IP PORT`).

aiohttp on uvloop, one process: `GET /` -> 11-byte JSON, `GET|POST /4k` -> 4 KiB body (the request body is
read), `GET /hold/<seconds>` -> answers after that long (open streams for the RSS measurement), `GET /stream/<seconds>`
-> a chunked body, one line every 0.5 s for that long (long-lived streams, benchmarks/reliability/router_streams.py).
"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web

_SMALL = b'{"ok":true}'
_4K = b"y" * 4096


async def small(_: web.Request) -> web.Response:
    return web.Response(body=_SMALL, content_type="application/json")


async def four_k(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=_4K, content_type="application/octet-stream")


async def hold(request: web.Request) -> web.Response:
    await asyncio.sleep(float(request.match_info["seconds"]))
    return web.Response(body=_SMALL, content_type="application/json")


async def stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    end = asyncio.get_running_loop().time() + float(request.match_info["seconds"])
    while asyncio.get_running_loop().time() < end:
        await resp.write(_SMALL + b"\n")
        await asyncio.sleep(0.5)
    await resp.write_eof()
    return resp


def app() -> web.Application:
    application = web.Application()
    application.router.add_get("/", small)
    application.router.add_route("*", "/4k", four_k)
    application.router.add_get("/hold/{seconds}", hold)
    application.router.add_get("/stream/{seconds}", stream)
    return application


def main() -> None:
    ip, port = sys.argv[1], int(sys.argv[2])
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(app(), host=ip, port=port, access_log=None, print=None, backlog=4096)


if __name__ == "__main__":
    main()
