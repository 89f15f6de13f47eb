"""The runtime process SIGKILLed mid-upload and mid-stream (a container or node dying, not a drain).

Real `agent-sandbox-runtime` processes on their own loopback addresses, and the real router in front of
them (no cache: routed by `X-Sandbox-Pod-IP`, as when a client holds the pod IP). No mocks.

* Mid-upload (sandboxd `PUT /v1/files/...` and legacy `POST /upload`): the target path never shows a
  partial file. An existing file at that path keeps its old content byte for byte (uploads go to a
  temporary file in the same directory that is renamed over the target only once complete and synced).
* Mid-stream through the router: the client's response ends at once as an incomplete HTTP response (no
  terminating chunk, no `exit` event), never a hang and never a response that looks complete; the router
  keeps serving another sandbox's stream and new requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from agent_sandbox.router import Router, load_router_config
from tests.integration.reliability.test_router_faults import LINES, Stream, stream_through
from tests.integration.runtime.helpers import leaked_processes

pytestmark = pytest.mark.integration

SCRIPT = Path(sys.executable).with_name("agent-sandbox-runtime")
OLD = b"the previous content\n" * 1000


@dataclass
class Runtime:
    proc: asyncio.subprocess.Process
    host: str
    legacy: int
    rest: int
    root: Path

    def url(self, port: int, path: str) -> str:
        return f"http://{self.host}:{port}{path}"


def _free_ports(host: str, count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@pytest.fixture
async def start_runtime(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Runtime]]]:
    started: list[Runtime] = []

    async def start(root: Path | None = None, host: str | None = None) -> Runtime:
        host = host or f"127.250.{random.randint(0, 255)}.{random.randint(2, 254)}"
        legacy, rest, grpc = _free_ports(host, 3)
        root = root or tmp_path / f"workspace-{len(started)}"
        proc = await asyncio.create_subprocess_exec(
            str(SCRIPT), "--listen-host", host, "--root-dir", str(root),
            "--legacy-port", str(legacy), "--rest-port", str(rest), "--grpc-port", str(grpc),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        rt = Runtime(proc, host, legacy, rest, root)
        started.append(rt)
        async with aiohttp.ClientSession() as http:
            for _ in range(300):
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with http.get(rt.url(rest, "/v1/health")) as resp:
                        if resp.status == 200:
                            return rt
                await asyncio.sleep(0.05)
        pytest.fail("runtime did not answer")

    yield start
    for rt in started:
        if rt.proc.returncode is None:
            rt.proc.kill()
            await rt.proc.wait()
        # Commands of a SIGKILLed runtime are orphans: stop them by PID.
        for pid, _ in leaked_processes(str(rt.root.resolve())):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def sigkill(rt: Runtime) -> None:
    rt.proc.send_signal(signal.SIGKILL)


async def slow_body(total: int, sent: list[int]) -> AsyncIterator[bytes]:
    chunk = b"n" * 65536
    while sent[0] < total:
        sent[0] += len(chunk)
        yield chunk
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("api", ["sandboxd PUT", "legacy upload"])
async def test_killed_mid_upload_leaves_the_target_untouched(
    start_runtime: Callable[..., Awaitable[Runtime]], api: str
) -> None:
    rt = await start_runtime()
    async with aiohttp.ClientSession() as http:
        async with http.put(rt.url(rt.rest, "/v1/files/dir/target.bin"), data=OLD) as resp:
            assert resp.status in (200, 201, 204), await resp.text()
        target = rt.root / "dir" / "target.bin"
        assert target.read_bytes() == OLD
        sent = [0]

        async def upload() -> None:
            body = slow_body(256 << 20, sent)
            if api == "sandboxd PUT":
                await http.put(rt.url(rt.rest, "/v1/files/dir/target.bin"), data=body)
            else:
                form = aiohttp.FormData()
                form.add_field("file", body, filename="dir/target.bin")
                await http.post(rt.url(rt.legacy, "/upload"), data=form)

        task = asyncio.create_task(upload())
        while sent[0] < (8 << 20):  # well into the upload
            await asyncio.sleep(0.01)
            assert not task.done(), task
        sigkill(rt)
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(task, 30)
    await rt.proc.wait()

    # Nothing partial at the target: the old content, intact, before and after a restart.
    assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(OLD).digest()
    leftovers = [p.name for p in target.parent.iterdir() if p.name != "target.bin"]
    print(f"{api}: killed after {sent[0] >> 20} MiB; temporary files left beside the target: {leftovers}")
    again = await start_runtime(root=rt.root)
    async with (
        aiohttp.ClientSession() as http,
        http.get(again.url(again.rest, "/v1/files/dir/target.bin")) as resp,
    ):
        assert resp.status == 200
        assert await resp.read() == OLD


@pytest.fixture
async def router() -> AsyncIterator[Router]:
    args = [
        "--http-bind-address=127.0.0.1:0",
        "--metrics-bind-address=127.0.0.1:0",
        "--health-probe-bind-address=127.0.0.1:0",
        "--allow-loopback-pod-ip",
    ]
    config, _ = load_router_config(args, {})
    started = Router(config)
    await started.start()
    try:
        yield started
    finally:
        await started.shutdown()


async def stream_via(router: Router, rt: Runtime, out: Stream, *, within: float = 60.0) -> None:
    routing = {"X-Sandbox-ID": "sb", "X-Sandbox-Pod-IP": rt.host, "X-Sandbox-Port": str(rt.legacy)}
    await stream_through(router, routing, out, within=within)


async def test_killed_mid_stream_through_the_router(
    start_runtime: Callable[..., Awaitable[Runtime]], router: Router
) -> None:
    doomed_rt, steady_rt = await start_runtime(), await start_runtime()
    doomed, steady = Stream(), Stream()
    tasks = [asyncio.create_task(stream_via(router, doomed_rt, doomed)),
             asyncio.create_task(stream_via(router, steady_rt, steady))]  # fmt: skip
    for _ in range(300):
        if doomed.stdout_lines >= 5 and steady.stdout_lines >= 5:
            break
        await asyncio.sleep(0.05)
    killed_at = time.monotonic()
    sigkill(doomed_rt)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    print(
        f"doomed stream ended {doomed.ended_at - killed_at:.3f}s after the kill, {doomed.stdout_lines} lines"
    )
    assert doomed.status == 200
    assert doomed.ended_at - killed_at < 5
    assert not doomed.complete  # no terminating chunk: the client sees a truncated response, not a short one
    assert doomed.exit is None
    assert steady.complete
    assert steady.exit == {"type": "exit", "exit_code": 0, "timed_out": False}
    again = Stream()
    await stream_via(router, steady_rt, again)
    assert (again.status, again.complete, again.stdout_lines) == (200, True, LINES)
