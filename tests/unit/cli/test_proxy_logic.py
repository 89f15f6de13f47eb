"""`agent-sandbox proxy`'s pure decisions: close codes it may send, redirects it sends back to itself, when it
passes `Host` on, and the token file read again when it changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.cli.proxy import SandboxProxy, _direct, _sendable, _TokenFile

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("code", "sent"),
    [
        (1000, 1000),
        (1011, 1011),
        (4001, 4001),
        (0, 1000),
        (1005, 1000),
        (1006, 1001),
        (1015, 1001),
        (None, 1001),
    ],
)
def test_reserved_close_codes_are_never_sent(code: int | None, sent: int) -> None:
    assert _sendable(code) == sent


def test_host_is_passed_only_to_a_router_reached_by_address() -> None:
    assert _direct("http://127.0.0.1:8080")
    assert _direct("https://[::1]:8443")
    assert _direct("http://localhost:8080")
    assert not _direct("https://sandboxes.example.com")  # an ingress or Gateway may route on Host


class _Request:
    def __init__(self, host: str) -> None:
        self.headers = {"Host": host}
        self.transport: Any = None


@pytest.mark.parametrize(
    ("location", "back"),
    [
        ("https://sandboxes.example.com/lab?x=1#top", "http://127.0.0.1:5000/lab?x=1#top"),
        ("https://sandboxes.example.com:443/", "http://127.0.0.1:5000/"),
        ("https://127.0.0.1:5000/tree", "http://127.0.0.1:5000/tree"),  # X-Forwarded-Proto: https
        ("/relative", "/relative"),
        ("https://github.com/login", "https://github.com/login"),
        ("http://sandboxes.example.com/", "http://sandboxes.example.com/"),  # another origin
    ],
)
def test_redirects_to_the_router_come_back_to_the_proxy(location: str, back: str) -> None:
    proxy = SandboxProxy("https://sandboxes.example.com", {})
    assert proxy._location(_Request("127.0.0.1:5000"), location) == back  # type: ignore[arg-type]


def test_the_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    token = _TokenFile(str(path))
    assert token.authorization() == "Bearer one"
    (tmp_path / "next").write_text("second")
    (tmp_path / "next").replace(path)  # kubelet swaps the file
    assert token.authorization() == "Bearer second"
    path.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        token.authorization()


def test_a_token_written_with_its_scheme_is_not_sent_as_bearer_bearer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Bearer v1....` (what an Authorization header holds) in the file or in $AGENT_SANDBOX_ROUTER_TOKEN is
    sent once with its scheme: `Bearer Bearer v1....` is refused by every router as unauthenticated."""
    import argparse

    from agent_sandbox.cli.connection import _router_headers

    path = tmp_path / "token"
    path.write_text("Bearer v1.abc.def\n")
    assert _TokenFile(str(path)).authorization() == "Bearer v1.abc.def"
    assert _router_headers(argparse.Namespace(router_token_file=str(path))) == {
        "Authorization": "Bearer v1.abc.def"
    }
    monkeypatch.setenv("AGENT_SANDBOX_ROUTER_TOKEN", "Bearer v1.ghi.jkl")
    assert _router_headers(argparse.Namespace(router_token_file=None)) == {
        "Authorization": "Bearer v1.ghi.jkl"
    }


@pytest.mark.parametrize(
    ("location", "back"),
    [
        ("https://gw.example.com/router/login?a=1", "http://localhost:8001/login?a=1"),
        ("https://gw.example.com/router", "http://localhost:8001/"),
        ("https://gw.example.com/router/", "http://localhost:8001/"),
        ("https://gw.example.com/router/a/b#f", "http://localhost:8001/a/b#f"),
        ("https://gw.example.com/routerx/login", "https://gw.example.com/routerx/login"),  # not under it
        ("https://gw.example.com/other", "https://gw.example.com/other"),  # the gateway's, not the router's
        ("https://localhost:8001/tree", "http://localhost:8001/tree"),  # the proxy itself: path as it is
    ],
)
def test_a_redirect_into_a_router_with_a_path_drops_that_path(location: str, back: str) -> None:
    """The proxy sends each request to the router URL + its path: a redirect to
    https://gw.example.com/router/login came back as /router/login, which the proxy then sent to
    /router/router/login."""
    proxy = SandboxProxy("https://gw.example.com/router/", {})
    assert proxy._location(_Request("localhost:8001"), location) == back  # type: ignore[arg-type]


class _HeaderRequest:
    def __init__(self, headers: list[tuple[str, str]]) -> None:
        from multidict import CIMultiDict, CIMultiDictProxy

        self.headers = CIMultiDictProxy(CIMultiDict(headers))
        self.transport: Any = None


def _all(headers: Any, name: str) -> list[str]:
    return [value for key, value in headers.items() if key.lower() == name.lower()]


def test_the_proxys_own_headers_replace_the_clients_in_any_letter_case(tmp_path: Path) -> None:
    """Node's fetch sends `authorization: Basic abc`; beside the proxy's `Authorization: Bearer T` the
    router got both and read the client's first (401). Routing headers cannot be added by the client either;
    headers the client repeats go on repeated."""
    token = tmp_path / "token"
    token.write_text("T")
    routing = {"X-Sandbox-ID": "sb", "X-Sandbox-Namespace": "ns", "X-Sandbox-Port": "8000"}
    client = [
        ("authorization", "Basic abc"),
        ("x-sandbox-id", "other"),
        ("X-SANDBOX-POD-IP", "10.0.0.9"),
        ("x-sandbox-namespace", "kube-system"),
        ("cookie", "a=1"),
        ("Cookie", "b=2"),
        ("host", "127.0.0.1:5000"),
    ]
    headers = SandboxProxy("http://127.0.0.1:8080", routing, token_file=str(token))._headers(
        _HeaderRequest(client)  # type: ignore[arg-type]
    )
    assert _all(headers, "Authorization") == ["Bearer T"]
    assert _all(headers, "X-Sandbox-ID") == ["sb"]
    assert _all(headers, "X-Sandbox-Namespace") == ["ns"]
    assert _all(headers, "X-Sandbox-Pod-IP") == []
    assert _all(headers, "Cookie") == ["a=1", "b=2"]
    assert _all(headers, "Host") == ["127.0.0.1:5000"]
    # A token from $AGENT_SANDBOX_ROUTER_TOKEN travels in `routing`: it too replaces the client's.
    headers = SandboxProxy("https://gw.example.com", {**routing, "Authorization": "Bearer E"})._headers(
        _HeaderRequest(client)  # type: ignore[arg-type]
    )
    assert _all(headers, "Authorization") == ["Bearer E"]
