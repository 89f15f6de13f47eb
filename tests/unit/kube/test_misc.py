"""Small pure pieces: REST paths, bind addresses, kubeconfig auth resolution, structured logging."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import orjson
import pytest

from agent_sandbox.kube import (
    CRD,
    LEASE,
    NAMESPACE,
    POD,
    SANDBOX,
    SANDBOX_CLAIM,
    ConfigError,
    load_config,
    selector_string,
)
from agent_sandbox.kube._logging import JsonFormatter, bind_reconcile, parse_zap_level
from agent_sandbox.kube._servers import parse_bind_address

pytestmark = pytest.mark.unit


def test_rest_paths() -> None:
    assert POD.path("ns") == "/api/v1/namespaces/ns/pods"
    assert POD.path("ns", "p", "status") == "/api/v1/namespaces/ns/pods/p/status"
    assert POD.path() == "/api/v1/pods"
    assert NAMESPACE.path(None, "x") == "/api/v1/namespaces/x"
    assert LEASE.path("kube-system", "l") == "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l"
    assert CRD.path(None, "sandboxes.agents.x-k8s.io").endswith(
        "/customresourcedefinitions/sandboxes.agents.x-k8s.io"
    )
    assert SANDBOX.path("ns", "s") == "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/s"
    assert SANDBOX_CLAIM.api_version == "extensions.agents.x-k8s.io/v1beta1"
    assert SANDBOX.group_kind == "Sandbox.agents.x-k8s.io"
    with pytest.raises(ValueError, match="namespaced"):
        POD.path(None, "p")
    with pytest.raises(ValueError, match="subresource"):
        POD.path("ns", None, "status")
    with pytest.raises(
        ValueError, match="SandboxClaim name must not be empty"
    ):  # `<plural>/` is the collection
        SANDBOX_CLAIM.path("ns", "")


def test_selector_string() -> None:
    assert selector_string({"a": "1", "b": "2"}) == "a=1,b=2"
    assert selector_string("x in (y)") == "x in (y)"
    assert selector_string(None) is None


@pytest.mark.parametrize(
    ("addr", "parsed"),
    [
        (":8080", (None, 8080)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9", ("::1", 9)),
        ("0", None),
        ("", None),
    ],
)
def test_bind_addresses(addr: str, parsed: tuple[str | None, int] | None) -> None:
    assert parse_bind_address(addr) == parsed


@pytest.mark.parametrize("bad", ["8080", "host:", "host:http", ":70000"])
def test_bad_bind_addresses(bad: str) -> None:
    with pytest.raises(ValueError, match="bind address"):
        parse_bind_address(bad)


def _kubeconfig(tmp_path: Path, user: str) -> Path:
    path = tmp_path / "config"
    path.write_text(
        f"""
apiVersion: v1
kind: Config
current-context: c
clusters:
- name: k
  cluster: {{server: "https://127.0.0.1:6443/", insecure-skip-tls-verify: true}}
contexts:
- name: c
  context: {{cluster: k, user: u, namespace: team}}
users:
- name: u
  user: {user}
"""
    )
    return path


async def test_kubeconfig_token_and_token_file(tmp_path: Path) -> None:
    cfg = load_config(_kubeconfig(tmp_path, "{token: abc}"))
    assert cfg.server == "https://127.0.0.1:6443"
    assert cfg.namespace == "team"
    assert await cfg.auth.header() == "Bearer abc"
    (tmp_path / "tok").write_text("one\n")
    cfg = load_config(_kubeconfig(tmp_path, "{tokenFile: tok}"))
    assert await cfg.auth.header() == "Bearer one"
    (tmp_path / "tok").write_text("two")
    assert await cfg.auth.refresh()  # a 401 forces a re-read of the rotated token
    assert await cfg.auth.header() == "Bearer two"


async def test_kubeconfig_basic_and_exec(tmp_path: Path) -> None:
    cfg = load_config(_kubeconfig(tmp_path, "{username: u, password: p}"))
    assert await cfg.auth.header() == "Basic dTpw"
    script = tmp_path / "cred.sh"
    script.write_text(
        '#!/bin/sh\necho \'{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        '"status":{"token":"from-exec"}}\'\n'
    )
    script.chmod(0o755)
    cfg = load_config(
        _kubeconfig(tmp_path, f"{{exec: {{apiVersion: client.authentication.k8s.io/v1, command: {script}}}}}")
    )
    assert await cfg.auth.header() == "Bearer from-exec"


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ("{}", "returned neither a token nor a client certificate"),
        ('{"clientCertificateData": "x"}', "clientCertificateData and clientKeyData not both"),
        ('{"token": 5}', "token and certificate fields must be strings"),
        (
            '{"clientCertificateData": "x", "clientKeyData": "y"}',
            "cannot load the exec plugin's client certificate",
        ),
    ],
)
async def test_exec_plugin_answers_that_cannot_be_used_are_named(
    tmp_path: Path, status: str, message: str
) -> None:
    script = tmp_path / "cred.sh"
    script.write_text(
        '#!/bin/sh\necho \'{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        f'"status":{status}}}\'\n'
    )
    script.chmod(0o755)
    cfg = load_config(
        _kubeconfig(tmp_path, f"{{exec: {{apiVersion: client.authentication.k8s.io/v1, command: {script}}}}}")
    )
    with pytest.raises(ConfigError, match=message):
        await cfg.auth.header()


def test_kubeconfig_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError):
        load_config(tmp_path / "missing")
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path, "{token: fromenv}")))
    assert load_config().namespace == "team"


def test_json_log_lines_carry_reconcile_context() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(time_encoding="epoch"))
    logger = logging.getLogger("test.json")
    logger.addHandler(handler)
    logger.propagate = False
    token = bind_reconcile("sandbox", "ns", "sb", "rid-1")
    try:
        logger.warning("hello %s", "world", extra={"pods": 2})
    finally:
        token.reset()
    logger.warning("outside")
    first, second = (orjson.loads(line) for line in stream.getvalue().splitlines())
    assert first["msg"] == "hello world"
    assert first["level"] == "warn"
    assert (first["controller"], first["namespace"], first["name"], first["reconcileID"]) == (
        "sandbox",
        "ns",
        "sb",
        "rid-1",
    )
    assert first["pods"] == 2
    assert isinstance(first["ts"], float)
    assert "reconcileID" not in second


def test_zap_levels() -> None:
    assert parse_zap_level("debug") == logging.DEBUG
    assert parse_zap_level("error") == logging.ERROR
    assert parse_zap_level("2") < logging.DEBUG
    for bad in ("0", "-1", "warn", "loud"):
        with pytest.raises(ValueError, match="log level"):
            parse_zap_level(bad)
