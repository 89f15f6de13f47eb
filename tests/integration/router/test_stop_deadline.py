"""The `agent-sandbox-router` process is gone by `--shutdown-timeout` after SIGTERM (router spec §1.12).

At the default 30 s the timeout equals the kubelet's default termination grace period: a router still
running past it is SIGKILLed. Until December 7 the drain used the whole timeout and the process stopped
after it (the interpreter's own teardown took another 0.5-1.5 s on a loaded machine), and a trace
collector that did not answer held the stop for the exporter's 10 s; nothing bounded a stop that hung.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import listen_port, wait_for

from .conftest import Backend, RouterProcess

pytestmark = pytest.mark.integration

TIMEOUT = 5.0


async def _hold(kind: str, port: int, backend: Backend) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client connection the drain has to wait for (and finally cut)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    routing = "".join(f"{k}: {v}\r\n" for k, v in backend.headers().items())
    if kind == "half-sent head":
        writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n")
    elif kind == "half-sent body":
        writer.write(f"POST /upload HTTP/1.1\r\nHost: x\r\n{routing}Content-Length: 1000\r\n\r\nabc".encode())
    else:  # a response that never ends
        writer.write(f"GET /drip/100000?every=0.2 HTTP/1.1\r\nHost: x\r\n{routing}\r\n".encode())
        assert b"200" in await asyncio.wait_for(reader.readline(), 10)
    await writer.drain()
    await asyncio.sleep(0.3)  # the router has read what was sent
    return reader, writer


async def _read_to_eof(reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass


@pytest.mark.parametrize("held", ["half-sent head", "half-sent body", "endless response"])
async def test_a_busy_connection_is_cut_and_the_process_gone_by_the_shutdown_timeout(
    router_process: Callable[..., RouterProcess], backend: Backend, held: str
) -> None:
    router = router_process(f"--shutdown-timeout={TIMEOUT:g}s")
    reader, writer = await _hold(held, router.port, backend)
    try:
        router.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = await asyncio.to_thread(router.proc.wait, 30)
        elapsed = time.monotonic() - started
        await asyncio.wait_for(_read_to_eof(reader), 5)  # the connection was cut
    finally:
        writer.close()
    log = router.log.read_text()
    assert code == 0, log[-2000:]
    assert "closing 1 connection(s) still busy" in log
    # The drain waited for the connection (not cut at once), and the process was gone within the timeout.
    assert 2.5 < elapsed < TIMEOUT, f"stopped {elapsed:.2f} s after SIGTERM (--shutdown-timeout={TIMEOUT:g}s)"


async def test_a_request_cut_at_the_shutdown_timeout_is_in_the_access_log(
    router_process: Callable[..., RouterProcess], backend: Backend
) -> None:
    """The default (JSON, batched) access log: the line of a request the stop cuts is written before the process
    leaves. Until December 7 the cut handler logged its 499 into the batch after the last flush, and the process
    exited before the 50 ms flush timer fired: the line was lost (the console encoder, unbatched, had it)."""
    router = router_process("--shutdown-timeout=2s")
    _reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    routing = "".join(f"{k}: {v}\r\n" for k, v in backend.headers().items())
    writer.write(f"GET /sleep/60 HTTP/1.1\r\nHost: x\r\n{routing}\r\n".encode())
    await writer.drain()
    await asyncio.sleep(0.5)  # the request is at the backend
    try:
        router.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(router.proc.wait, 30)
    finally:
        writer.close()
    log = router.log.read_text()
    assert code == 0, log[-2000:]
    entries = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    cut = [e for e in entries if e.get("msg") == "request" and e.get("path") == "/sleep/60"]
    assert cut, log[-2000:]
    assert cut[0]["status"] == 499


async def test_a_trace_collector_that_does_not_answer_does_not_hold_the_stop(
    router_process: Callable[..., RouterProcess], backend: Backend
) -> None:
    """Spans still queued at the stop are flushed for as long as the timeout leaves, not the exporter's 10 s."""
    with socket.socket() as collector:  # accepts connections (the kernel does) and never answers
        collector.bind(("127.0.0.1", 0))
        collector.listen(16)
        endpoint = f"http://127.0.0.1:{collector.getsockname()[1]}"
        router = router_process(
            "--enable-tracing",
            f"--shutdown-timeout={TIMEOUT:g}s",
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint},
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        routing = "".join(f"{k}: {v}\r\n" for k, v in backend.headers().items())
        writer.write(f"GET /x HTTP/1.1\r\nHost: x\r\n{routing}Connection: close\r\n\r\n".encode())
        assert b" 200 " in await asyncio.wait_for(reader.readline(), 10)  # a span to export
        writer.close()
        router.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = await asyncio.to_thread(router.proc.wait, 30)
        elapsed = time.monotonic() - started
    log = router.log.read_text()
    assert code == 0, log[-2000:]
    # The flush is waited for until half the stop reserve is left (0.5 s before the timeout): a second of
    # slack for a loaded machine, far from the exporter's 10 s this bounds.
    assert elapsed < TIMEOUT + 1.0, f"stopped {elapsed:.2f} s after SIGTERM (--shutdown-timeout={TIMEOUT:g}s)"
    assert "trace export did not finish before --shutdown-timeout" in log
    assert "router stopped" in log


