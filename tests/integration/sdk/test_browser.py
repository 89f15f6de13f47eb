"""A real browser through the router: the dev-environment journey (an agent starts a web app in its
sandbox, a person opens it). Debian's Chromium, driven by Playwright, is the client nobody here wrote;
the routing headers are the browser context's extra HTTP headers, as an authenticating gateway in front
of the router would add them.

Each sandbox runs `browser_app.py` (written with `files.write`, started with `commands.run`) on its pod
IP, port 8000; the browser checks a page with a script and a fetch, a 4 MiB upload, a 32 MiB download, a
304 revalidation from its cache, two cookies set by one response, a response held open between two chunks, a WebSocket (Chromium's own, with permessage-deflate) echoing text and a 1 MiB binary
message under a Jupyter-style subprotocol and passing on the server's close code, two sandboxes side by side, the runtime's `/execute`
from a page, and the router's own error for a sandbox that does not exist.

Needs /usr/bin/chromium (`hack/ensure-chromium.sh`, which `make test` runs); without it the test fails.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, BrowserContext, async_playwright

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import AsyncSandbox, AsyncSandboxClient, SandboxDirectConnectionConfig

from .conftest import RUNTIME_IMAGE, apply_pool, cli_proxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHROMIUM = Path("/usr/bin/chromium")
APP = Path(__file__).with_name("browser_app.py").read_text()
APP_PORT = 8000
# The flags the machine's browser probe found necessary: no sandboxing as root, no GPU, and none of
# Chromium's background traffic (which this machine's closed network refuses).
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _headers(sandbox_id: str, namespace: str, port: int = APP_PORT) -> dict[str, str]:
    return {"X-Sandbox-ID": sandbox_id, "X-Sandbox-Namespace": namespace, "X-Sandbox-Port": str(port)}


def _apply_app_pool(cluster: DevCluster, namespace: str, *, replicas: int) -> None:
    """A pool of runtime pods that know their own IP (the app binds it)."""
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    runtime = {"name": "runtime", "image": RUNTIME_IMAGE, "env": [pod_ip]}
    apply_pool(cluster, namespace, replicas=replicas, containers=[runtime])


async def _start_app(sandbox: AsyncSandbox, router: str, namespace: str) -> None:
    """Write the app into the sandbox, start it in the background, wait until the router reaches it."""
    assert sandbox.files is not None
    assert sandbox.commands is not None
    await sandbox.files.write("browser_app.py", APP)
    # The legacy runtime splits a command like a shell but runs no shell (upstream's behaviour): ask for one.
    script = f'{shlex.quote(sys.executable)} browser_app.py "$POD_IP" {APP_PORT} 280 > app.log 2>&1 & echo $! > app.pid'
    assert (await sandbox.commands.run(f"sh -c {shlex.quote(script)}")).exit_code == 0
    async with aiohttp.ClientSession() as http:
        for _ in range(150):
            async with http.get(f"{router}/whoami", headers=_headers(sandbox.sandbox_id, namespace)) as r:
                if r.status == 200:
                    return
            await asyncio.sleep(0.2)
    log = await sandbox.files.read("app.log")
    raise AssertionError(f"the app in {sandbox.sandbox_id} never answered through the router: {log!r}")


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    assert os.access(CHROMIUM, os.X_OK), "no /usr/bin/chromium: run hack/ensure-chromium.sh (make test does)"
    async with async_playwright() as playwright:
        started = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield started
        finally:
            await started.close()


async def _context(browser: Browser, headers: dict[str, str]) -> BrowserContext:
    context = await browser.new_context(extra_http_headers=headers)
    context.set_default_timeout(30_000)
    return context


# Run in the page: everything the app offers, measured by the browser itself.
_JOURNEY = """
async () => {
  const out = {};
  const body = new Uint8Array(4 << 20);
  for (let i = 0; i < body.length; i += 65536) crypto.getRandomValues(body.subarray(i, i + 65536));
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", body));
  out.uploadSha = Array.from(digest, b => b.toString(16).padStart(2, "0")).join("");
  out.upload = await (await fetch("/echo", {method: "POST", body})).json();

  const download = new Uint8Array(await (await fetch(`/download?n=${32 << 20}`)).arrayBuffer());
  out.downloadLength = download.length;
  out.downloadIntact = download.every((b, i) => b === i % 251);

  const bodies = [];
  for (let i = 0; i < 2; i++) bodies.push(await (await fetch("/cached")).text());
  out.cachedBodies = bodies;
  out.stats = await (await fetch("/stats")).json();

  await fetch("/login");
  out.documentCookie = document.cookie;
  out.cookies = await (await fetch("/cookies")).json();

  const held = await fetch("/held");
  const reader = held.body.getReader();
  const first = await reader.read();
  out.beforeRelease = new TextDecoder().decode(first.value);
  out.release = await (await fetch("/release")).text();
  let rest = "";
  for (let r = await reader.read(); !r.done; r = await reader.read()) rest += new TextDecoder().decode(r.value);
  out.afterRelease = rest;

  const ws = new WebSocket(`ws://${location.host}/ws`, ["v1.kernel.websocket.jupyter.org"]);
  ws.binaryType = "arraybuffer";
  const messages = [];
  const closed = new Promise(resolve => { ws.onclose = e => resolve({code: e.code, reason: e.reason}); });
  let next;
  ws.onmessage = e => { messages.push(e.data); if (next) { next(); next = undefined; } };
  const reply = () => new Promise(resolve => { next = resolve; });
  await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = reject; });
  out.extensions = ws.extensions;
  out.protocol = ws.protocol;
  ws.send("hello sandbox");
  await reply();
  const blob = new Uint8Array(1 << 20);
  for (let i = 0; i < blob.length; i += 65536) crypto.getRandomValues(blob.subarray(i, i + 65536));
  ws.send(blob);
  await reply();
  out.text = messages[0];
  const echoed = new Uint8Array(messages[1]);
  out.binaryEqual = echoed.length === blob.length && echoed.every((b, i) => b === blob[i]);
  ws.send("close:4001");
  out.close = await closed;
  return out;
}
"""


def _check_journey(out: dict[str, Any]) -> None:
    """What `_JOURNEY` measured in the page, against what the app sent."""
    assert out["upload"] == {"length": 4 << 20, "sha256": out["uploadSha"]}
    assert (out["beforeRelease"], out["release"], out["afterRelease"]) == ("first\n", "released", "second\n")
    assert (out["downloadLength"], out["downloadIntact"]) == (32 << 20, True)
    assert out["cachedBodies"] == ["cached body", "cached body"]
    assert out["stats"] == {"revalidated": 1}  # the second fetch was a 304 the browser accepted
    assert out["documentCookie"] == "session=s1; theme=dark"
    assert out["cookies"] == {"session": "s1", "theme": "dark"}
    assert "permessage-deflate" in out["extensions"]
    assert out["protocol"] == "v1.kernel.websocket.jupyter.org"
    assert out["text"] == "hello sandbox"
    assert out["binaryEqual"] is True
    assert out["close"] == {"code": 4001, "reason": "bye"}


async def test_a_browser_uses_an_app_in_a_sandbox_through_the_router(
    cluster: DevCluster, namespace: str, controller: Started, router: str, browser: Browser
) -> None:
    _apply_app_pool(cluster, namespace, replicas=2)
    config = SandboxDirectConnectionConfig(api_url=router)
    async with AsyncSandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        first, second = await asyncio.gather(
            *(client.create_sandbox("pool", namespace, sandbox_ready_timeout=90) for _ in range(2))
        )
        try:
            await asyncio.gather(*(_start_app(s, router, namespace) for s in (first, second)))
            contexts = [await _context(browser, _headers(s.sandbox_id, namespace)) for s in (first, second)]
            pages = [await c.new_page() for c in contexts]
            for page in pages:
                response = await page.goto(f"{router}/")
                assert response is not None
                assert response.status == 200
            # The page's script fetched /whoami: each tab shows its own sandbox.
            for page, sandbox in zip(pages, (first, second), strict=True):
                await page.wait_for_function("document.getElementById('who').textContent !== 'loading'")
                assert await page.title() == "sandbox app"
                assert await page.text_content("#who") == sandbox.sandbox_id
            _check_journey(await pages[0].evaluate(_JOURNEY))
        finally:
            for sandbox in (first, second):
                assert sandbox.commands is not None
                await sandbox.commands.run("sh -c 'kill \"$(cat app.pid)\"'")
                await sandbox.terminate()


async def test_a_page_runs_a_command_through_the_runtime(
    cluster: DevCluster, namespace: str, controller: Started, router: str, browser: Browser
) -> None:
    """A browser-based agent UI: same-origin fetch to the runtime's `/execute` (port 8888)."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    config = SandboxDirectConnectionConfig(api_url=router)
    async with AsyncSandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox = await client.create_sandbox("pool", namespace, sandbox_ready_timeout=90)
        try:
            context = await _context(browser, _headers(sandbox.sandbox_id, namespace, 8888))
            page = await context.new_page()
            await page.goto(f"{router}/healthz")  # an origin for the fetch (the router's own endpoint)
            answer = await page.evaluate(
                """async () => (await fetch("/execute", {method: "POST", headers: {"Content-Type":
                "application/json"}, body: JSON.stringify({command: "echo from the browser"})})).json()"""
            )
            assert answer["stdout"] == "from the browser\n"
            assert answer["exit_code"] == 0
        finally:
            await sandbox.terminate()


