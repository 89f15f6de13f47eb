"""A command's output stream through the router outlives the router's idle limit while the command is quiet:
the runtime (this project's `/execute/stream`) sends a blank NDJSON line after `--stream-keepalive` of
silence, and the router relays it like any byte. Real runtime server, real router, in process."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest

from agent_sandbox.router import Router
from agent_sandbox.runtime.config import RuntimeConfig
from agent_sandbox.runtime.server import RuntimeServer

from .conftest import fresh_ip, raw_request, request_bytes

pytestmark = pytest.mark.integration

QUIET = b'{"command": "sh -c \'echo before; sleep 2.5; echo after\'"}'


async def _stream_through(router: Router, runtime: RuntimeServer, ip: str) -> tuple[list[bytes], float]:
    headers = {
        "X-Sandbox-ID": "quiet",
        "X-Sandbox-Pod-IP": ip,
        "X-Sandbox-Port": str(runtime.ports["legacy"]),
        "Content-Type": "application/json",
    }
    start = time.monotonic()
    resp = await raw_request(
        router.http_port or 0, request_bytes("POST", "/execute/stream", headers, QUIET), within=10
    )
    assert resp.status == 200
    return resp.body.split(b"\n"), time.monotonic() - start


@pytest.mark.parametrize("keepalive", [0.4, 0.0], ids=["keepalive", "none"])
async def test_a_quiet_command_streams_through_a_router_with_a_short_idle_limit(
    start_router: Callable[..., Awaitable[Router]], tmp_path: Path, keepalive: float
) -> None:
    ip = fresh_ip()
    runtime = RuntimeServer(
        RuntimeConfig(
            root_dir=tmp_path / "root",
            listen_host=ip,
            legacy_port=0,
            rest_port=0,
            grpc_port=0,
            stream_keepalive=keepalive,
        )
    )
    await runtime.start()
    try:
        router = await start_router("--proxy-timeout=1s")
        lines, elapsed = await _stream_through(router, runtime, ip)
        events = [orjson.loads(line) for line in lines if line.strip()]
        out = "".join(e.get("data", "") for e in events if e["type"] == "stdout")
        if keepalive:
            assert events[-1] == {"type": "exit", "exit_code": 0, "timed_out": False}
            assert out == "before\nafter\n"
            assert lines.count(b"") >= 4  # blank lines kept the 2.5 s silence under the 1 s limit
        else:
            # Without them the router cuts the stream after 1 s of silence (the command dies with it).
            assert out == "before\n"
            assert all(e["type"] != "exit" for e in events)
            assert elapsed < 2.4, elapsed
    finally:
        await runtime.stop(2.0)
