"""Legacy `/upload` and `/files` on a real server: what an overwrite keeps, what a body that is no multipart
form gets, and what deleting a symlink removes (spec §2.1; docs/runtime.md)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import aiohttp
import orjson
import pytest

from agent_sandbox.runtime import RuntimeServer
from tests.integration.runtime.conftest import url

pytestmark = pytest.mark.integration

_MISSING_FILE = {
    "detail": [{"type": "missing", "loc": ["body", "file"], "msg": "Field required", "input": None}]
}


async def _upload(
    http: aiohttp.ClientSession, server: RuntimeServer, filename: str, data: bytes, query: str = ""
) -> tuple[int, object]:
    form = aiohttp.FormData(quote_fields=False)  # as requests/urllib3 send it (the upstream SDK)
    form.add_field("file", data, filename=filename, content_type="application/octet-stream")
    async with http.post(url(server, "legacy", "/upload" + query), data=form) as resp:
        return resp.status, await resp.json()


def _mode(server: RuntimeServer, name: str) -> int:
    return stat.S_IMODE(Path(server.root, name).stat().st_mode)


async def test_an_upload_over_a_file_keeps_its_mode(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    """Upstream's runtime writes in place (`open(path, "wb")`), so a script made executable stays so when it is
    written again; here the write stays atomic and the new file takes the old one's permission bits (until
    December 6 it came out 0644: `./run.sh` was `Permission denied` after the second write)."""
    assert (await _upload(http, runtime, "run.sh", b"#!/bin/sh\necho one\n"))[0] == 200
    assert _mode(runtime, "run.sh") == 0o644  # a new file: 0644, as before
    os.chmod(Path(runtime.root, "run.sh"), 0o755)
    assert (await _upload(http, runtime, "run.sh", b"#!/bin/sh\necho two\n"))[0] == 200
    assert _mode(runtime, "run.sh") == 0o755
    async with http.post(
        url(runtime, "legacy", "/execute"), data=orjson.dumps({"command": "./run.sh"})
    ) as resp:
        body = await resp.json()
    assert (body["exit_code"], body["stdout"]) == (0, "two\n"), body
    # A mode the request names still wins over the old file's.
    assert (await _upload(http, runtime, "run.sh", b"x", "?mode=0600"))[0] == 200
    assert _mode(runtime, "run.sh") == 0o600
    # Special bits are not carried over: a mode is 0NNN, as `?mode=` takes it.
    os.chmod(Path(runtime.root, "run.sh"), 0o2750)
    assert (await _upload(http, runtime, "run.sh", b"y"))[0] == 200
    assert stat.S_IMODE(Path(runtime.root, "run.sh").stat().st_mode) == 0o750


async def test_sandboxd_put_writes_0644_over_a_file(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    """sandboxd's PUT is upstream's atomic write with its own mode (0644 unless `?mode=`): unchanged."""
    Path(runtime.root, "run.sh").write_bytes(b"old")
    os.chmod(Path(runtime.root, "run.sh"), 0o755)
    async with http.put(url(runtime, "rest", "/v1/files/run.sh"), data=b"new") as resp:
        assert resp.status == 204
    assert _mode(runtime, "run.sh") == 0o644


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/octet-stream",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/mixed; boundary=zz",
    ],
)
async def test_an_upload_that_is_no_multipart_form_is_422(
    runtime: RuntimeServer, http: aiohttp.ClientSession, content_type: str | None
) -> None:
    """Upstream's FastAPI parses only a `multipart/form-data` body for files: any other body has no `file`
    part, the 422 an absent part gets (until December 6: 400 `invalid multipart body: 'Content-Type'`, a
    KeyError's repr, without a Content-Type)."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    skip = () if content_type is not None else ("Content-Type",)
    async with http.post(
        url(runtime, "legacy", "/upload"), data=b"garbage", headers=headers, skip_auto_headers=skip
    ) as resp:
        assert (resp.status, await resp.json()) == (422, _MISSING_FILE)
    assert os.listdir(runtime.root) == []


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data", b"garbage"),  # no boundary
        ("multipart/form-data; boundary=zz", b"garbage"),
        ("multipart/form-data; boundary=zz", b"--zz\r\nno-colon-header\r\n\r\nx\r\n--zz--\r\n"),
        # ends before the part's closing boundary
        (
            "multipart/form-data; boundary=zz",
            b'--zz\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\nxx',
        ),
    ],
)
async def test_a_malformed_multipart_upload_is_400_in_words(
    runtime: RuntimeServer, http: aiohttp.ClientSession, content_type: str, body: bytes
) -> None:
    """A body that says it is a multipart form and is not one stays a 400 (FastAPI: `There was an error
    parsing the body`), its message a sentence, never an exception's repr."""
    async with http.post(
        url(runtime, "legacy", "/upload"), data=body, headers={"Content-Type": content_type}
    ) as resp:
        status, answer = resp.status, await resp.json()
    assert status in (400, 422), answer
    if status == 400:
        message = answer["message"]
        assert message.startswith("invalid multipart body"), message
        # One line, no exception repr (a header error was `400, message:\n  Invalid HTTP header: ...`).
        for leak in ("Error(", "\n", "400, message"):
            assert leak not in message, message
        assert not message.endswith(("''", ": ")), message
        assert message.count("invalid multipart body") == 1, message


