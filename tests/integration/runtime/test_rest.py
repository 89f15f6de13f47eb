"""sandboxd's REST API on a real server (spec §2.2.1)."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import aiohttp
import pytest
import yarl

from agent_sandbox.runtime import RuntimeServer
from tests.integration.runtime.conftest import MakeRuntime, url
from tests.integration.runtime.helpers import make_special_files

pytestmark = pytest.mark.integration


def files_url(server: RuntimeServer, path: str, query: str = "") -> yarl.URL:
    return yarl.URL(url(server, "rest", "/v1/files/" + path) + query, encoded=True)


async def test_put_get_head_delete(runtime: RuntimeServer, http: aiohttp.ClientSession) -> None:
    async with http.put(files_url(runtime, "a%2Fb%2Fc.txt", "?mode=0600"), data=b"hello world") as resp:
        assert resp.status == 204
        assert await resp.read() == b""
    target = Path(runtime.root, "a/b/c.txt")
    assert target.read_bytes() == b"hello world"
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert oct(target.parent.stat().st_mode & 0o777) == "0o755"
    async with http.get(files_url(runtime, "a/b/c.txt")) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/octet-stream"
        assert "Last-Modified" in resp.headers
        assert await resp.read() == b"hello world"
        last_modified = resp.headers["Last-Modified"]
    async with http.get(files_url(runtime, "a/b/c.txt"), headers={"Range": "bytes=6-"}) as resp:
        assert (resp.status, await resp.read()) == (206, b"world")
    async with http.get(
        files_url(runtime, "a/b/c.txt"), headers={"If-Modified-Since": last_modified}
    ) as resp:
        assert resp.status == 304
    async with http.head(files_url(runtime, "a%2Fb%2Fc.txt")) as resp:
        assert resp.status == 200
    async with http.head(files_url(runtime, "a%2Fb")) as resp:
        assert resp.status == 200
    async with http.head(files_url(runtime, "nope")) as resp:
        assert resp.status == 404
    async with http.delete(files_url(runtime, "a")) as resp:
        assert (resp.status, (await resp.json())["code"]) == (409, "CONFLICT")
    async with http.delete(files_url(runtime, "a", "?recursive=maybe")) as resp:
        assert (resp.status, (await resp.json())["code"]) == (400, "INVALID_ARGUMENT")
    async with http.delete(files_url(runtime, "a", "?recursive=true")) as resp:
        assert resp.status == 204
    async with http.delete(files_url(runtime, "a")) as resp:
        assert (resp.status, await resp.json()) == (
            404,
            {"code": "NOT_FOUND", "message": "path does not exist within the sandbox"},
        )


async def test_put_multipart_and_overwrite(runtime: RuntimeServer, http: aiohttp.ClientSession) -> None:
    form = aiohttp.FormData()
    form.add_field("other", "ignored")
    form.add_field("file", b"from multipart", filename="whatever")
    async with http.put(files_url(runtime, "m.txt"), data=form) as resp:
        assert resp.status == 204
    assert Path(runtime.root, "m.txt").read_bytes() == b"from multipart"
    async with http.put(files_url(runtime, "m.txt"), data=b"raw") as resp:
        assert resp.status == 204
    assert Path(runtime.root, "m.txt").read_bytes() == b"raw"
    form = aiohttp.FormData(default_to_multipart=True)
    form.add_field("nofile", "x")
    async with http.put(files_url(runtime, "n.txt"), data=form) as resp:
        assert resp.status == 400
        assert "file" in (await resp.json())["message"]


@pytest.mark.parametrize("mode", ["644", "0999", "00644", "abc", ""])
async def test_put_invalid_mode(runtime: RuntimeServer, http: aiohttp.ClientSession, mode: str) -> None:
    async with http.put(files_url(runtime, "x", f"?mode={mode}"), data=b"x") as resp:
        assert resp.status == 400
        assert (await resp.json())["code"] == "INVALID_ARGUMENT"


async def test_put_onto_a_directory_and_too_large(
    make_runtime: MakeRuntime, http: aiohttp.ClientSession
) -> None:
    server = await make_runtime(max_upload_bytes=10)
    Path(server.root, "d").mkdir()
    async with http.put(files_url(server, "d"), data=b"x") as resp:
        assert (resp.status, await resp.json()) == (
            400,
            {"code": "INVALID_ARGUMENT", "message": "target path is a directory"},
        )
    async with http.put(files_url(server, "big"), data=b"x" * 11) as resp:
        assert resp.status == 413
    assert sorted(os.listdir(server.root)) == ["d"]


async def test_directory_listing(runtime: RuntimeServer, http: aiohttp.ClientSession) -> None:
    root = Path(runtime.root)
    (root / "b.txt").write_bytes(b"12345")
    (root / "a-dir").mkdir()
    (root / "b.txt").chmod(0o640)
    os.symlink("b.txt", root / "c-link")
    os.symlink("/etc", root / "d-escaping")
    os.symlink("missing", root / "e-dangling")
    async with http.get(files_url(runtime, "")) as resp:
        body = await resp.json()
    assert body["path"] == "/"
    assert [(e["name"], e["type"], e["size"], e["mode"]) for e in body["entries"]] == [
        ("a-dir", "directory", (root / "a-dir").stat().st_size, "0755"),
        ("b.txt", "file", 5, "0640"),
        ("c-link", "file", 5, "0640"),
    ]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", e["modified_at"]) for e in body["entries"])
    async with http.get(files_url(runtime, "a-dir")) as resp:
        assert await resp.json() == {"path": "/a-dir", "entries": []}


async def test_root_prefix_and_escapes(runtime: RuntimeServer, http: aiohttp.ClientSession) -> None:
    Path(runtime.root, "f").write_text("x")
    # a path spelled with the configured root ("/workspace/f") means the same file
    spelled = runtime.state.configured_root.replace("/", "%2F") + "%2Ff"
    async with http.get(files_url(runtime, spelled)) as resp:
        assert (resp.status, await resp.read()) == (200, b"x")
    os.symlink("/etc", Path(runtime.root, "link"))
    for path in ("%2E%2E%2F%2E%2E%2Fetc%2Fpasswd", "%2E%2E/x", "link/passwd", "link"):
        async with http.get(files_url(runtime, path)) as resp:
            assert (resp.status, await resp.json()) == (
                403,
                {"code": "PERMISSION_DENIED", "message": "path traversal outside sandbox root is forbidden"},
            ), path
        async with http.put(files_url(runtime, path + "-new"), data=b"x") as resp:
            assert resp.status in (204, 403), path
    assert not Path("/etc/passwd-new").exists()
    async with http.get(files_url(runtime, "bad%ff")) as resp:
        assert resp.status == 400


async def test_delete_the_root(runtime: RuntimeServer, http: aiohttp.ClientSession) -> None:
    Path(runtime.root, "x").mkdir()
    Path(runtime.root, "x", "y").write_text("y")
    async with http.delete(files_url(runtime, "")) as resp:
        assert resp.status == 409
    async with http.delete(files_url(runtime, "", "?recursive=true")) as resp:
        assert resp.status == 204
    assert Path(runtime.root).is_dir()
    assert os.listdir(runtime.root) == []


async def test_health_and_metadata(make_runtime: MakeRuntime, http: aiohttp.ClientSession) -> None:
    env = {
        "SANDBOX_NAME": "s1",
        "SANDBOX_API_TOKEN": "x",
        "SANDBOX_db_password": "x",
        "SANDBOX_SSH_KEY": "x",
        "OTHER": "y",
    }
    server = await make_runtime(command_env=env)
    async with http.get(url(server, "rest", "/v1/health")) as resp:
        body = await resp.json()
    assert resp.status == 200
    assert body["status"] == "ok"
    assert isinstance(body["uptime_seconds"], int)
    async with http.get(url(server, "rest", "/v1/metadata")) as resp:
        assert await resp.json() == {"env": {"SANDBOX_NAME": "s1"}}
    server.state.draining = True
    async with http.get(url(server, "rest", "/v1/health")) as resp:
        assert (resp.status, await resp.json()) == (
            503,
            {"code": "UNAVAILABLE", "message": "sandboxd is shutting down"},
        )


async def test_unknown_routes(runtime: RuntimeServer, http: aiohttp.ClientSession) -> None:
    async with http.get(url(runtime, "rest", "/v2/nothing")) as resp:
        assert (resp.status, (await resp.json())["code"]) == (404, "NOT_FOUND")
    async with http.post(url(runtime, "rest", "/v1/files/x")) as resp:
        assert (resp.status, (await resp.json())["code"]) == (405, "METHOD_NOT_ALLOWED")


@pytest.mark.parametrize("protocol", ["legacy", "rest"])
async def test_a_name_that_is_not_utf8_does_not_hide_the_directory(
    runtime: RuntimeServer, http: aiohttp.ClientSession, protocol: str
) -> None:
    """A program may name a file with any bytes (`printf 'bad\\377'`); JSON carries text. The listing was a
    500 for the whole directory, so nothing in it could be listed, checked or copied with `cp -r`. Now the
    name is listed as sandboxd (Go's encoding/json) lists it: invalid bytes as U+FFFD."""
    root = Path(runtime.root)
    (root / "d").mkdir()
    fd = os.open(os.path.join(os.fsencode(root / "d"), b"bad\xffname"), os.O_CREAT | os.O_WRONLY, 0o644)
    os.close(fd)
    (root / "d" / "ok.txt").write_bytes(b"fine")
    where = files_url(runtime, "d") if protocol == "rest" else url(runtime, "legacy", "/list/d")
    async with http.get(where) as resp:
        assert resp.status == 200, await resp.text()
        body = await resp.json()
    entries = body["entries"] if protocol == "rest" else body
    assert sorted(e["name"] for e in entries) == ["bad\ufffdname", "ok.txt"]


def _parts(content_type: str, body: bytes) -> list[tuple[str, bytes]]:
    """A multipart/byteranges body read by the standard library's MIME parser: (Content-Range, bytes)."""
    from email import message_from_bytes

    message = message_from_bytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    assert message.is_multipart()
    parts = []
    for part in message.get_payload():
        assert part.get_content_type() == "application/octet-stream"
        parts.append((part["Content-Range"], part.get_payload(decode=True)))
    return parts


@pytest.mark.parametrize("protocol", ["rest", "legacy"])
async def test_several_ranges_are_one_multipart_answer(
    runtime: RuntimeServer, http: aiohttp.ClientSession, protocol: str
) -> None:
    """As sandboxd's Go server (http.ServeContent). aiohttp's FileResponse answered 416 to any request with two
    ranges - wrong (RFC 9110: 416 says no range overlaps the file) - until December 5."""
    data = os.urandom(1000)
    Path(runtime.root, "r.bin").write_bytes(data)
    target = files_url(runtime, "r.bin") if protocol == "rest" else url(runtime, "legacy", "/download/r.bin")

    async def get(range_header: str, **extra: str) -> tuple[int, aiohttp.typedefs.LooseHeaders, bytes]:
        async with http.get(target, headers={"Range": range_header, **extra}) as resp:
            return resp.status, resp.headers, await resp.read()

    status, headers, body = await get("bytes=0-9, 500-509,-5")
    assert status == 206
    assert int(headers["Content-Length"]) == len(body)
    assert _parts(headers["Content-Type"], body) == [
        ("bytes 0-9/1000", data[:10]),
        ("bytes 500-509/1000", data[500:510]),
        ("bytes 995-999/1000", data[995:]),
    ]
    if protocol == "legacy":
        assert headers["Content-Disposition"].startswith("attachment")
    # Only one of them overlaps the file: that one, as a plain 206 (Go drops the others too).
    status, headers, body = await get("bytes=0-9,5000-6000")
    assert (status, headers["Content-Range"], body) == (206, "bytes 0-9/1000", data[:10])
    # More than the file in all (Go's guard against piles of overlapping ranges): the whole file.
    assert (await get("bytes=0-999,0-999"))[::2] == (200, data)
    # None overlaps, or a malformed one: 416, as before.
    assert (await get("bytes=5000-,6000-"))[0] == 416
    assert (await get("bytes=0-9,x"))[0] == 416
    # Preconditions keep their meaning: a matching If-None-Match is still a 304.
    etag = headers["ETag"]
    assert (await get("bytes=0-9,20-29", **{"If-None-Match": etag}))[0] == 304
    async with http.head(target, headers={"Range": "bytes=0-9,20-29"}) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Type"].startswith("multipart/byteranges; boundary=")
        assert await resp.read() == b""


@pytest.mark.parametrize("protocol", ["rest", "legacy"])
async def test_if_range_with_a_stale_entity_tag_sends_the_whole_new_file(
    runtime: RuntimeServer, http: aiohttp.ClientSession, protocol: str
) -> None:
    """RFC 9110 §13.1.5. aiohttp's FileResponse reads only the date form of If-Range: with an entity tag it
    served the range anyway, so a download resumed after the file was replaced got the new file's tail after
    the old file's head - a file that never existed (until December 6)."""
    path = Path(runtime.root, "resume.txt")
    target = (
        files_url(runtime, "resume.txt")
        if protocol == "rest"
        else url(runtime, "legacy", "/download/resume.txt")
    )
    path.write_bytes(b"A" * 20)
    async with http.get(target) as resp:
        old_etag = resp.headers["ETag"]
    path.write_bytes(b"B" * 25)
    async with http.get(target) as resp:
        new_etag = resp.headers["ETag"]
    assert new_etag != old_etag

    async def resume(if_range: str) -> tuple[int, bytes]:
        async with http.get(target, headers={"Range": "bytes=20-", "If-Range": if_range}) as resp:
            return resp.status, await resp.read()

    assert await resume(old_etag) == (200, b"B" * 25)  # the validator is stale: the whole new file
    assert await resume("W/" + new_etag) == (200, b"B" * 25)  # a weak tag never matches
    assert await resume(new_etag) == (206, b"B" * 5)  # still the same file: the rest of it
    assert (await resume("Thu, 01 Jan 1970 00:00:00 GMT"))[0] == 200  # the date form: aiohttp's, as before


async def test_a_symlink_loop_and_a_name_too_long_are_not_server_errors(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    """The legacy protocol answers 404 where upstream's `os.path.isfile`/`isdir` say False; sandboxd refuses a
    name too long as the client's error; no answer names the host's path. Until December 6: 500s, whose text
    gave away the host's volume directory."""
    os.symlink("loop2", Path(runtime.root, "loop1"))
    os.symlink("loop1", Path(runtime.root, "loop2"))
    long = "a" * 300
    for path, want in (
        ("/download/loop1", 404),
        ("/download/" + long, 404),
        ("/list/loop1", 404),
        ("/list/" + long, 404),
    ):
        async with http.get(url(runtime, "legacy", path)) as resp:
            assert resp.status == want, (path, await resp.text())
    async with http.delete(url(runtime, "legacy", "/files/loop1%2Fx")) as resp:
        assert resp.status == 404, await resp.text()
    async with http.get(files_url(runtime, long)) as resp:
        assert (resp.status, (await resp.json())["message"]) == (400, "file name too long")
    # Past the path limit nothing is created (the parents were, down to the level the kernel refused).
    async with http.put(files_url(runtime, ("d" * 200 + "/") * 25 + "f"), data=b"x") as resp:
        assert (resp.status, (await resp.json())["message"]) == (400, "file name too long")
    assert sorted(os.listdir(runtime.root)) == ["loop1", "loop2"]
    # A loop is the sandbox's state, not the server's fault: a 400 naming it (a 500 until December 6).
    for path in ("loop1", "loop1%2Fx", "loop1/x/y"):
        async with http.get(files_url(runtime, path)) as resp:
            body = await resp.json()
            assert (resp.status, body) == (
                400,
                {"code": "INVALID_ARGUMENT", "message": "too many levels of symbolic links"},
            ), path
        async with http.head(files_url(runtime, path)) as resp:
            assert resp.status == 400, path
    async with http.delete(files_url(runtime, "loop1%2Fx")) as resp:
        assert (resp.status, (await resp.json())["code"]) == (400, "INVALID_ARGUMENT")


@pytest.mark.parametrize("protocol", ["rest", "legacy"])
async def test_a_multipart_body_cut_short_is_refused_and_the_file_kept(
    runtime: RuntimeServer, http: aiohttp.ClientSession, protocol: str
) -> None:
    """A body that ends before the part's closing boundary (a client or proxy that gave up half-way) is not a
    file. Until December 6 what had arrived replaced the file, and the upload was reported a success."""
    Path(runtime.root, "kept.txt").write_bytes(b"the whole old file")
    body = (
        b'--XyZbound\r\nContent-Disposition: form-data; name="file"; filename="kept.txt"\r\n\r\n'
        b"first half of the fi"
    )
    target = files_url(runtime, "kept.txt") if protocol == "rest" else url(runtime, "legacy", "/upload")
    send = http.put if protocol == "rest" else http.post
    headers = {"Content-Type": "multipart/form-data; boundary=XyZbound"}
    async with send(target, data=body, headers=headers) as resp:
        assert resp.status == 400, await resp.text()
        assert "closing boundary" in await resp.text()
    assert Path(runtime.root, "kept.txt").read_bytes() == b"the whole old file"
    whole = body + b"\r\n--XyZbound--\r\n"
    async with send(target, data=whole, headers=headers) as resp:
        assert resp.status in (200, 204), await resp.text()
    assert Path(runtime.root, "kept.txt").read_bytes() == b"first half of the fi"


@pytest.mark.parametrize("name", ["fifo", "sock"])
async def test_a_fifo_or_a_socket_is_not_read(
    runtime: RuntimeServer, http: aiohttp.ClientSession, name: str
) -> None:
    """403 `not a regular file`: a FIFO would block the reader, a socket cannot be opened (ENXIO, which was a
    500 `No such device or address` until December 6)."""
    make_special_files(runtime.root)
    async with http.get(files_url(runtime, name)) as resp:
        assert (resp.status, await resp.json()) == (
            403,
            {
                "code": "PERMISSION_DENIED",
                "message": "not a regular file (a FIFO, socket or device is not read)",
            },
        )
    async with http.head(files_url(runtime, name)) as resp:
        assert resp.status == 403
    async with http.get(files_url(runtime, "")) as resp:  # listed as sandboxd lists them
        assert sorted(e["name"] for e in (await resp.json())["entries"]) == ["fifo", "sock"]


async def test_a_body_that_does_not_decode_is_400(
    runtime: RuntimeServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A 400 naming the encoding, no traceback, nothing written (a 500 with two tracebacks until December 6)."""
    Path(runtime.root, "kept.txt").write_bytes(b"old")
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.put(
            files_url(runtime, "kept.txt"), data=b"not gzip at all", headers={"Content-Encoding": "gzip"}
        ) as resp,
    ):
        body = await resp.json()
        assert (resp.status, body["code"]) == (400, "INVALID_ARGUMENT"), body
        assert "gzip" in body["message"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert os.listdir(runtime.root) == ["kept.txt"]
    assert Path(runtime.root, "kept.txt").read_bytes() == b"old"


async def test_a_name_with_a_newline_is_served(runtime: RuntimeServer, http: aiohttp.ClientSession) -> None:
    """As sandboxd serves any byte but NUL: the routes' `.*` stopped at a LF, so such a file (which any program
    may create) was a route miss - 404 `Not Found` - on every method (until December 6)."""
    async with http.put(files_url(runtime, "d%0Ae/nl%0Aname.txt"), data=b"x") as resp:
        assert resp.status == 204, await resp.text()
    assert Path(runtime.root, "d\ne", "nl\nname.txt").read_bytes() == b"x"
    async with http.get(files_url(runtime, "d%0Ae/nl%0Aname.txt")) as resp:
        assert (resp.status, await resp.read()) == (200, b"x")
    async with http.get(files_url(runtime, "d%0Ae")) as resp:
        assert (await resp.json())["entries"][0]["name"] == "nl\nname.txt"
    async with http.delete(files_url(runtime, "d%0Ae", "?recursive=true")) as resp:
        assert resp.status == 204, await resp.text()
    assert os.listdir(runtime.root) == []
