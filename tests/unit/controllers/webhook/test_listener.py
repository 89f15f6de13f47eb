"""The webhook listener as a child process: serves, reports failures, relays logs, never outlives us."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from agent_sandbox.controllers.options import Options
from agent_sandbox.controllers.webhook import WebhookError, generate_bundle, options_from
from agent_sandbox.controllers.webhook.listener import ListenerProcess

pytestmark = pytest.mark.unit


@pytest.fixture
def cert_files(tmp_path: Path) -> tuple[Path, Path, bytes]:
    b = generate_bundle(service="s", namespace="n", cluster_domain="cluster.local", extra_hosts=("127.0.0.1",),
                        now=dt.datetime.now(dt.UTC))  # fmt: skip
    (tmp_path / "tls.crt").write_bytes(b.cert_pem)
    (tmp_path / "tls.key").write_bytes(b.key_pem)
    return tmp_path / "tls.crt", tmp_path / "tls.key", b.ca_pem


async def _convert(port: int, ca_pem: bytes, desired: str) -> tuple[int, Any]:
    review = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "u1", "desiredAPIVersion": desired, "objects": [
            {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "metadata": {"name": "s"},
             "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}]},
    }  # fmt: skip
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    url = f"https://127.0.0.1:{port}/convert"
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=orjson.dumps(review), ssl=ctx) as resp,
    ):
        return resp.status, await resp.json()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose; it is reaped by its parent
    return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


async def test_serves_from_a_child_process_and_stops(cert_files: tuple[Path, Path, bytes]) -> None:
    cert, key, ca = cert_files
    listener = ListenerProcess("127.0.0.1", 0, cert, key)
    port = await listener.start()
    try:
        assert listener.pid is not None
        assert listener.pid != os.getpid()
        status, answer = await _convert(port, ca, "agents.x-k8s.io/v1alpha1")
        assert status == 200
        assert answer["response"]["result"] == {"status": "Success"}
        assert answer["response"]["convertedObjects"][0]["apiVersion"] == "agents.x-k8s.io/v1alpha1"
    finally:
        await listener.stop()
    await listener.wait()  # asked to stop: returns without an error
    assert listener.pid is not None
    assert not _alive(listener.pid)
    assert _port_closed(port)
    await listener.stop()  # idempotent


async def test_child_log_records_reach_the_controllers_logging(
    cert_files: tuple[Path, Path, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    cert, key, ca = cert_files
    listener = ListenerProcess("127.0.0.1", 0, cert, key)
    port = await listener.start()
    try:
        with caplog.at_level(logging.WARNING):
            status, answer = await _convert(port, ca, "agents.x-k8s.io/v9")
            assert status == 200
            assert answer["response"]["result"]["status"] == "Failure"
            for _ in range(200):
                if any("conversion to agents.x-k8s.io/v9 failed" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.01)
    finally:
        await listener.stop()
    relayed = [r for r in caplog.records if "conversion to agents.x-k8s.io/v9 failed" in r.getMessage()]
    assert relayed, caplog.text
    assert relayed[0].levelno == logging.WARNING
    assert relayed[0].name == "agent_sandbox.controllers.webhook.app"


async def test_a_listener_that_dies_unasked_is_an_error(cert_files: tuple[Path, Path, bytes]) -> None:
    cert, key, _ = cert_files
    listener = ListenerProcess("127.0.0.1", 0, cert, key)
    await listener.start()
    assert listener.pid is not None
    os.kill(listener.pid, signal.SIGKILL)
    with pytest.raises(WebhookError, match=rf"pid {listener.pid}\) exited with status -9"):
        await asyncio.wait_for(listener.wait(), 10)


async def test_a_port_in_use_is_reported_with_the_address(cert_files: tuple[Path, Path, bytes]) -> None:
    cert, key, _ = cert_files
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        listener = ListenerProcess("127.0.0.1", port, cert, key)
        with pytest.raises(WebhookError, match=rf"cannot listen on 127.0.0.1:{port}"):
            await listener.start()
    assert listener.pid is not None
    assert not _alive(listener.pid)


async def test_an_unreadable_certificate_is_reported(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    listener = ListenerProcess("127.0.0.1", 0, tmp_path / "tls.crt", tmp_path / "tls.key")
    with pytest.raises(WebhookError):
        await listener.start()


def test_the_listener_does_not_outlive_a_killed_controller(cert_files: tuple[Path, Path, bytes]) -> None:
    """SIGKILL of the controller closes the child's stdin; the child closes its listener and exits."""
    cert, key, _ = cert_files
    parent_code = f"""
import asyncio, sys
from pathlib import Path
from agent_sandbox.controllers.webhook.listener import ListenerProcess

async def main():
    listener = ListenerProcess("127.0.0.1", 0, Path({str(cert)!r}), Path({str(key)!r}))
    port = await listener.start()
    print(listener.pid, port, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child_pid, port = (int(v) for v in parent.stdout.readline().split())
        assert _alive(child_pid)
        assert not _port_closed(port)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child_pid), "the listener outlived the controller"
    assert _port_closed(port)


@pytest.mark.parametrize(
    ("value", "expected"), [(None, "process"), ("process", "process"), ("thread", "thread")]
)
def test_listener_kind_from_the_environment(value: str | None, expected: str) -> None:
    environ = {} if value is None else {"AGENT_SANDBOX_WEBHOOK_LISTENER": value}
    assert options_from(Options(), environ=environ).listener == expected


def test_an_unknown_listener_kind_names_the_variable() -> None:
    with pytest.raises(WebhookError, match="AGENT_SANDBOX_WEBHOOK_LISTENER='fork'"):
        options_from(Options(), environ={"AGENT_SANDBOX_WEBHOOK_LISTENER": "fork"})
