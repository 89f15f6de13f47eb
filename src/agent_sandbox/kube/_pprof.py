"""Profiling endpoints on the metrics server (`--enable-pprof`, `--enable-pprof-debug`), Python edition.

Go's pprof has no direct Python equivalent; these are the closest useful analogues:

* `/debug/pprof/profile?seconds=N` (`--enable-pprof`): cProfile of the event-loop thread for N seconds
  (default 30), returned as pstats text sorted by cumulative time.
* with `--enable-pprof-debug` also: `/debug/pprof/` (index), `cmdline`, `goroutine` (stacks of all
  asyncio tasks), `heap` (tracemalloc top allocations if tracing is on, else live object counts by type),
  and `/debug/fgprof` (same capture as `profile`; one at a time, a concurrent request gets HTTP 500 as
  upstream). `symbol`, `allocs`, `block`, `mutex` and `trace` answer 501: no Python counterpart.
  `--pprof-block-profile-rate` / `--pprof-mutex-profile-fraction` are accepted for compatibility only.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import io
import pstats
import sys
import tracemalloc
from collections import Counter

from aiohttp import web

__all__ = ["add_pprof_routes"]

_INDEX = ["profile", "cmdline", "goroutine", "heap", "allocs", "block", "mutex", "symbol", "trace"]


async def _capture(request: web.Request) -> web.Response:
    try:
        seconds = min(max(float(request.query.get("seconds", "30")), 0.1), 600.0)
    except ValueError:
        return web.Response(status=400, text="bad seconds\n")
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        await asyncio.sleep(seconds)
    finally:
        profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(200)
    return web.Response(text=out.getvalue())


def add_pprof_routes(app: web.Application, *, debug: bool) -> None:
    """Mount the profile route, and with `debug` the full set (see module docstring)."""
    app.router.add_get("/debug/pprof/profile", _capture)
    if not debug:
        return
    busy = asyncio.Lock()

    async def fgprof(request: web.Request) -> web.Response:
        if busy.locked():
            return web.Response(status=500, text="a profile is already being captured\n")
        async with busy:
            return await _capture(request)

    async def index(_: web.Request) -> web.Response:
        return web.Response(text="\n".join(f"/debug/pprof/{n}" for n in _INDEX) + "\n/debug/fgprof\n")

    async def cmdline(_: web.Request) -> web.Response:
        return web.Response(text="\x00".join(sys.argv))

    async def goroutine(_: web.Request) -> web.Response:
        out = io.StringIO()
        tasks = asyncio.all_tasks()
        out.write(f"{len(tasks)} tasks\n\n")
        for task in tasks:
            out.write(f"{task.get_name()}:\n")
            task.print_stack(file=out)
            out.write("\n")
        return web.Response(text=out.getvalue())

    async def heap(_: web.Request) -> web.Response:
        if tracemalloc.is_tracing():
            stats = tracemalloc.take_snapshot().statistics("lineno")[:50]
            return web.Response(text="\n".join(str(s) for s in stats) + "\n")
        counts = Counter(type(o).__name__ for o in gc.get_objects())
        return web.Response(text="\n".join(f"{n}\t{c}" for c, n in counts.most_common(50)) + "\n")

    async def unsupported(_: web.Request) -> web.Response:
        return web.Response(status=501, text="not available in the Python runtime\n")

    app.router.add_get("/debug/pprof/", index)
    app.router.add_get("/debug/pprof/cmdline", cmdline)
    app.router.add_get("/debug/pprof/goroutine", goroutine)
    app.router.add_get("/debug/pprof/heap", heap)
    for name in ("symbol", "allocs", "block", "mutex", "trace"):
        app.router.add_get(f"/debug/pprof/{name}", unsupported)
    app.router.add_get("/debug/fgprof", fgprof)
