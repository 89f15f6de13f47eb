"""`agent-sandbox proxy CLAIM PORT`: a web app and a WebSocket server started inside a sandbox, reached from a
local address with no `X-Sandbox-*` headers (as a browser would), through the real router."""

from __future__ import annotations

import asyncio
import sys
import urllib.error
import urllib.request

import aiohttp
import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import Sandbox, SandboxClient, SandboxDirectConnectionConfig
from tests.helpers import wait_for

from .conftest import RUNTIME_IMAGE, apply_pool, cli_proxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# The web app: static files, and POST /length answering how many body bytes it read. Python's http.server reads
# only bodies with a Content-Length (no chunked uploads), as many simple servers do.
APP = """
import sys
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
class Handler(SimpleHTTPRequestHandler):
    def do_POST(self):
        n = len(self.rfile.read(int(self.headers["Content-Length"])))
        body = str(n).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
ThreadingHTTPServer((sys.argv[1], 8000), partial(Handler, directory="site")).serve_forever()
"""

# A WebSocket echo server, run inside the sandbox (the dev runner's commands run with this machine's Python).
WS_ECHO = """
import sys
from aiohttp import web
async def ws(request):
    sock = web.WebSocketResponse(max_msg_size=0)  # a notebook's outputs can be large
    await sock.prepare(request)
    async for message in sock:
        if message.type == web.WSMsgType.TEXT:
            await sock.send_str("echo " + message.data)
        elif message.type == web.WSMsgType.BINARY:
            await sock.send_bytes(message.data[::-1])
    return sock
app = web.Application()
app.router.add_get("/ws", ws)
web.run_app(app, host=sys.argv[1], port=int(sys.argv[2]), print=None)
"""


def _get(url: str) -> tuple[int, bytes, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def _start(sandbox: Sandbox, command: str) -> None:
    result = sandbox.commands.run(f"sh -c 'nohup {command} >/dev/null 2>&1 &'")
    assert result.exit_code == 0, result


def test_a_web_app_and_a_websocket_in_a_sandbox_from_a_local_address(
    cluster: DevCluster, namespace: str, controller: Started, router: str
) -> None:
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    with SandboxClient(
        SandboxDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig
    ) as client:
        sandbox = client.create_sandbox("pool", namespace)
        claim = sandbox.claim_name or ""
        pod_ip = client.get_sandbox_info(claim, namespace).pod_ip
        page = b"<h1>built by an agent</h1>" * 4000  # ~100 KB
        sandbox.files.write("site/index.html", page)
        sandbox.files.write("ws_echo.py", WS_ECHO.encode())
        sandbox.files.write("app.py", APP.encode())
        _start(sandbox, f"python3 app.py {pod_ip}")
        _start(sandbox, f"{sys.executable} ws_echo.py {pod_ip} 8001")

        with cli_proxy(cluster, router, namespace, claim, 8000) as url:
            _, body, headers = wait_for(
                lambda: (r := _get(url + "index.html"))[0] == 200 and r, what="the app"
            )
            assert body == page
            assert headers["Content-Length"] == str(len(page))
            assert _get(url + "missing.html")[0] == 404  # the app's own answers pass through
            # The body goes on with its Content-Length (chunked, this app would not read it).
            request = urllib.request.Request(url + "length", data=b"x" * 70_000, method="POST")
            with urllib.request.urlopen(request, timeout=30) as resp:
                assert resp.read() == b"70000"

        with cli_proxy(cluster, router, namespace, claim, 8001) as url:

            async def talk() -> list[object]:
                async with aiohttp.ClientSession() as session:
                    ws = await wait_for_ws(session, url.replace("http://", "ws://") + "ws")
                    await ws.send_str("hello")
                    text = (await ws.receive(timeout=30)).data
                    await ws.send_bytes(b"\x00\x01\x02")
                    binary = (await ws.receive(timeout=30)).data
                    # Past aiohttp's default 4 MiB message limit, which the proxy applied on both of its
                    # sides: the message was refused and the connection closed (1009).
                    await ws.send_bytes(big)
                    large = await ws.receive(timeout=60)
                    await ws.close()
                    return [text, binary, large.type, len(large.data or b""), large.data == big[::-1]]

            big = bytes(range(256)) * (6 * 4096)  # 6 MiB
            assert asyncio.run(talk()) == [
                "echo hello",
                b"\x02\x01\x00",
                aiohttp.WSMsgType.BINARY,
                len(big),
                True,
            ]


async def wait_for_ws(session: aiohttp.ClientSession, url: str) -> aiohttp.ClientWebSocketResponse:
    """The sandbox's WebSocket server, once it listens (it was started in the background)."""
    for _ in range(100):
        try:
            return await session.ws_connect(url, max_msg_size=0)
        except aiohttp.WSServerHandshakeError:
            await asyncio.sleep(0.2)
    return await session.ws_connect(url, max_msg_size=0)
