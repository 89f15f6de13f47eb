"""`agent-sandbox proxy` as a relay: what reaches the app in the sandbox, what the client gets back, and how
it stops - through the real router to an aiohttp app (`proxy_relay_app.py`) started inside a real sandbox.

Each test is a defect a probe found in the proxy: Ctrl-C waited two minutes with a WebSocket open; the app
saw the router as `X-Forwarded-Host` and redirected the browser there; a rotated token file was never read
again; refused WebSocket handshakes lost their status body; `Accept-Encoding: gzip, deflate` was added;
1006 was sent in close frames, server closes were cut short and pings never reached the app; the 101st
long-lived request hung; a taken port and every client abort printed tracebacks.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.router import mint_scoped_token
from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig
from tests.conftest import new_namespace
from tests.helpers import signals_as_from_a_shell, wait_for

from .conftest import RUNTIME_IMAGE, apply_pool, router_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

APP = Path(__file__).with_name("proxy_relay_app.py").read_bytes()
CLI = str(Path(sys.executable).with_name("agent-sandbox"))
SECRET = b"p" * 40


@dataclass
class App:
    """The app's sandbox: its claim, its Sandbox's name, and the namespace."""

    namespace: str
    claim: str
    sandbox_id: str


@pytest.fixture(scope="module")
def app(cluster: DevCluster, controller: Started, router: str) -> Iterator[App]:
    """One sandbox running `proxy_relay_app.py` on its pod IP, port 8000, reachable through the router."""
    namespace = new_namespace(cluster)
    try:
        apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
        with SandboxClient(
            SandboxDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig
        ) as client:
            sandbox = client.create_sandbox("pool", namespace, sandbox_ready_timeout=90)
            info = client.get_sandbox_info(sandbox.claim_name or "", namespace)
            assert sandbox.files is not None
            assert sandbox.commands is not None
            sandbox.files.write("app.py", APP)
            command = f"nohup {sys.executable} app.py {info.pod_ip} 8000 >app.log 2>&1 &"
            assert sandbox.commands.run(f"sh -c '{command}'").exit_code == 0
            yield App(namespace, sandbox.claim_name or "", sandbox.sandbox_id)
    finally:
        cluster.admin().request("DELETE", f"/api/v1/namespaces/{namespace}")


@pytest.fixture(scope="module")
def scoped_router(cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A router that demands a scoped token (`--authz-mode=scoped-token`); its URL."""
    secret = tmp_path_factory.mktemp("proxy-scoped") / "secret"
    secret.write_bytes(SECRET)
    port = cluster.reserve_port("proxy_scoped_router_http")
    flags = ("--authz-mode=scoped-token", f"--authz-scoped-token-secret-file={secret}")
    with router_process(cluster, "proxy_scoped_router", f"127.0.0.1:{port}", *flags):
        yield f"http://127.0.0.1:{port}"


@dataclass
class Proxy:
    url: str
    process: subprocess.Popen[str]
    stderr: Path

    def stop(self) -> int:
        """Ctrl-C; the exit code (waited for as long as a hung proxy waited before the fix would not)."""
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=20)


@contextmanager
def proxy(
    cluster: DevCluster, router: str, app: App, tmp_path: Path, *extra: str, port: int = 8000
) -> Iterator[Proxy]:
    """`agent-sandbox proxy CLAIM PORT` running, its standard error in a file; killed by PID afterwards."""
    stderr = tmp_path / f"proxy-{os.urandom(4).hex()}.err"
    argv = [CLI, "proxy", app.claim, str(port), "-n", app.namespace, "--kubeconfig", str(cluster.kubeconfig)]
    with stderr.open("w") as err:
        process = subprocess.Popen(
            [*argv, "--router-url", router, *extra],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("AGENT_SANDBOX_ROUTER")},
            preexec_fn=signals_as_from_a_shell,
        )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), stderr.read_text()
        yield Proxy(url, process, stderr)
    finally:
        process.kill()
        process.wait()


async def _get(url: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession(skip_auto_headers=("Accept-Encoding", "User-Agent")) as session,
        session.get(url, headers=headers, allow_redirects=False) as response,
    ):
        return response.status, dict(response.headers), await response.read()


def _wait_for_app(url: str) -> None:
    wait_for(lambda: asyncio.run(_get(url + "echo"))[0] == 200, timeout=60, what="the app in the sandbox")


