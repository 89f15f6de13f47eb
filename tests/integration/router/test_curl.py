"""curl, a client nobody here wrote, through the router, sending bodies the ways it does by default: a plain
POST, `Expect: 100-continue` for a large one, a streamed (chunked) upload from stdin, a PUT of a file - each
also with `--http2`, which on an http:// URL offers `Upgrade: h2c` on every request, bodies included."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent_sandbox.router import Router

from .conftest import Backend

pytestmark = pytest.mark.integration


async def _curl(*args: str, stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
    curl = shutil.which("curl")
    assert curl, "curl is not installed (Debian: apt-get install curl)"
    proc = await asyncio.create_subprocess_exec(
        curl,
        "-sS",
        "--max-time",
        "30",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return proc.returncode, out, err


@pytest.mark.parametrize("http2", [False, True], ids=["http1.1", "http2-upgrade-offer"])
async def test_curl_sends_its_bodies_through_the_router(
    router: Router, backend: Backend, tmp_path: Path, http2: bool
) -> None:
    big = os.urandom(3_000_000)
    (tmp_path / "big").write_bytes(big)
    url = f"http://127.0.0.1:{router.http_port}"
    headers = [arg for name, value in backend.headers().items() for arg in ("-H", f"{name}: {value}")]
    flags = ["--http2", *headers] if http2 else headers
    cases: list[tuple[list[str], bytes | None, bytes]] = [
        (["-d", "small=1", f"{url}/post"], None, b"small=1"),
        (["--data-binary", f"@{tmp_path / 'big'}", f"{url}/expect"], None, big),  # Expect: 100-continue
        (["-T", "-", f"{url}/stdin"], big[:200_000], big[:200_000]),  # chunked
        (["-T", str(tmp_path / "big"), f"{url}/put"], None, big),
    ]
    for args, stdin, sent in cases:
        code, out, err = await _curl(*flags, *args, stdin=stdin)
        assert code == 0, f"curl {' '.join(args)}: exit {code}: {err.decode(errors='replace')}"
        seen = json.loads(out)
        assert seen["body_len"] == len(sent), args
        assert seen["body_sha"] == hashlib.sha256(sent).hexdigest(), args


async def test_a_refused_http2_head_request_is_an_answer_curl_reads(
    start_router: Callable[..., Awaitable[Router]],
) -> None:
    """h2c (`--enable-h2c`), the router's own refusal of a HEAD request: headers only (RFC 9113 §8.1.1). Until
    December 6 it carried the JSON body, and curl failed with "Error in the HTTP2 framing layer"."""
    router = await start_router("--enable-h2c")
    url = f"http://127.0.0.1:{router.http_port}/x"
    code, out, err = await _curl("--http2-prior-knowledge", "-I", "-H", "X-Sandbox-ID: BAD", url)
    assert code == 0, err.decode(errors="replace")
    assert out.split(b"\r\n", 1)[0].strip() == b"HTTP/2 400"
    code, out, err = await _curl("--http2-prior-knowledge", "-H", "X-Sandbox-ID: BAD", url)
    assert (code, json.loads(out)) == (0, {"detail": "Invalid sandbox ID format."})
