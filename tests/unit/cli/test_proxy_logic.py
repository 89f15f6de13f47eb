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

    from agent_sandbox.cli.sandboxes import _router_headers

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
