"""The SDK and the CLI through a router that demands a token (`--authz-mode=scoped-token`, spec §1.10), on
the real path: the router resolves the sandbox by name through its Pod cache, as it must (scoped tokens
forbid `X-Sandbox-Pod-IP`).

Until December 6 no client could use such a router: the Python SDK always sent `X-Sandbox-Pod-IP` (403
`forbidden`), and the CLI had no way to pass a token at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.router import mint_scoped_token
from agent_sandbox_sdk import (
    SandboxClient,
    SandboxdDirectConnectionConfig,
    SandboxDirectConnectionConfig,
    SandboxRequestError,
)

from .conftest import RUNTIME_IMAGE, apply_pool, router_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SECRET = b"k" * 40
CLI = str(Path(sys.executable).with_name("agent-sandbox"))


@pytest.fixture(scope="module")
def scoped_router(cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A router in scoped-token mode with its Pod cache (h2c on, for sandboxd's gRPC); its URL."""
    secret = tmp_path_factory.mktemp("scoped") / "secret"
    secret.write_bytes(SECRET)
    port = cluster.reserve_port("scoped_router_http")
    flags = ("--enable-h2c", "--authz-mode=scoped-token", f"--authz-scoped-token-secret-file={secret}")
    with router_process(cluster, "scoped_router", f"127.0.0.1:{port}", *flags):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def claimed(cluster: DevCluster, namespace: str, controller: Started, scoped_router: str) -> tuple[str, str]:
    """A Ready claim `sb` (claimed by a client without a token: the claim is the API server's business);
    (claim, sandbox name)."""
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    with SandboxClient(
        SandboxDirectConnectionConfig(api_url=scoped_router), kubeconfig=cluster.kubeconfig
    ) as c:
        sandbox = c.create_sandbox("pool", namespace, claim_name="sb", sandbox_ready_timeout=90)
        return "sb", sandbox.sandbox_id


def _bearer(namespace: str, sandbox: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_scoped_token(SECRET, namespace, sandbox, 600)}"}


@pytest.mark.parametrize("runtime", ["legacy", "sandboxd"])
def test_the_sdk_with_a_scoped_token(
    cluster: DevCluster, namespace: str, scoped_router: str, claimed: tuple[str, str], runtime: str
) -> None:
    claim, sandbox_id = claimed
    kind = SandboxDirectConnectionConfig if runtime == "legacy" else SandboxdDirectConnectionConfig

    def connect(headers: dict[str, str], **options: object) -> SandboxClient:
        return SandboxClient(
            kind(api_url=scoped_router, extra_headers=headers, **options), kubeconfig=cluster.kubeconfig
        )

    with connect(_bearer(namespace, sandbox_id)) as client:
        sandbox = client.get_sandbox(claim, namespace)
        assert sandbox.commands is not None
        assert sandbox.files is not None
        assert sandbox.commands.run("echo scoped").stdout == "scoped\n"
        sandbox.files.write("t.txt", b"token")
        assert sandbox.files.read("t.txt") == b"token"
    # The pod IP, when asked for, is refused by the router: the default is what made the calls above work.
    with connect(_bearer(namespace, sandbox_id), pod_ip_routing=True) as client:
        sandbox = client.get_sandbox(claim, namespace)
        assert sandbox.files is not None
        with pytest.raises(SandboxRequestError) as refused:
            sandbox.files.read("t.txt")
        assert refused.value.status_code == 403
    # A token for another sandbox reaches nothing.
    with connect(_bearer(namespace, "someone-else")) as client:
        sandbox = client.get_sandbox(claim, namespace)
        assert sandbox.files is not None
        with pytest.raises(SandboxRequestError) as refused:
            sandbox.files.read("t.txt")
        assert refused.value.status_code == 403


def test_the_cli_with_a_token(
    cluster: DevCluster, namespace: str, scoped_router: str, claimed: tuple[str, str], tmp_path: Path
) -> None:
    claim, sandbox_id = claimed
    token = _bearer(namespace, sandbox_id)["Authorization"].removeprefix("Bearer ")
    common = ["--kubeconfig", str(cluster.kubeconfig), "--router-url", scoped_router, "-n", namespace]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SANDBOX_ROUTER")}

    def cli(*argv: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CLI, *argv], capture_output=True, text=True, timeout=120, check=False, env={**env, **extra_env}
        )

    out = cli("exec", *common, claim, "--", "echo", "no token")
    assert out.returncode != 0
    assert "HTTP 401: unauthenticated" in out.stderr, out.stderr
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    out = cli("exec", *common, "--router-token-file", str(token_file), claim, "--", "echo", "from a file")
    assert (out.returncode, out.stdout) == (0, "from a file\n"), out.stderr
    out = cli("exec", *common, claim, "--", "echo", "from the env", AGENT_SANDBOX_ROUTER_TOKEN=token)
    assert (out.returncode, out.stdout) == (0, "from the env\n"), out.stderr
    source = tmp_path / "up.txt"
    source.write_text("copied")
    out = cli("cp", *common, str(source), f"{claim}:up.txt", AGENT_SANDBOX_ROUTER_TOKEN=token)
    assert out.returncode == 0, out.stderr
    out = cli("cp", *common, f"{claim}:up.txt", "-", AGENT_SANDBOX_ROUTER_TOKEN=token)
    assert (out.returncode, out.stdout) == (0, "copied"), out.stderr
    out = cli("exec", *common, "--router-token-file", str(tmp_path / "missing"), claim, "--", "true")
    assert (out.returncode, out.stderr) == (
        2,
        f"error: --router-token-file {tmp_path}/missing: No such file or directory\n",
    )


