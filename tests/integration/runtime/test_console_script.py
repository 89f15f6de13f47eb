"""`agent-sandbox-runtime` as a process: default ports, `--version`, and the SIGTERM drain of spec §2.2."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.integration.runtime.helpers import leaked_processes

pytestmark = pytest.mark.integration

SCRIPT = Path(sys.executable).with_name("agent-sandbox-runtime")


def test_version() -> None:
    out = subprocess.run([str(SCRIPT), "--version"], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.startswith("agent-sandbox-runtime ")


def test_bad_flag_exits_2() -> None:
    out = subprocess.run(
        [str(SCRIPT), "--grpc-port", "0x"], capture_output=True, text=True, check=False, timeout=60
    )
    assert out.returncode == 2
    assert "--grpc-port" in out.stderr


def _free_ports(host: str, count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


async def test_sigterm_drains(tmp_path: Path) -> None:
    # a loopback address of its own; ports picked free (a wildcard listener elsewhere may hold 8080)
    host = f"127.250.{random.randint(0, 255)}.{random.randint(2, 254)}"
    legacy, rest, grpc = _free_ports(host, 3)
    root = tmp_path / "workspace"
    proc = await asyncio.create_subprocess_exec(
        str(SCRIPT), "--listen-host", host, "--root-dir", str(root), "--shutdown-timeout", "5s",
        "--legacy-port", str(legacy), "--rest-port", str(rest), "--grpc-port", str(grpc),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                try:
                    async with http.get(f"http://{host}:{rest}/v1/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
            else:
                pytest.fail(
                    f"runtime did not answer: {(await proc.stderr.read()).decode() if proc.stderr else ''}"
                )
            async with http.get(f"http://{host}:{legacy}/") as resp:
                assert resp.status == 200
            body = orjson.dumps({"command": "sh -c 'trap \"\" TERM; echo ready; sleep 300'"})
            async with http.post(f"http://{host}:{legacy}/execute/stream", data=body) as resp:
                lines = resp.content.__aiter__()
                assert orjson.loads(await anext(lines))["type"] == "start"
                assert orjson.loads(await anext(lines))["data"] == "ready\n"
                started = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                rest = [orjson.loads(line) async for line in lines]
                killed_after = time.monotonic() - started
        # the child ignored SIGTERM: it is SIGKILLed after the 2 s grace, and its stream ends with that
        assert rest[-1]["type"] == "exit"
        assert rest[-1]["exit_code"] == -signal.SIGKILL
        assert 1.5 <= killed_after < 5
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        assert leaked_processes(os.path.realpath(root)) == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
