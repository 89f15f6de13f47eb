"""`agent-sandbox dev up --router` / `dev router-url`: the real router process owned by a dev cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agent_sandbox.cli.main import main as cli_main
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import stop
from agent_sandbox.devcluster.router import ROUTER, router_url, start_router
from agent_sandbox_sdk import SandboxClient, SandboxdDirectConnectionConfig, SandboxDirectConnectionConfig
from tests.integration.devcluster.runtime_helpers import RUNTIME_IMAGE
from tests.integration.sdk.conftest import apply_pool

pytestmark = pytest.mark.integration


def get(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_dev_router(cluster: DevCluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert router_url(cluster) is None
    started = start_router(cluster)
    try:
        url = router_url(cluster)
        assert url is not None
        assert url.startswith("http://127.0.0.1:")
        assert cli_main(["dev", "router-url", "--name", cluster.name]) == 0
        assert capsys.readouterr().out.strip() == url
        assert get(f"{url}/healthz", {}) == (200, {"status": "ok"})
        # Loopback pod IPs are allowed in the dev cluster only as a sandbox's: the API server is not one.
        port = cluster.server.rsplit(":", 1)[1]
        status, body = get(
            f"{url}/api", {"X-Sandbox-ID": "sb", "X-Sandbox-Pod-IP": "127.0.0.1", "X-Sandbox-Port": port}
        )
        assert (status, body) == (
            403,
            {"detail": "X-Sandbox-Pod-IP 127.0.0.1 does not belong to sandbox default/sb."},
        )
        # Link-local stays refused whatever the flags.
        status, body = get(f"{url}/", {"X-Sandbox-ID": "sb", "X-Sandbox-Pod-IP": "169.254.169.254"})
        assert (status, body) == (400, {"detail": "Invalid target IP address."})
        assert any(s.name == ROUTER and s.pid == started.pid for s in cluster.state.started)
    finally:
        stop(started)
    assert router_url(cluster) is None
    assert cli_main(["dev", "router-url", "--name", cluster.name]) != 0


def test_dev_up_router_serves_both_runtimes_through_the_sdk() -> None:
    """`dev up --router --controller` as a user types it: legacy and sandboxd (gRPC over h2c) both work."""
    name = f"devup-router-{os.getpid()}"
    cli = str(Path(sys.executable).with_name("agent-sandbox"))
    up = subprocess.run(
        [cli, "dev", "up", "--name", name, "--router", "--controller"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        assert up.returncode == 0, up.stderr
        cluster = DevCluster.load(name)
        assert cluster is not None
        url = router_url(cluster)
        assert url is not None
        apply_pool(
            cluster,
            "default",
            replicas=2,
            containers=[{"name": "runtime", "image": RUNTIME_IMAGE}],
        )
        for config in (
            SandboxDirectConnectionConfig(api_url=url),
            SandboxdDirectConnectionConfig(api_url=url),
        ):
            with SandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
                sandbox = client.create_sandbox("pool", "default", sandbox_ready_timeout=90)
                assert sandbox.commands is not None
                assert sandbox.commands.run("echo routed").stdout == "routed\n", type(config).__name__
                sandbox.terminate()
    finally:
        down = subprocess.run(
            [cli, "dev", "down", "--name", name], capture_output=True, text=True, check=False
        )
        assert down.returncode == 0, down.stderr
