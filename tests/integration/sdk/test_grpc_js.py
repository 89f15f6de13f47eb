"""grpc-js (Node's gRPC, its own HTTP/2 stack), a client nobody here wrote, through the router's h2c
pass-through to a sandbox's process.v1 service: unary and server-streaming calls, 50 concurrent calls on one
connection, 1 MiB of output, a call naming another sandbox on the same connection, a deadline, and the
connection still serving after each. grpcio and grpcurl (Go) are tested elsewhere; a third HTTP/2
implementation frames and compresses headers its own way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import SandboxClient, SandboxdDirectConnectionConfig
from tests.grpc_js import ensure_grpc_js

from .conftest import RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
PROTO = ROOT / "src" / "agent_sandbox" / "api" / "processv1" / "process.proto"
CLIENT = Path(__file__).with_name("grpc_js_client.js")


@pytest.fixture
def sandbox(cluster: DevCluster, namespace: str, controller: Started, router: str) -> Iterator[str]:
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    with SandboxClient(SandboxdDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig) as c:
        created = c.create_sandbox("pool", namespace, sandbox_ready_timeout=90)
        try:
            yield created.sandbox_id
        finally:
            created.terminate()


def test_grpc_js_through_the_h2c_pass_through(router: str, namespace: str, sandbox: str) -> None:
    node = shutil.which("node")
    assert node is not None, "Node.js is needed for this test"
    modules = ensure_grpc_js() / "node_modules"
    argv = [node, str(CLIENT), urlsplit(router).netloc, sandbox, namespace, str(PROTO)]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={**os.environ, "NODE_PATH": str(modules)}
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["first"] == {
        "code": 0,
        "exit_code": 0,
        "stdout": "hello from grpc-js\n",
        "stdout_bytes": 19,
    }
    assert out["concurrent"] == [f"call {i}\n" for i in range(50)]
    assert (out["big"]["code"], out["big"]["stdout_bytes"]) == (0, 1_000_000)
    stream = out["stream"]
    assert stream["code"] == 0, stream
    events = stream["events"]
    assert (events[0], events[-1]) == (["init"], ["exit", 3])
    # chunks as the runtime read them (a loaded box may read two lines at once)
    assert "".join(e[1] for e in events[1:-1] if e[0] == "stdout") == "line 1\nline 2\nline 3\n"
    assert out["other"] == {
        "code": 14,  # UNAVAILABLE
        "details": "Could not connect to the backend sandbox: no-such-sandbox",
    }
    assert out["after_other"]["stdout"] == "still here\n"
    assert out["deadline"]["code"] == 4  # DEADLINE_EXCEEDED
    assert out["after_deadline"]["stdout"] == "after the deadline\n"