def test_the_sdk_reads_the_token_from_the_environment(
    cluster: DevCluster,
    namespace: str,
    scoped_router: str,
    claimed: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No connection config: `$AGENT_SANDBOX_ROUTER_URL` and `$AGENT_SANDBOX_ROUTER_TOKEN`."""
    claim, sandbox_id = claimed
    token = _bearer(namespace, sandbox_id)["Authorization"].removeprefix("Bearer ")
    monkeypatch.setenv("AGENT_SANDBOX_ROUTER_URL", scoped_router)
    monkeypatch.setenv("AGENT_SANDBOX_ROUTER_TOKEN", token)
    with SandboxClient(kubeconfig=cluster.kubeconfig) as client:
        sandbox = client.get_sandbox(claim, namespace)
        assert sandbox.commands is not None
        assert sandbox.commands.run("echo env").stdout == "env\n"


@pytest.mark.parametrize("runtime", ["legacy", "sandboxd"])
def test_a_refused_request_says_why(
    cluster: DevCluster,
    namespace: str,
    scoped_router: str,
    claimed: tuple[str, str],
    runtime: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The router answers only `unauthenticated`/`forbidden`; the SDK adds what the request shows. Until
    December 6 each case below read the same bare `HTTP 401: unauthenticated` / `HTTP 403: forbidden`.
    REST calls keep the router's status; sandboxd's gRPC calls say the code (UNAUTHENTICATED, ...)."""
    claim, sandbox_id = claimed
    kind = SandboxDirectConnectionConfig if runtime == "legacy" else SandboxdDirectConnectionConfig
    monkeypatch.setenv("AGENT_SANDBOX_ROUTER_TOKEN", "set-but-not-read")
    token = mint_scoped_token(SECRET, namespace, sandbox_id, 600)
    cases: list[tuple[dict[str, str], dict[str, object], int, str]] = [
        ({}, {}, 401, "no Authorization header was sent"),
        ({}, {}, 401, "$AGENT_SANDBOX_ROUTER_TOKEN is set, but this client was given a connection_config"),
        (
            {"Authorization": f"Bearer {mint_scoped_token(SECRET, namespace, sandbox_id, 1, now=1e9)}"},
            {},
            401,
            "the scoped token expired at 2001-09-09T01:46:41Z",
        ),
        (
            _bearer(namespace, "someone-else"),
            {},
            403,
            f"the scoped token is for sandbox {namespace}/someone-else, not {namespace}/{sandbox_id}",
        ),
        (_bearer(namespace, sandbox_id), {"pod_ip_routing": True}, 403, "pod_ip_routing=True sends"),
        ({"Authorization": f"Bearer Bearer {token}"}, {}, 401, "'Bearer Bearer ...'"),
        (
            {"Authorization": f"Bearer {mint_scoped_token(b'another key' * 4, namespace, sandbox_id, 600)}"},
            {},
            401,
            "did not sign it",
        ),
    ]
    for headers, options, status, why in cases:
        config = kind(api_url=scoped_router, extra_headers=headers, **options)  # type: ignore[arg-type]
        with SandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
            sandbox = client.get_sandbox(claim, namespace)
            assert sandbox.files is not None
            assert sandbox.commands is not None
            with pytest.raises(SandboxRequestError) as refused:
                sandbox.files.read("t.txt")
            assert refused.value.status_code == status, refused.value
            assert why in str(refused.value), refused.value
            with pytest.raises(SandboxRequestError) as refused:
                sandbox.commands.run("true")
            assert why in str(refused.value), refused.value


def test_the_environment_token_may_carry_its_bearer_scheme(
    cluster: DevCluster,
    namespace: str,
    scoped_router: str,
    claimed: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`$AGENT_SANDBOX_ROUTER_TOKEN="Bearer v1...."` (an Authorization header's value) is sent once, not
    as `Bearer Bearer v1....` (until December 6: 401 unauthenticated, unexplained)."""
    claim, sandbox_id = claimed
    monkeypatch.setenv("AGENT_SANDBOX_ROUTER_URL", scoped_router)
    monkeypatch.setenv("AGENT_SANDBOX_ROUTER_TOKEN", _bearer(namespace, sandbox_id)["Authorization"])
    with SandboxClient(kubeconfig=cluster.kubeconfig) as client:
        sandbox = client.get_sandbox(claim, namespace)
        assert sandbox.commands is not None
        assert sandbox.commands.run("echo env").stdout == "env\n"