_HANGING_STOP = """
import time
from agent_sandbox.router import _app, _main

async def hang(self, flush_until=None):  # a stop step that never returns (and blocks the event loop)
    time.sleep(60)

_app.Router._stop_everything = hang
_main.main()
"""


def test_a_stop_that_hangs_is_ended_a_second_past_the_shutdown_timeout(tmp_path: Path) -> None:
    """The console script's watchdog: whatever holds the stop, the process logs every thread's stack and exits
    1 a second past `--shutdown-timeout` (the normal stop is done before the timeout)."""
    probe = listen_port()
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HANGING_STOP, "--http-bind-address=127.0.0.1:0", "--metrics-bind-address=0",
             f"--health-probe-bind-address=127.0.0.1:{probe}", "--shutdown-timeout=2s"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: _ready(probe) or proc.poll() is not None, what="router ready")
        assert proc.poll() is None, log.read_text()[-2000:]
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = proc.wait(timeout=30)
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert code == 1, text[-2000:]
    assert 2.5 < elapsed < 6, f"exited {elapsed:.2f} s after SIGTERM"
    assert "stop still running 3 s after the signal (--shutdown-timeout 2s): exiting now" in text
    assert "in hang" in text  # the stacks say where it hung


_STOP_STUCK_IN_A_LOG_WRITE = """
import logging, time
from agent_sandbox.router import _app, _main

async def hang(self, flush_until=None):
    # The stop blocked inside a log write (stdout a pipe the log collector stopped reading): the handler's
    # lock is held while the write blocks.
    with logging.getLogger().handlers[0].lock:
        time.sleep(30)

_app.Router._stop_everything = hang
_main.main()
"""


def test_a_stop_stuck_in_a_log_write_is_ended_all_the_same(tmp_path: Path) -> None:
    """The watchdog's own log line would wait for the handler lock the stuck stop holds: the exit must not
    depend on it (until December 7 the watchdog blocked too, and the process ran until the write returned)."""
    probe = listen_port()
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", _STOP_STUCK_IN_A_LOG_WRITE, "--http-bind-address=127.0.0.1:0",
             "--metrics-bind-address=0", f"--health-probe-bind-address=127.0.0.1:{probe}", "--shutdown-timeout=2s"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: _ready(probe) or proc.poll() is not None, what="router ready")
        assert proc.poll() is None, log.read_text()[-2000:]
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = proc.wait(timeout=60)
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 1, log.read_text()[-2000:]
    assert 2.5 < elapsed < 8, f"exited {elapsed:.2f} s after SIGTERM"


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
