"""grpcurl, a gRPC client nobody here wrote, through the router's h2c pass-through to a sandbox's
process.v1 service: server reflection (list, describe), a unary Execute, a server-streaming Start, and the
router's refusals as gRPC statuses. The routing headers are grpcurl `-H` metadata, as docs/router.md says.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import SandboxClient, SandboxdDirectConnectionConfig
from tests.grpcurl import ensure_grpcurl

from .conftest import RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SERVICE = "process.v1.ProcessService"


@pytest.fixture(scope="module")
def grpcurl() -> Path:
    return ensure_grpcurl()


@pytest.fixture
def sandbox(
    cluster: DevCluster, namespace: str, controller: Started, router: str
) -> Iterator[tuple[str, str]]:
    """A claimed sandbox: (namespace, sandbox name)."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    with SandboxClient(
        SandboxdDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig
    ) as client:
        created = client.create_sandbox("pool", namespace, sandbox_ready_timeout=90)
        try:
            yield namespace, created.sandbox_id
        finally:
            created.terminate()


def _grpcurl(
    grpcurl: Path, router: str, headers: dict[str, str], *args: str, data: object = None
) -> subprocess.CompletedProcess[str]:
    argv = [str(grpcurl), "-plaintext", "-max-time", "30"]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    if data is not None:
        argv += ["-d", json.dumps(data)]
    argv += [urlsplit(router).netloc, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def _routing(namespace: str, name: str) -> dict[str, str]:
    return {"x-sandbox-id": name, "x-sandbox-namespace": namespace, "x-sandbox-port": "9090"}


def test_reflection_execute_and_start(grpcurl: Path, router: str, sandbox: tuple[str, str]) -> None:
    headers = _routing(*sandbox)
    listed = _grpcurl(grpcurl, router, headers, "list")
    assert listed.returncode == 0, listed.stderr
    assert SERVICE in listed.stdout.split()
    described = _grpcurl(grpcurl, router, headers, "describe", SERVICE)
    assert described.returncode == 0, described.stderr
    for rpc in ("Start", "Execute", "WriteStdin", "SendSignal", "ResizeTTY"):
        assert f"rpc {rpc} (" in described.stdout

    command = {"config": {"command": ["/bin/sh", "-c", "echo hi; echo oops >&2; exit 3"]}}
    executed = _grpcurl(grpcurl, router, headers, f"{SERVICE}/Execute", data=command)
    assert executed.returncode == 0, executed.stderr
    # protobuf JSON: bytes are base64, int32 zero values omitted
    assert json.loads(executed.stdout) == {"exitCode": 3, "stdout": "aGkK", "stderr": "b29wcwo="}

    streamed = _grpcurl(
        grpcurl, router, headers, f"{SERVICE}/Start",
        data={"config": {"command": ["/bin/sh", "-c", "echo one; sleep 0.2; echo two; exit 4"]}},
    )  # fmt: skip
    assert streamed.returncode == 0, streamed.stderr
    events = _json_stream(streamed.stdout)
    assert set(events[0]) == {"init"}
    assert b"".join(base64.b64decode(e["stdout"]) for e in events if "stdout" in e) == b"one\ntwo\n"
    assert events[-1] == {"exit": {"exitCode": 4}}


def _json_stream(text: str) -> list[dict[str, Any]]:
    """grpcurl prints a stream's messages as consecutive JSON documents."""
    decoder, events, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        event, at = decoder.raw_decode(text, at)
        events.append(event)
        while at < len(text) and text[at].isspace():
            at += 1
    return events


def test_router_refusals_are_grpc_statuses(grpcurl: Path, router: str, sandbox: tuple[str, str]) -> None:
    namespace, _ = sandbox
    missing = _grpcurl(grpcurl, router, {"x-sandbox-namespace": namespace}, "list")
    assert missing.returncode != 0
    assert "code = InvalidArgument desc = " in missing.stderr, missing.stderr
    assert missing.stderr.rstrip().endswith("X-Sandbox-ID header is required.")
    ghost = _grpcurl(grpcurl, router, _routing(namespace, "never-existed"), f"{SERVICE}/Execute", data={})
    assert ghost.returncode != 0
    assert "code = Unavailable desc = " in ghost.stderr, ghost.stderr
    assert ghost.stderr.rstrip().endswith("Could not connect to the backend sandbox: never-existed")