def test_what_the_app_sees_and_where_it_redirects(
    cluster: DevCluster, router: str, app: App, tmp_path: Path
) -> None:
    """Only the client's own Accept-Encoding goes on, and the app names the proxy's address: as
    `X-Forwarded-Host`, in redirects it builds from it, and in absolute redirects to the router."""
    with proxy(cluster, router, app, tmp_path) as p:
        _wait_for_app(p.url)
        local = p.url.removeprefix("http://").rstrip("/")
        _, _, body = asyncio.run(_get(p.url + "echo"))
        seen = json.loads(body)
        assert "Accept-Encoding" not in seen, seen  # was `gzip, deflate`, added by the proxy
        assert seen["X-Forwarded-Host"] == local  # was the router's address
        _, _, body = asyncio.run(_get(p.url + "echo", **{"Accept-Encoding": "br"}))
        assert json.loads(body)["Accept-Encoding"] == "br"

        status, headers, _ = asyncio.run(_get(p.url + "redirect"))
        assert (status, headers["Location"]) == (302, f"http://{local}/echo?from=redirect")
        status, headers, _ = asyncio.run(_get(p.url + "redirect?to=" + router + "/echo%3Fx%3D1"))
        assert (status, headers["Location"]) == (302, f"http://{local}/echo?x=1")
        assert p.stop() == 130


def test_ctrl_c_stops_at_once_with_a_websocket_and_a_stream_open(
    cluster: DevCluster, router: str, app: App, tmp_path: Path
) -> None:
    """The open WebSocket gets 1001 and the stream is cut (before: aiohttp's 60 s shutdown wait, twice)."""
    with proxy(cluster, router, app, tmp_path) as p:
        _wait_for_app(p.url)

        async def scenario() -> tuple[int, aiohttp.WSMsgType, object]:
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(p.url + "ws", autoclose=False)
                await ws.send_str("hi")
                assert (await ws.receive(timeout=30)).data == "hi"
                stream = await session.get(p.url + "hold")
                assert await stream.content.readline() == b"data: held\n"
                code = await asyncio.to_thread(p.stop)
                message = await ws.receive(timeout=10)
                await ws.close()
                stream.close()
                return code, message.type, message.data

        assert asyncio.run(scenario()) == (130, aiohttp.WSMsgType.CLOSE, 1001)


def test_websocket_pings_and_close_handshakes_are_the_two_ends(
    cluster: DevCluster, router: str, app: App, tmp_path: Path
) -> None:
    with proxy(cluster, router, app, tmp_path) as p:
        _wait_for_app(p.url)

        async def pings_and_drop() -> list[object]:
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(p.url + "ws", autoping=False, autoclose=False)
                # The client's ping reaches the app (which says so) and the app's pong comes back.
                await ws.ping(b"c1")
                got = [await ws.receive(timeout=10), await ws.receive(timeout=10)]
                seen = sorted((m.type.name, m.data) for m in got)
                # The app's ping reaches the client.
                await ws.send_str("ping:s1")
                ping = await ws.receive(timeout=10)
                # The app's connection goes without a close frame: 1001, never the reserved 1006.
                await ws.send_str("drop")
                close = await ws.receive(timeout=30)
                await ws.close()
                return [seen, (ping.type, ping.data), (close.type, close.data)]

        assert asyncio.run(pings_and_drop()) == [
            [("PONG", b"c1"), ("TEXT", "got ping c1")],
            (aiohttp.WSMsgType.PING, b"s1"),
            (aiohttp.WSMsgType.CLOSE, 1001),
        ]

        # The app closes: the client gets its code and reason, the connection stays open until the client
        # answers (Chromium's `wasClean`), and the client's answer is what reaches the app.
        with _raw_websocket(p.url, "/ws") as sock:
            sock.sendall(_frame(0x1, b"close:4001:bye"))
            assert _read_frame(sock) == (0x8, struct.pack("!H", 4001) + b"bye")
            sock.settimeout(1.0)
            with pytest.raises(TimeoutError):
                sock.recv(1)  # before: the proxy had already dropped the connection
            sock.settimeout(30)
            sock.sendall(_frame(0x8, struct.pack("!H", 4002)))
            assert sock.recv(1) == b""  # the handshake done, the proxy closes
        status, _, body = asyncio.run(_get(p.url + "last-close"))
        assert (status, body) == (200, b"4002")  # before: 1000, the proxy's own answer
        assert p.stop() == 130