async def test_deleting_a_symlink_removes_the_link_not_its_target(
    runtime: RuntimeServer, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """`DELETE /files/{link}` removes the link itself, as `rm` does: the tree a link to a directory points at
    survives `recursive=true`, and a link pointing outside the root can be removed (until December 6 the
    target was deleted - the whole tree with `recursive`, leaving a dangling link - and an outside link was
    `403`). A link among the parents is still followed, and confined."""
    root = Path(runtime.root)
    (root / "d").mkdir()
    (root / "d" / "keep.txt").write_text("k")
    (root / "f.txt").write_text("f")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    os.symlink("d", root / "dir-link")
    os.symlink("f.txt", root / "file-link")
    os.symlink(str(outside), root / "out-link")
    os.symlink("missing", root / "dangling")
    os.symlink("d", root / "via")

    async def delete(path: str) -> tuple[int, object]:
        async with http.delete(url(runtime, "legacy", "/files/" + path)) as resp:
            return resp.status, await resp.json()

    assert await delete("dir-link?recursive=true") == (200, {"message": "'dir-link' deleted."})
    assert not (root / "dir-link").is_symlink()
    assert (root / "d" / "keep.txt").read_text() == "k"
    assert (await delete("file-link"))[0] == 200
    assert not (root / "file-link").is_symlink()
    assert (root / "f.txt").read_text() == "f"
    assert (await delete("out-link?recursive=true"))[0] == 200
    assert not (root / "out-link").is_symlink()
    assert (outside / "secret").read_text() == "s"
    assert (await delete("dangling"))[0] == 200
    assert not (root / "dangling").is_symlink()
    # A link as a parent: followed (inside the root), the file below it removed.
    assert (await delete("via%2Fkeep.txt"))[0] == 200
    assert not (root / "d" / "keep.txt").exists()
    assert (root / "via").is_symlink()
    # ...and confined: a parent link that leads out is refused, nothing outside touched.
    os.symlink(str(outside), root / "out-again")
    assert await delete("out-again%2Fsecret") == (403, {"message": "Access denied"})
    assert (outside / "secret").exists()
    assert (await delete("gone"))[0] == 404
    assert (await delete("a%00b"))[0] == 400
    # `link/` names the link too (the path is normalised, as every route's): never the tree behind it.
    os.symlink("d", root / "slash-link")
    (root / "d" / "again.txt").write_text("a")
    assert (await delete("slash-link/?recursive=true"))[0] == 200
    assert not (root / "slash-link").is_symlink()
    assert (root / "d" / "again.txt").exists()
    (root / "d" / "again.txt").unlink()
    assert sorted(os.listdir(root)) == ["d", "f.txt", "out-again", "via"]


@pytest.mark.parametrize(
    "path",
    [
        "..%2Fname",  # the link's name below the root, spelled through its parent
        "%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
        "sub%2F..%2F..%2Fname",
        "%2F..%2Fname",  # absolute: taken relative to the root, `..` still leaves it
    ],
)
async def test_deleting_a_path_that_leaves_the_root_is_403_even_where_a_symlink_is_named(
    runtime: RuntimeServer, http: aiohttp.ClientSession, path: str
) -> None:
    """A `..` that climbs above the root is `403 Access denied` as on every route (upstream's answer to an
    escape), before any symlink is looked at: normalised against `/` instead of the root, `../name` named
    `<root>/name` (that link was removed, 200) and `../../etc/passwd` a missing `<root>/etc` (404)."""
    root = Path(runtime.root)
    (root / "sub").mkdir()
    os.symlink("sub", root / "name")
    async with http.delete(url(runtime, "legacy", "/files/" + path)) as resp:
        assert (resp.status, await resp.json()) == (403, {"message": "Access denied"})
    assert (root / "name").is_symlink()
