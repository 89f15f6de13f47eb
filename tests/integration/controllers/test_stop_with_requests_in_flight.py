"""SIGTERM while a client holds a request half-sent: the controller still stops within seconds.

Real control plane, the real `agent-sandbox-controller` process with its conversion webhook (TLS), metrics and
probe listeners. aiohttp waits up to 60 s (its default `shutdown_timeout`) for a request handler still running
when its server stops, and a handler waiting for the rest of a body is one; the manager's 5 s grace for the
background runnables did not bound it (their task group waits for them regardless). Until December 7 a
conversion request the API server was sending at the moment of a SIGTERM held the stop for a minute, past the
kubelet's 30 s grace: the process was SIGKILLed, its held writes and the Lease release lost (CI, December 7:
"the controller did not stop within 20 s of SIGTERM").
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, is_ours, stop

pytestmark = pytest.mark.integration

HALF_A_REQUEST = (
    b"POST /convert HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b'Content-Length: 4096\r\n\r\n{"kind":'
)


@pytest.fixture
def controller(cluster: DevCluster, namespace: str) -> Iterator[Started]:
    started = start_controller(
        cluster, extra=("--leader-elect=true", f"--leader-election-namespace={namespace}")
    )
    try:
        yield started
    finally:
        stop(started)


def _half_sent(port: int, *, tls: bool) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the peer is not under test here
        sock = ctx.wrap_socket(sock, server_hostname="127.0.0.1")
    sock.sendall(HALF_A_REQUEST)
    return sock


@pytest.mark.parametrize("listener", ["controller_webhook", "controller_metrics", "controller_health"])
def test_a_request_left_half_sent_does_not_hold_the_stop(
    cluster: DevCluster, controller: Started, listener: str
) -> None:
    port = cluster.state.extra_ports[listener]
    held = [_half_sent(port, tls=listener == "controller_webhook") for _ in range(3)]
    try:
        time.sleep(0.5)  # the handlers run, waiting for the bodies
        os.kill(controller.pid, signal.SIGTERM)
        signalled = time.monotonic()
        while is_ours(controller.pid, controller.exe) and time.monotonic() - signalled < 30:
            time.sleep(0.05)
        took = time.monotonic() - signalled
    finally:
        for sock in held:
            sock.close()
    log = controller.log.read_text(errors="replace")
    assert took < 8, f"stopped {took:.1f}s after SIGTERM with {listener} requests half-sent:\n{log[-3000:]}"
    assert "manager stopped" in log, log[-3000:]