def test_refused_websocket_handshakes_and_a_rotated_token(
    cluster: DevCluster, scoped_router: str, app: App, tmp_path: Path
) -> None:
    """The token file is read again when it changes, and a refused handshake keeps its status and body."""
    token_file = tmp_path / "token"
    token_file.write_text(mint_scoped_token(SECRET, app.namespace, app.sandbox_id, 600) + "\n")
    with proxy(cluster, scoped_router, app, tmp_path, "--router-token-file", str(token_file)) as p:
        _wait_for_app(p.url)
        upgrade = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        }
        status, _, body = asyncio.run(_get(p.url + "missing", **upgrade))
        assert (status, body) == (404, b"404: Not Found")  # the app's own answer

        # Rotated to a token for another sandbox (as an expired one would be): the router's refusal.
        token_file.write_text(mint_scoped_token(SECRET, app.namespace, "someone-else", 600))
        status, _, body = asyncio.run(_get(p.url + "echo"))
        assert status == 403, body  # before: still 200 with the token read at start
        refused, _, refused_body = asyncio.run(_get(p.url + "ws", **upgrade))
        assert (refused, refused_body) == (status, body)  # before: "sandbox refused the WebSocket: ..."
        assert json.loads(body)["detail"]

        token_file.write_text(mint_scoped_token(SECRET, app.namespace, app.sandbox_id, 600))
        assert asyncio.run(_get(p.url + "echo"))[0] == 200
        assert p.stop() == 130


def test_a_clients_own_authorization_does_not_reach_the_router_beside_the_token(
    cluster: DevCluster, scoped_router: str, app: App, tmp_path: Path
) -> None:
    """Node's fetch sends `authorization` in lower case (the app's own Basic credentials): the proxy kept it
    beside its own `Authorization: Bearer` (a case-sensitive dict), and only aiohttp 3.14's client merging
    the names on the way out kept the router from reading the client's first (a 401). The proxy now replaces
    it itself (tests/unit/cli/test_proxy_logic.py); this is the same end to end, whatever the client library."""
    token_file = tmp_path / "token"
    token_file.write_text(mint_scoped_token(SECRET, app.namespace, app.sandbox_id, 600))
    with proxy(cluster, scoped_router, app, tmp_path, "--router-token-file", str(token_file)) as p:
        _wait_for_app(p.url)
        status, _, body = asyncio.run(_get(p.url + "echo", authorization="Basic YWxpY2U6c2VjcmV0"))
        assert status == 200, body
        assert p.stop() == 130


def test_many_long_lived_requests_a_taken_port_and_client_aborts(
    cluster: DevCluster, router: str, app: App, tmp_path: Path
) -> None:
    """101 open event streams do not block the next request (aiohttp's client pool stopped at 100); a taken
    port is one line and exit 1; clients leaving mid-response print nothing."""
    with proxy(cluster, router, app, tmp_path) as p:
        _wait_for_app(p.url)

        async def streams() -> int:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                held = []
                for _ in range(101):
                    # Bounded: before, the 101st waited until the router timed one of the others out.
                    response = await asyncio.wait_for(session.get(p.url + "hold"), 30)
                    assert await asyncio.wait_for(response.content.readline(), 30) == b"data: held\n"
                    held.append(response)
                async with session.get(p.url + "echo", timeout=aiohttp.ClientTimeout(total=30)) as r:
                    status = r.status
                for response in held:  # each client leaves mid-response
                    response.close()
                return status

        assert asyncio.run(streams()) == 200
        port = p.url.rsplit(":", 1)[1].rstrip("/")
        argv = ["proxy", app.claim, "8000", "-n", app.namespace, "--kubeconfig", str(cluster.kubeconfig)]
        taken = subprocess.run(
            [CLI, *argv, "--router-url", router, "--local-port", port],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert taken.returncode == 1, taken.stderr
        assert taken.stderr.strip().splitlines() == [
            f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
        ]
        assert p.stop() == 130
        errors = p.stderr.read_text()
        assert "Traceback" not in errors, errors
        assert "Error handling request" not in errors, errors


@contextmanager
def _raw_websocket(url: str, path: str) -> Iterator[socket.socket]:
    """A WebSocket on a plain socket, to see exactly when the proxy closes the connection."""
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(1)
            assert chunk, head
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head
        yield sock
    finally:
        sock.close()


def _frame(opcode: int, payload: bytes) -> bytes:
    """One masked frame (a client's), payload under 126 bytes."""
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """One unmasked frame (a server's): (opcode, payload)."""

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "connection closed"
            data += chunk
        return data

    first, second = exactly(2)
    length = second & 0x7F
    if length == 126:
        length = struct.unpack("!H", exactly(2))[0]
    elif length == 127:
        length = struct.unpack("!Q", exactly(8))[0]
    return first & 0x0F, exactly(length)