async def test_the_router_error_reaches_the_browser(
    cluster: DevCluster, namespace: str, router: str, browser: Browser
) -> None:
    """No such sandbox: the browser gets the router's JSON error, not a hang or a reset."""
    context = await _context(browser, _headers("never-existed", namespace))
    page = await context.new_page()
    response = await page.goto(f"{router}/")
    assert response is not None
    assert response.status == 502
    assert response.headers["content-type"] == "application/json"
    assert await response.json() == {"detail": "Could not connect to the backend sandbox: never-existed"}


async def test_a_browser_opens_an_app_through_agent_sandbox_proxy(
    cluster: DevCluster, namespace: str, controller: Started, router: str, browser: Browser
) -> None:
    """`agent-sandbox proxy CLAIM 8000`: the same journey from a plain local URL, no headers added by the
    browser (a person opening what the agent built)."""
    _apply_app_pool(cluster, namespace, replicas=1)
    config = SandboxDirectConnectionConfig(api_url=router)
    async with AsyncSandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox = await client.create_sandbox("pool", namespace, sandbox_ready_timeout=90)
        try:
            await _start_app(sandbox, router, namespace)
            with cli_proxy(cluster, router, namespace, sandbox.claim_name or "", APP_PORT) as url:
                context = await browser.new_context()
                context.set_default_timeout(30_000)
                page = await context.new_page()
                response = await page.goto(url)
                assert response is not None
                assert response.status == 200
                await page.wait_for_function("document.getElementById('who').textContent !== 'loading'")
                assert await page.text_content("#who") == sandbox.sandbox_id
                _check_journey(await page.evaluate(_JOURNEY))
                await context.close()
        finally:
            assert sandbox.commands is not None
            await sandbox.commands.run("sh -c 'kill \"$(cat app.pid)\"'")
            await sandbox.terminate()
