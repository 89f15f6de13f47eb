"""A sandbox's pod disappears while the router streams its output to a client.

Real control plane, real controller, the dev cluster's local runner serving the project's runtime on each
sandbox pod's IP, and the real router (in-process, its Pod cache watching the API server). Two clients
stream `POST /execute/stream` (NDJSON) through the router, one per sandbox; mid-stream one sandbox's pod
goes away, either because its runtime crashes (the process serving it dies: connections reset) or
because the pod is force-deleted (the runtime drains: commands get SIGTERM).

What must hold: the affected client's stream ends within seconds, either as an incomplete HTTP response
(the router aborts the connection: no terminating chunk, so no client mistakes it for a complete
response) or with a final `exit` event that reports the kill; it never hangs and never ends as if the
command had succeeded. The other client's stream completes untouched, and the router keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httptools
import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.devcluster.router import router_kubeconfig
from agent_sandbox.kube import POD, SANDBOX, ApiClient, Object
from agent_sandbox.router import Router, load_router_config
from tests.helpers import eventually, is_ready
from tests.integration.devcluster.runtime_helpers import runtime_pod_spec

pytestmark = pytest.mark.integration

LINES = 80  # one every 0.1 s: the stream runs ~8 s


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    started = start_controller(cluster)
    try:
        yield started
    finally:
        stop(started)


@pytest.fixture
async def router(cluster: DevCluster, controller: Started) -> AsyncIterator[Router]:
    flags = ["--allow-loopback-pod-ip", "--cache-enabled"]
    # As the dev routers: the install's `sandbox-router` ServiceAccount under
    # AGENT_SANDBOX_CONTROLLER_IDENTITY=serviceaccount (CI), so the shipped RBAC is what the faults meet.
    args = [
        "--http-bind-address=127.0.0.1:0",
        "--metrics-bind-address=127.0.0.1:0",
        "--health-probe-bind-address=127.0.0.1:0",
        *flags,
        f"--kubeconfig={router_kubeconfig(cluster, flags)}",
    ]
    config, _ = load_router_config(args, {})
    started = Router(config)
    await started.start()
    try:
        yield started
    finally:
        await started.shutdown()


@dataclass
class Stream:
    """One streamed response read incrementally: NDJSON events, and how it ended."""

    status: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = False  # the terminating chunk arrived
    ended_at: float = 0.0
    _buf: bytes = b""

    def on_body(self, body: bytes) -> None:
        self._buf += body
        *lines, self._buf = self._buf.split(b"\n")
        self.events.extend(json.loads(line) for line in lines if line.strip())

    def on_message_complete(self) -> None:
        self.complete = True

    @property
    def exit(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e["type"] == "exit"), None)

    @property
    def stdout_lines(self) -> int:
        return "".join(e["data"] for e in self.events if e["type"] == "stdout").count("\n")


async def stream_through(
    router: Router, routing: dict[str, str], out: Stream, *, within: float = 60.0
) -> None:
    """Stream a command's output (`POST /execute/stream`) through the router with these routing headers."""
    command = f"sh -c 'for i in $(seq 1 {LINES}); do echo $i; sleep 0.1; done'"
    body = json.dumps({"command": command}).encode()
    headers = "".join(f"{k}: {v}\r\n" for k, v in routing.items())
    head = (
        f"POST /execute/stream HTTP/1.1\r\nHost: r\r\n{headers}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port or 0)
    parser = httptools.HttpResponseParser(out)
    try:
        writer.write(head.encode() + body)
        async with asyncio.timeout(within):
            while not out.complete:
                chunk = await reader.read(65536)
                if not chunk:
                    break  # the connection ended before the response did
                parser.feed_data(chunk)
                out.status = parser.get_status_code()
    finally:
        out.ended_at = time.monotonic()
        writer.close()


async def stream(router: Router, ns: str, sandbox: str, out: Stream, *, within: float = 60.0) -> None:
    await stream_through(router, {"X-Sandbox-ID": sandbox, "X-Sandbox-Namespace": ns}, out, within=within)


def runtime_sandbox(name: str) -> Object:
    return {
        "apiVersion": SANDBOX.api_version,
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": runtime_pod_spec()}},
    }


async def ready_pod(kube: ApiClient, ns: str, name: str) -> Object:
    async def probe() -> Object | None:
        try:
            pod = await kube.get(POD, name, namespace=ns)
        except Exception:
            return None
        return pod if is_ready(pod) and pod["status"].get("podIP") else None

    return await eventually(probe, f"pod {name} Ready", within=60)


@pytest.mark.parametrize("how", ["runtime crash", "pod force-deleted"])
async def test_pod_gone_mid_stream(
    cluster: DevCluster, kube: ApiClient, namespace: str, router: Router, how: str
) -> None:
    ns = namespace
    for name in ("doomed", "steady"):
        await kube.create(SANDBOX, runtime_sandbox(name), namespace=ns)
    for name in ("doomed", "steady"):
        await ready_pod(kube, ns, name)
    doomed, steady = Stream(), Stream()

    async def reachable() -> bool:
        probe = Stream()
        await stream(router, ns, "steady", probe, within=30)
        return probe.status == 200

    await eventually(reachable, "the router's cache knows the sandboxes", within=60)
    tasks = [
        asyncio.create_task(stream(router, ns, n, s)) for n, s in (("doomed", doomed), ("steady", steady))
    ]

    async def both_streaming() -> bool:
        return doomed.stdout_lines >= 5 and steady.stdout_lines >= 5

    await eventually(both_streaming, "both streams flowing", within=30)
    gone_at = time.monotonic()
    if how == "runtime crash":
        await asyncio.to_thread(cluster.crash_runtime, ns, "doomed")
    else:
        await kube.delete(POD, "doomed", namespace=ns, grace_period_seconds=0)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)

    took = doomed.ended_at - gone_at
    print(f"{how}: doomed stream ended {took:.2f}s later after {doomed.stdout_lines} lines, "
          f"complete={doomed.complete}, exit={doomed.exit}")  # fmt: skip
    assert doomed.status == 200
    assert took < 10, "the client was left hanging"
    assert doomed.stdout_lines < LINES
    if doomed.complete:  # the runtime drained: the last event says the command was killed
        assert doomed.exit is not None
        assert doomed.exit["exit_code"] != 0
    else:  # the router cut the connection: no exit event, no terminating chunk
        assert doomed.exit is None
    # The other stream was not disturbed, and the router still serves.
    assert steady.complete
    assert steady.exit == {"type": "exit", "exit_code": 0, "timed_out": False}
    assert steady.stdout_lines == LINES
    again = Stream()
    await stream(router, ns, "steady", again, within=30)
    assert (again.status, again.complete, again.stdout_lines) == (200, True, LINES)
