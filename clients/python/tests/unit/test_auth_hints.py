"""A router's 401/403 says why when the request shows it (`_authhint`), and `$AGENT_SANDBOX_ROUTER_TOKEN` given
with its `Bearer ` scheme is not doubled. Until December 6 every cause read `HTTP 401: unauthenticated` /
`HTTP 403: forbidden`. Against a real scoped-token router: tests/integration/sdk/test_router_tokens.py."""

from __future__ import annotations

import base64
import json

import pytest

from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig, SandboxRequestError
from agent_sandbox_sdk._authhint import auth_hint, scoped_token_claims
from agent_sandbox_sdk._shared import router_token_headers

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit

NOW = 1_800_000_000


def _scoped(ns: str = "ns", name: str = "sb", exp: int = NOW + 600) -> str:
    """A token of the router's scoped-token shape (signature not checked by the client)."""
    payload = json.dumps({"ns": ns, "name": name, "exp": exp}, separators=(",", ":")).encode()
    encoded = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
    return f"v1.{encoded}.c2lnbmF0dXJl"


def _hint(status: int, authorization: str | None = None, *, pod_ip: bool = False) -> str | None:
    headers = {"X-Sandbox-ID": "sb", "X-Sandbox-Namespace": "ns"}
    if authorization is not None:
        headers["authorization"] = authorization
    if pod_ip:
        headers["X-Sandbox-Pod-IP"] = "10.0.0.5"
    return auth_hint(status, headers, "ns", "sb", now=NOW)


def test_a_scoped_token_payload_is_read_without_its_key() -> None:
    assert scoped_token_claims(_scoped()) == ("ns", "sb", NOW + 600)
    for other in ("opaque", "v1.x.y", "v2." + _scoped()[3:], _scoped() + ".z", "v1.bm90IGpzb24.sig"):
        assert scoped_token_claims(other) is None


def test_each_refusal_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_SANDBOX_ROUTER_TOKEN", raising=False)
    assert "no Authorization header was sent" in (_hint(401) or "")
    assert "$AGENT_SANDBOX_ROUTER_TOKEN is set" not in (_hint(401) or "")
    assert _hint(403) is None  # a 403 without a token is not about the token
    assert "expired at 2027-01-15T07:59:55Z" in (_hint(401, f"Bearer {_scoped(exp=NOW - 5)}") or "")
    assert "did not sign it" in (_hint(401, f"Bearer {_scoped()}") or "")
    assert "scoped token is for sandbox ns/other, not ns/sb" in (
        _hint(403, f"Bearer {_scoped(name='other')}") or ""
    )
    assert "pod_ip_routing=True" in (_hint(403, f"Bearer {_scoped()}", pod_ip=True) or "")
    assert (
        _hint(403, f"Bearer {_scoped()}") is None
    )  # the token fits: the refusal is not the client's to explain
    assert "'Bearer Bearer ...'" in (_hint(401, f"Bearer Bearer {_scoped()}") or "")
    assert "'Bearer <token>'" in (_hint(401, "Token abc") or "")
    assert "ServiceAccount deleted" in (_hint(401, "Bearer opaque-service-account-token") or "")
    assert _hint(403, "Bearer opaque-service-account-token") is None


def test_a_token_in_the_environment_beside_an_explicit_config_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENT_SANDBOX_ROUTER_TOKEN", "abc")
    assert "$AGENT_SANDBOX_ROUTER_TOKEN is set, but this client was given a connection_config" in (
        _hint(401) or ""
    )


def test_the_environment_token_may_carry_its_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("v1.a.b", " v1.a.b\n", "Bearer v1.a.b", "bearer   v1.a.b "):
        monkeypatch.setenv("AGENT_SANDBOX_ROUTER_TOKEN", value)
        assert router_token_headers(None) == {"Authorization": "Bearer v1.a.b"}
    monkeypatch.setenv("AGENT_SANDBOX_ROUTER_TOKEN", "Bearer")  # a token that happens to read "Bearer"
    assert router_token_headers(None) == {"Authorization": "Bearer Bearer"}
    monkeypatch.setenv("AGENT_SANDBOX_ROUTER_TOKEN", "")
    assert router_token_headers(None) == {}


@pytest.mark.parametrize("path", ["/execute", "/execute/stream", "/download/"])
def test_the_hint_reaches_the_caller_with_the_routers_status(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_SANDBOX_ROUTER_TOKEN", raising=False)
    fake = FakeCluster()
    config = SandboxDirectConnectionConfig(api_url=ROUTER)
    with SandboxClient(config, api_client=endpoint(), transport=fake.transport()) as client:
        sandbox = client.create_sandbox("python-pool")
        commands, files = sandbox.commands, sandbox.files
        assert commands is not None
        assert files is not None
        call = {
            "/execute": lambda: commands.run("true"),
            "/execute/stream": lambda: commands.stream("true").result(),
            "/download/": lambda: files.read("f"),
        }[path]
        fake.faults[path] = [401]
        with pytest.raises(SandboxRequestError) as refused:
            call()
    assert type(refused.value) is SandboxRequestError
    assert refused.value.status_code == 401
    assert "HTTP 401" in str(refused.value)
    assert "no Authorization header was sent" in str(refused.value)
