"""Unusual file names through the file flows: control characters in `exists`, CR/LF in an upload's name.

Legacy runtime: the in-memory router + runtime of fakes.py. sandboxd: the flow itself, its requests recorded
(`_files.call` replaced), since the wire is one URL per call.
"""

from __future__ import annotations

from collections.abc import Generator
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest

from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig, _files
from agent_sandbox_sdk._steps import Trace

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit


def legacy_files(fake: FakeCluster) -> Any:
    client = SandboxClient(
        SandboxDirectConnectionConfig(api_url=ROUTER), api_client=endpoint(), transport=fake.transport()
    )
    files = client.create_sandbox("python-pool").files
    assert files is not None
    return files


def run_sandboxd(monkeypatch: pytest.MonkeyPatch, flow_of: Any, status: int = 200) -> list[tuple[str, str]]:
    """Drive a sandboxd flow to its end; the (method, URL path) of each request it made."""
    sent: list[tuple[str, str]] = []

    def call(conn: Any, method: str, path: str, **kw: Any) -> Generator[Any, Any, Any]:
        sent.append((method, path))
        return httpx2.Response(status, headers={"content-type": "application/octet-stream"})
        yield  # a flow

    monkeypatch.setattr(_files, "call", call)
    flow = flow_of(SimpleNamespace(runtime="sandboxd"))
    try:
        step = next(flow)
        while True:
            assert isinstance(step, Trace)
            step = flow.send({})
    except StopIteration:
        pass
    return sent


# ------------------------------------------------------------------------------------------------ exists


@pytest.mark.parametrize("name", ["new\nline", "tab\there", "del\x7f", "cr\rx"])
def test_exists_answers_for_names_with_control_characters_on_the_legacy_runtime(name: str) -> None:
    """As upstream 1.0.8: a bool, the runtime asked (until December 6 a ValueError, though list and delete
    take such names and the runtime answers for them)."""
    fake = FakeCluster()
    files = legacy_files(fake)
    assert files.exists(name) is False
    fake.files[name] = b"x"
    assert files.exists(name) is True
    assert fake.requests[-1].url.raw_path.startswith(b"/exists/")


def test_exists_answers_for_names_with_control_characters_on_sandboxd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent = run_sandboxd(monkeypatch, lambda conn: _files.exists(conn, "new\nline", timeout=1.0))
    assert sent == [("HEAD", "/v1/files/new%0Aline")]


# ------------------------------------------------------------------------------------------------ write


@pytest.mark.parametrize("name", ["new\nline.txt", "cr\r.txt", "dir/a\r\nb"])
@pytest.mark.parametrize("content", [b"x", b"x" * (_files.STREAM_ABOVE + 1)])
def test_legacy_write_refuses_a_line_break_in_the_name(name: str, content: bytes) -> None:
    """The multipart header cannot carry CR/LF; until December 6 they were sent as `%0D`/`%0A`, which the
    runtime does not decode: the file was silently written under another name (`new%0Aline.txt`)."""
    fake = FakeCluster()
    files = legacy_files(fake)
    with pytest.raises(ValueError, match=r"line break.*legacy runtime.*upload"):
        files.write(name, content, allow_unsafe_paths=True)
    assert not fake.find(lambda r: r.url.path == "/upload")
    assert fake.files == {}


def test_legacy_write_refuses_a_line_break_named_in_the_error() -> None:
    fake = FakeCluster()
    with pytest.raises(ValueError, match=r"'new\\nline\.txt'"):
        legacy_files(fake).write("new\nline.txt", b"x", allow_unsafe_paths=True)


def test_multipart_framing_refuses_a_line_break() -> None:
    with pytest.raises(ValueError, match="line break"):
        _files._multipart_framing("a\nb")


def test_legacy_write_takes_other_unusual_names_with_allow_unsafe_paths() -> None:
    fake = FakeCluster()
    legacy_files(fake).write("tab\there /x.txt", b"x", allow_unsafe_paths=True)
    assert list(fake.files) == ["tab\there /x.txt"]


def test_sandboxd_write_keeps_line_breaks_in_the_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """sandboxd takes the name in the URL, percent-encoded: it round-trips."""
    sent = run_sandboxd(
        monkeypatch,
        lambda conn: _files.write(conn, "new\nline\r.txt", b"x", timeout=1.0, allow_unsafe_paths=True),
    )
    assert sent == [("PUT", "/v1/files/new%0Aline%0D.txt")]


def test_write_without_allow_unsafe_paths_still_refuses_control_characters() -> None:
    fake = FakeCluster()
    with pytest.raises(ValueError, match="control characters"):
        legacy_files(fake).write("new\nline.txt", b"x")
