"""Requests aiohttp cannot parse get the listener's JSON error shape (non-negotiable: 4xx JSON, never a crash).

aiohttp answers what its parser refuses itself, before any middleware runs, in text/plain. An SDK or a proxy
that reads error bodies as JSON then saw `400, message='Bad Request'` with nothing to go on.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from agent_sandbox.runtime import RuntimeServer
from agent_sandbox.runtime.server import MAX_HEAD_LINE

pytestmark = pytest.mark.integration

_CASES = {
    "request line past the limit": b"GET /" + b"a" * (MAX_HEAD_LINE + 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "header field past the limit": b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: "
    + b"b" * (MAX_HEAD_LINE + 10)
    + b"\r\n\r\n",
    "not HTTP at all": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
    "a method with a space": b"G ET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "a Content-Length that is no number": b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n",
    "a header without a colon": b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    "an unknown HTTP version": b"GET / HTTP/7.1\r\nHost: x\r\n\r\n",
    "too many header fields": b"GET / HTTP/1.1\r\n"
    + b"".join(b"X-%d: 1\r\n" % i for i in range(300))
    + b"\r\n",
    "a NUL in a header value": b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "a chunk size that is no number": (
        b"PUT /v1/files/a.txt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
    ),
    "both Content-Length and chunked": (
        b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
}


async def _exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)  # the server closes after a parse error
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize("listener", ["legacy", "rest"])
@pytest.mark.parametrize("case", list(_CASES))
async def test_unparseable_requests_get_a_json_4xx(runtime: RuntimeServer, listener: str, case: str) -> None:
    status, headers, body = await _exchange(runtime.ports[listener], _CASES[case])
    assert 400 <= status < 500, (status, body[:200])
    assert headers.get("content-type", "").startswith("application/json"), (headers, body[:200])
    assert int(headers["content-length"]) == len(body)
    answer = json.loads(body)
    assert isinstance(answer["message"], str), answer
    assert answer["message"], answer
    if listener == "rest":
        assert answer["code"] == "INVALID_ARGUMENT"
    # The runtime still serves the next client.
    status, _, body = await _exchange(runtime.ports[listener], _health(listener))
    assert status == 200, body[:200]


async def test_a_too_long_line_says_so(runtime: RuntimeServer) -> None:
    _, _, body = await _exchange(runtime.ports["legacy"], _CASES["request line past the limit"])
    assert "too long" in json.loads(body)["message"].lower()


def _health(listener: str) -> bytes:
    path = "/" if listener == "legacy" else "/v1/health"
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()


async def test_a_request_followed_by_garbage_in_the_same_read_is_refused_whole(
    runtime: RuntimeServer,
) -> None:
    """A documented limit of aiohttp's parser (docs/runtime.md, Safety): the valid request in front of the
    malformed bytes is not run, and the one answer is the 400 - never a request half done. Go's server runs
    the first request and answers it, then the 400: when aiohttp gets there, this test fails and the doc
    changes."""
    raw = b"PUT /v1/files/pl HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nhelBOGUS\r\n\r\n"
    status, _, body = await _exchange(runtime.ports["rest"], raw)  # read to the close
    assert (status, json.loads(body)["code"]) == (400, "INVALID_ARGUMENT")  # one answer: nothing behind it
    assert os.listdir(runtime.root) == []
