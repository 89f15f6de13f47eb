"""Transport micro-benchmark behind docs/design/kube-client-aiohttp.md (run by hand, not part of tests).

Measures GET requests/s of aiohttp vs httpx (AsyncClient, HTTP/1.1, one pool) at a fixed concurrency,
against (a) a local aiohttp server returning a small JSON object and (b) optionally a local
kube-apiserver (GET of one ConfigMap through `ApiClient` vs raw httpx with the same TLS context and
auth), plus orjson vs json decode of a 500-Pod list.

    .venv/bin/python benchmarks/kube_transport.py [--kubeconfig PATH] [--requests 4000] [--concurrency 50]

httpx is not a project dependency; put it on PYTHONPATH to include it (e.g. pip install --target DIR).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from agent_sandbox.kube import CONFIG_MAP, ApiClient, load_config

BODY = orjson.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "y"}})


async def _rate(n: int, conc: int, call: Callable[[], Awaitable[Any]]) -> float:
    for _ in range(50):  # warm up pools
        await call()
    sem = asyncio.Semaphore(conc)

    async def one() -> None:
        async with sem:
            await call()

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return n / (time.perf_counter() - start)


async def local_server(n: int, conc: int) -> dict[str, float]:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(body=BODY, content_type="application/json")

    app = web.Application()
    app.router.add_get("/x", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}/x"
    out: dict[str, float] = {}
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as s:

        async def aio() -> Any:
            async with s.get(url) as r:
                return orjson.loads(await r.read())

        out["aiohttp"] = await _rate(n, conc, aio)
    try:
        import httpx

        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=100)) as c:

            async def hx() -> Any:
                return orjson.loads((await c.get(url)).content)

            out["httpx"] = await _rate(n, conc, hx)
    except ImportError:
        pass
    await runner.cleanup()
    return out


async def apiserver(kubeconfig: str, n: int, conc: int) -> dict[str, float]:
    out: dict[str, float] = {}
    async with ApiClient(load_config(kubeconfig)) as api:
        ns = "default"
        name = "bench-transport"
        with contextlib.suppress(Exception):
            await api.create(CONFIG_MAP, {"metadata": {"name": name}, "data": {"a": "b"}}, namespace=ns)
        out["ApiClient(aiohttp)"] = await _rate(n, conc, lambda: api.get(CONFIG_MAP, name, namespace=ns))
        try:
            import httpx

            cfg = api.config
            auth = await cfg.auth.header()
            headers = {"Authorization": auth} if auth else {}
            async with httpx.AsyncClient(
                verify=cfg.ssl or False, limits=httpx.Limits(max_connections=100), headers=headers
            ) as c:
                url = f"{cfg.server}{CONFIG_MAP.path(ns, name)}"

                async def hx() -> Any:
                    return orjson.loads((await c.get(url)).content)

                out["httpx"] = await _rate(n, conc, hx)
        except ImportError:
            pass
        await api.delete(CONFIG_MAP, name, namespace=ns)
    return out


def decode() -> dict[str, float]:
    pod = {
        "metadata": {"name": "p" * 20, "namespace": "ns", "labels": {f"k{i}": "v" * 10 for i in range(8)}},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "env": [{"name": "A", "value": "B"}] * 10}]
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}] * 4},
    }
    raw = orjson.dumps({"items": [pod] * 500})
    out = {}
    for name, fn in (("orjson", orjson.loads), ("json", json.loads)):
        best = float("inf")
        for _ in range(7):  # best of 7: the box is shared, take the least disturbed round
            start = time.perf_counter()
            for _ in range(20):
                fn(raw)
            best = min(best, time.perf_counter() - start)
        out[name] = 20 / best
    return out


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig")
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--concurrency", type=int, default=50)
    a = p.parse_args()
    print(
        "local aiohttp server, req/s:",
        {k: round(v) for k, v in (await local_server(a.requests, a.concurrency)).items()},
    )
    if a.kubeconfig:
        print(
            "kube-apiserver GET configmap, req/s:",
            {k: round(v) for k, v in (await apiserver(a.kubeconfig, a.requests, a.concurrency)).items()},
        )
    print("decode 500-pod list, lists/s:", {k: round(v, 1) for k, v in decode().items()})


if __name__ == "__main__":
    asyncio.run(main())
