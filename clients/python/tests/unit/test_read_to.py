"""`files.read_to(path, <local path>)` replaces the local file only when the whole download arrived: a refused
(`max_bytes`) or broken download leaves what was there before, and no partial file behind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig, SandboxError

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit

BODY = b"x" * 100_000


class Downloads(FakeCluster):
    """A runtime whose download answers `BODY`, or breaks after half of it when `broken`."""

    broken = False

    def _runtime(self, request: httpx2.Request, path: str) -> httpx2.Response:
        def chunks() -> Iterator[bytes]:
            yield BODY[:50_000]
            if self.broken:
                raise httpx2.ReadError("connection reset")
            yield BODY[50_000:]

        return httpx2.Response(200, content=chunks(), headers={"content-type": "application/octet-stream"})


@pytest.fixture
def files() -> Iterator[tuple[Downloads, Any]]:
    fake = Downloads()
    with SandboxClient(
        SandboxDirectConnectionConfig(api_url=ROUTER), api_client=endpoint(), transport=fake.transport()
    ) as client:
        yield fake, client.create_sandbox("pool").files


def test_a_complete_download_replaces_the_file_and_keeps_its_mode(files: Any, tmp_path: Path) -> None:
    _, sandbox_files = files
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    target.chmod(0o640)
    assert sandbox_files.read_to("a.bin", target) == len(BODY)
    assert target.read_bytes() == BODY
    assert target.stat().st_mode & 0o777 == 0o640
    assert os.listdir(tmp_path) == ["out.bin"]


def test_a_download_through_a_symlink_replaces_its_target(files: Any, tmp_path: Path) -> None:
    _, sandbox_files = files
    (tmp_path / "real.bin").write_bytes(b"old")
    (tmp_path / "link.bin").symlink_to("real.bin")
    sandbox_files.read_to("a.bin", tmp_path / "link.bin")
    assert (tmp_path / "link.bin").is_symlink()
    assert (tmp_path / "real.bin").read_bytes() == BODY


@pytest.mark.parametrize("failure", ["max_bytes", "broken"])
def test_a_failed_download_leaves_the_previous_file(files: Any, tmp_path: Path, failure: str) -> None:
    fake, sandbox_files = files
    fake.broken = failure == "broken"
    target = tmp_path / "out.bin"
    target.write_bytes(b"the previous content")
    with pytest.raises(SandboxError):
        sandbox_files.read_to("a.bin", target, max_bytes=1000 if failure == "max_bytes" else None)
    assert target.read_bytes() == b"the previous content"
    assert os.listdir(tmp_path) == ["out.bin"]
    with pytest.raises(SandboxError):
        sandbox_files.read_to(
            "a.bin", tmp_path / "new.bin", max_bytes=1000 if failure == "max_bytes" else None
        )
    assert os.listdir(tmp_path) == ["out.bin"]


def test_a_directory_is_not_a_destination(files: Any, tmp_path: Path) -> None:
    _, sandbox_files = files
    with pytest.raises(IsADirectoryError):
        sandbox_files.read_to("a.bin", tmp_path)


@pytest.mark.parametrize("timeout", [0, -1, float("nan")])
def test_a_timeout_must_be_positive(files: Any, timeout: float) -> None:
    """As `requests` refuses 0: a clear ValueError before anything is sent, not a socket error."""
    _, sandbox_files = files
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        sandbox_files.read("a.bin", timeout=timeout)


def test_a_destination_in_a_missing_directory_is_named_as_given(files: Any, tmp_path: Path) -> None:
    _, sandbox_files = files
    target = tmp_path / "no-such-dir" / "out.bin"
    with pytest.raises(FileNotFoundError) as info:
        sandbox_files.read_to("remote.bin", str(target))
    assert info.value.filename == str(target)  # not the partial file's `.out.bin.<random>.part`
    assert ".part" not in str(info.value)
