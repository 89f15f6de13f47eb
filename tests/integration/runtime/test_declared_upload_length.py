"""An upload whose declared Content-Length is over `--max-upload-bytes` is answered 413 before a byte of its
body is read: no `100 Continue`, nothing written (docs/runtime.md); a legacy JSON body over
`--max-json-body-bytes` likewise.

Until December 7 the limit was enforced only as the file was written: such an upload got its `100 Continue`,
and up to the limit (1 GiB by default) went to a temporary file in the sandbox before the 413.
"""

from __future__ import annotations

import asyncio
import gzip
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from agent_sandbox.runtime import RuntimeServer
from agent_sandbox.runtime._http import MULTIPART_FRAMING
from tests.integration.runtime.conftest import MakeRuntime, url

pytestmark = pytest.mark.integration

_LIMIT = 1000
# A body that stops arriving is a 408 after this: the old code's answer to the held body below, soon.
_IDLE = 2.0
_BOUNDARY = "b0undary"


async def _answer(port: int, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """Send `head` and `body` and hold the connection open (the rest of the declared body never comes):
    the first answer's status, headers and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        status_line, *lines = raw.decode("latin-1").rstrip("\r\n").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        content = await reader.readexactly(int(headers.get("content-length", "0")))
    finally:
        writer.close()
    return int(status_line.split()[1]), headers, content


def _head(method: str, path: str, length: int, expect: bool, content_type: str) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: x",
        f"Content-Length: {length}",
        f"Content-Type: {content_type}",
    ]
    if expect:
        lines.append("Expect: 100-continue")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _leftovers(server: RuntimeServer) -> list[str]:
    return sorted(os.listdir(server.root))


@pytest.mark.parametrize("expect", [True, False], ids=["expect-100-continue", "no-expect"])
async def test_rest_put_declared_over_the_limit(make_runtime: MakeRuntime, expect: bool) -> None:
    server = await make_runtime(max_upload_bytes=_LIMIT, http_idle_timeout=_IDLE)
    head = _head("PUT", "/v1/files/big.bin", _LIMIT + 1, expect, "application/octet-stream")
    # Without Expect the client sends at once: up to the limit arrives, the last byte never does.
    status, headers, body = await _answer(server.ports["rest"], head, b"" if expect else b"x" * _LIMIT)
    assert (status, orjson.loads(body)) == (
        413,
        {
            "code": "RESOURCE_EXHAUSTED",
            "message": f"request body of {_LIMIT + 1} bytes exceeds the upload limit of {_LIMIT} bytes",
        },
    )
    assert headers["connection"] == "close"
    assert _leftovers(server) == []


@pytest.mark.parametrize("expect", [True, False], ids=["expect-100-continue", "no-expect"])
async def test_legacy_upload_declared_over_the_limit(make_runtime: MakeRuntime, expect: bool) -> None:
    server = await make_runtime(max_upload_bytes=_LIMIT, http_idle_timeout=_IDLE)
    declared = _LIMIT + MULTIPART_FRAMING + 1
    head = _head("POST", "/upload", declared, expect, f"multipart/form-data; boundary={_BOUNDARY}")
    part = (
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    status, headers, body = await _answer(
        server.ports["legacy"], head, b"" if expect else part + b"x" * _LIMIT
    )
    assert status == 413
    assert orjson.loads(body) == {
        "message": f"File upload failed: request body of {declared} bytes exceeds the upload limit of {_LIMIT} bytes"
    }
    assert headers["connection"] == "close"
    assert _leftovers(server) == []


async def test_uploads_the_declared_length_does_not_refuse(make_runtime: MakeRuntime) -> None:
    """A length over the limit that is not the file's own is judged as the file is written, as before: a
    multipart body's framing, a gzip body (random bytes gzipped are longer than they are), a chunked body."""
    server = await make_runtime(max_upload_bytes=_LIMIT)
    data = os.urandom(_LIMIT)
    async with aiohttp.ClientSession() as http:
        async with http.put(url(server, "rest", "/v1/files/exact.bin"), data=data) as resp:
            assert resp.status == 204
        form = aiohttp.FormData(quote_fields=False)
        form.add_field("file", data, filename="form.bin", content_type="application/octet-stream")
        async with http.post(url(server, "legacy", "/upload"), data=form) as resp:
            assert resp.status == 200, await resp.text()
        packed = gzip.compress(data)
        assert len(packed) > _LIMIT
        headers = {"Content-Encoding": "gzip", "Expect": "100-continue"}
        async with http.put(url(server, "rest", "/v1/files/gz.bin"), data=packed, headers=headers) as resp:
            assert resp.status == 204

        async def chunks() -> AsyncIterator[bytes]:  # no length: sent chunked
            yield data
            yield b"x"

        async with http.put(url(server, "rest", "/v1/files/chunked.bin"), data=chunks()) as resp:
            assert resp.status == 413
    for name in ("exact.bin", "form.bin", "gz.bin"):
        assert Path(server.root, name).read_bytes() == data, name
    assert _leftovers(server) == ["exact.bin", "form.bin", "gz.bin"]


@pytest.mark.parametrize("path", ["/execute", "/execute/stream"])
@pytest.mark.parametrize("expect", [True, False], ids=["expect-100-continue", "no-expect"])
async def test_legacy_json_body_declared_over_the_limit(
    make_runtime: MakeRuntime, path: str, expect: bool
) -> None:
    """The legacy JSON routes refuse a body declared over --max-json-body-bytes as the uploads do theirs:
    413 at once, no `100 Continue`, nothing read. Until December 7 they answered `100 Continue` and read up to
    the limit before the 413 (the held connection below then gave a 408 after the idle timeout)."""
    server = await make_runtime(max_json_body_bytes=_LIMIT, http_idle_timeout=_IDLE)
    # A multipart type gets no framing allowance here: the JSON limit counts every byte of the body.
    head = _head("POST", path, _LIMIT + 1, expect, f"multipart/form-data; boundary={_BOUNDARY}")
    status, headers, body = await _answer(server.ports["legacy"], head, b"" if expect else b" " * _LIMIT)
    assert (status, orjson.loads(body)) == (
        413,
        {"message": f"request body of {_LIMIT + 1} bytes exceeds the limit of {_LIMIT} bytes"},
    )
    assert headers["connection"] == "close"


async def test_legacy_json_bodies_the_declared_length_does_not_refuse(make_runtime: MakeRuntime) -> None:
    """A body declared at the limit runs; a chunked body over it is still read up to the limit and refused
    (aiohttp's client_max_size); a gzip body is judged as it decodes."""
    server = await make_runtime(max_json_body_bytes=_LIMIT)
    command = orjson.dumps({"command": "true"})
    at_limit = command[:-1] + b" " * (_LIMIT - len(command)) + b"}"
    assert len(at_limit) == _LIMIT
    headers = {"Expect": "100-continue"}
    async with aiohttp.ClientSession() as http:
        async with http.post(url(server, "legacy", "/execute"), data=at_limit, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["exit_code"] == 0

        async def chunks() -> AsyncIterator[bytes]:  # no length: sent chunked
            yield at_limit
            yield b" "

        async with http.post(url(server, "legacy", "/execute"), data=chunks(), headers=headers) as resp:
            assert resp.status == 413
            assert "message" in await resp.json()
        # Declared over the limit on the wire (gzip's stored blocks add their framing), decoded at it: read.
        packed = gzip.compress(at_limit, compresslevel=0)
        assert len(packed) > _LIMIT
        gz = {**headers, "Content-Encoding": "gzip"}
        async with http.post(url(server, "legacy", "/execute"), data=packed, headers=gz) as resp:
            assert resp.status == 200, await resp.text()
