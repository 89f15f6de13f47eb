"""A stop with a short grace (<= 2 s) still answers the commands it kills.

The dev cluster's runner stops a runtime with grace 0 (a crash without `hard`), 1 s (retiring a server) or a
pod's deletion grace (1 s by default), and docs/devcluster.md promises in-flight requests answered as on
SIGTERM. Commands are SIGKILLed at min(2 s, grace); until December 7 (commit 232deb2) the listeners' deadline
was that same moment, so the killed command's connection was reset before its handler wrote `exit_code -9`.

An in-process RuntimeServer with its real HTTP stack: the runtime itself, no control plane needed.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from agent_sandbox.runtime import RuntimeConfig, RuntimeServer

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("grace", [0.0, 1.0])
async def test_a_command_killed_by_a_short_stop_is_answered(tmp_path: Path, grace: float) -> None:
    root = tmp_path / "root"
    root.mkdir()
    config = RuntimeConfig(
        root_dir=root, listen_host="127.0.0.1", legacy_port=0, rest_port=0, grpc_port=0, claim_env_file=""
    )
    server = RuntimeServer(config)
    await server.start()
    port = server.ports["legacy"]

    async def execute() -> tuple[int, bytes]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"http://127.0.0.1:{port}/execute",
                data=orjson.dumps({"command": "sh -c 'trap \"\" TERM; sleep 30'"}),
            ) as resp,
        ):
            return resp.status, await resp.read()

    request = asyncio.create_task(execute())
    try:
        await asyncio.sleep(0.5)  # the command runs (and ignores SIGTERM)
        started = time.monotonic()
        await server.stop(grace)
        took = time.monotonic() - started
        status, body = await asyncio.wait_for(request, 10)
    finally:
        if not request.done():
            request.cancel()
        await server.stop(0.0)
    assert status == 200, body
    assert orjson.loads(body)["exit_code"] == -signal.SIGKILL
    # ...and the stop stays short: at most the grace, or a brief window after the kill for a crash
    assert took < max(grace, 0.5) + 0.5, f"stop({grace}) took {took:.2f}s"
