"""The sync client closed by another thread while a call waits on its socket (real loopback sockets, no fakes).

Closing a socket's descriptor does not wake a thread blocked in `poll()` on it (Linux): the call went on
waiting on the old connection until an answer came - and when the freed descriptor number was reused by a
new connection first (the next request of any thread), it then waited on *that* socket, until its read
timeout: `tests/integration/sdk/test_concurrent_use.py` saw a `run` still blocked 30 s after `close()`. The
driver's `close()` now shuts the sockets down before closing them, which wakes every blocked read at once.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent_sandbox_sdk import SandboxClientClosedError, SandboxConnectionError
from agent_sandbox_sdk._driver import SyncDriver
from agent_sandbox_sdk._steps import HttpRequest, Open, ReadChunk, Send, TlsSettings

pytestmark = pytest.mark.unit


class _SilentServer:
    """Accepts connections on 127.0.0.1 and never answers; `received` is set once a request arrived."""

    def __init__(self, tls: ssl.SSLContext | None = None, *, answer_headers: bool = False) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = threading.Event()
        self._tls = tls
        self._answer_headers = answer_headers
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
            self._held.append(conn)
            conn.recv(65536)
            if self._answer_headers:  # a stream: headers and a first chunk, then silence
                conn.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\nfirst\n\r\n")
            self.received.set()

    def close(self) -> None:
        self.listener.close()
        for conn in self._held:
            conn.close()


def _tls_pair(tmp_path: Path) -> tuple[ssl.SSLContext, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_path, key_path)
    return server, str(cert_path)


def _run(request: HttpRequest):  # type: ignore[no-untyped-def]
    resp = yield Send(request)
    return resp.status_code


def _stream(request: HttpRequest):  # type: ignore[no-untyped-def]
    handle = yield Open(request)
    chunks = []
    while (chunk := (yield ReadChunk(handle))) is not None:
        chunks.append(chunk)
    return b"".join(chunks)


def _close_under_a_waiting_call(driver: SyncDriver, flow: Iterator[Any], server: _SilentServer) -> object:
    """Runs `flow` on a thread, closes the driver once the server holds the request, then connects once more
    (taking the descriptor number the close freed); the flow's outcome, or "still waiting" after 10 s."""
    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(driver.run(flow))  # type: ignore[arg-type]
        except BaseException as err:  # reported to the test's thread
            outcome.append(err)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    assert server.received.wait(10), "the request did not arrive"
    driver.close()
    idle = socket.create_server(("127.0.0.1", 0))
    reuse = socket.create_connection(idle.getsockname())
    try:
        thread.join(10)
        return outcome[0] if outcome else "still waiting"
    finally:
        reuse.close()
        idle.close()


@pytest.mark.parametrize("kind", ["run", "stream"])
def test_a_call_waiting_on_its_socket_fails_at_once_when_another_thread_closes_the_client(kind: str) -> None:
    server = _SilentServer(answer_headers=kind == "stream")
    try:
        url = f"http://127.0.0.1:{server.port}/execute"
        flow = _run(HttpRequest("POST", url)) if kind == "run" else _stream(HttpRequest("POST", url))
        outcome = _close_under_a_waiting_call(SyncDriver(None), flow, server)
    finally:
        server.close()
    assert isinstance(outcome, SandboxConnectionError), outcome
    assert f"POST {url}: the connection was closed while the call was in flight (client closed)" in str(
        outcome
    )


def test_a_tls_call_waiting_on_its_socket_fails_at_once_too(tmp_path: Path) -> None:
    """OpenSSL reads by descriptor number: a TLS read woken by the shutdown, whose socket the closing thread
    then closed before the read ran, read from whichever connection took that number next (until its read
    timeout) - one round in four or so, hence the rounds. The stream is closed once the read returned."""
    context, ca = _tls_pair(tmp_path)
    for _ in range(12):
        server = _SilentServer(context)
        try:
            url = f"https://127.0.0.1:{server.port}/execute"
            flow = _run(HttpRequest("POST", url, tls=TlsSettings(ca_cert=ca)))
            outcome = _close_under_a_waiting_call(SyncDriver(None), flow, server)
        finally:
            server.close()
        assert isinstance(outcome, SandboxConnectionError), outcome
        assert "(client closed)" in str(outcome)


def _answering(connections: int) -> socket.socket:
    """A listener on 127.0.0.1 that answers 204 on each of its first `connections` connections."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        for _ in range(connections):
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    return listener


@pytest.mark.parametrize("own_transport", [False, True], ids=["driver-pools", "callers-transport"])
def test_the_driver_reconnects_after_the_close(own_transport: bool) -> None:
    """The sockets cut belong to the closed pools: the next call opens a new connection and gets its answer. The
    cut is for the pools the driver builds: a `transport=` given to it outlives its `close()`, and until the fix
    its backend stayed cut - every later connection was shut down as it opened."""
    listener = _answering(2)
    driver = SyncDriver(None, transport=httpx2.HTTPTransport() if own_transport else None)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
    try:
        assert driver.run(_run(HttpRequest("GET", url))) == 204
        driver.close()
        assert driver.run(_run(HttpRequest("GET", url))) == 204
    finally:
        listener.close()


def test_a_send_on_a_client_another_thread_just_closed_is_the_client_closed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another thread's `close()` between a call's lookup of its pooled client and its send: httpx2 raises a
    RuntimeError ("Cannot send a request, as the client has been closed."), which reached the caller as such."""
    original = SyncDriver._client

    def racing(self: SyncDriver, request: HttpRequest) -> httpx2.Client:
        client = original(self, request)
        self.close()  # lands after the lookup, before the send
        return client

    monkeypatch.setattr(SyncDriver, "_client", racing)
    with pytest.raises(SandboxClientClosedError, match=r"\(client closed\)"):
        SyncDriver(None).run(_run(HttpRequest("GET", "http://127.0.0.1:9/")))
