"""A route prefix spelled with percent-escapes (`/%66iles/...`) on a real server: the file routes act on the path
the request names, never on the root (docs/runtime.md).

aiohttp routes on the decoded path while the file routes read the raw one; until December 7 a prefix that
matched only once decoded gave the path "" - the root: `DELETE /%66iles/x?recursive=true` emptied the
sandbox, `/%65xists/nope` was `{"path": "", "exists": true}`, `GET /v1/%66iles/d` listed "/".
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import orjson
import pytest
from yarl import URL

from agent_sandbox.runtime import RuntimeServer

pytestmark = pytest.mark.integration


def _url(server: RuntimeServer, protocol: str, raw_path: str) -> URL:
    """The URL with `raw_path` sent exactly as written (aiohttp would otherwise normalise the escapes)."""
    return URL(f"http://127.0.0.1:{server.ports[protocol]}{raw_path}", encoded=True)


def _populate(root: str) -> None:
    Path(root, "tmp").mkdir()
    Path(root, "tmp", "scratch.txt").write_bytes(b"scratch")
    Path(root, "keep.txt").write_bytes(b"keep")
    Path(root, "d").mkdir()
    Path(root, "d", "inner.txt").write_bytes(b"inner")


def _tree(root: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*"))


# Prefixes that decode to the route's own (aiohttp routes them): lower- and upper-case hex, one escape or many.
_LEGACY_DELETE = ["/%66iles/", "/fi%6ces/", "/fi%6Ces/", "/%66%69%6C%65%73/"]
_REST_DELETE = ["/v1/%66iles/", "/%76%31/files/", "/v1/fi%6ces/", "/%76%31/%66%69%6c%65%73/"]


@pytest.mark.parametrize("prefix", _LEGACY_DELETE)
async def test_legacy_delete_under_an_encoded_prefix_removes_only_the_named_file(
    runtime: RuntimeServer, http: aiohttp.ClientSession, prefix: str
) -> None:
    _populate(runtime.root)
    before = _tree(runtime.root)
    async with http.delete(_url(runtime, "legacy", prefix + "tmp/scratch.txt?recursive=true")) as resp:
        status, body = resp.status, await resp.json()
    assert (status, body) == (200, {"message": "'tmp/scratch.txt' deleted."})
    assert _tree(runtime.root) == [p for p in before if p != "tmp/scratch.txt"]


@pytest.mark.parametrize("prefix", _REST_DELETE)
async def test_sandboxd_delete_under_an_encoded_prefix_removes_only_the_named_file(
    runtime: RuntimeServer, http: aiohttp.ClientSession, prefix: str
) -> None:
    _populate(runtime.root)
    before = _tree(runtime.root)
    async with http.delete(_url(runtime, "rest", prefix + "tmp/scratch.txt?recursive=true")) as resp:
        assert resp.status == 204, await resp.text()
    assert _tree(runtime.root) == [p for p in before if p != "tmp/scratch.txt"]


async def test_legacy_read_routes_under_an_encoded_prefix_name_the_path(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    _populate(runtime.root)
    async with http.get(_url(runtime, "legacy", "/%65xists/nope")) as resp:
        assert (resp.status, await resp.json()) == (200, {"path": "nope", "exists": False})
    async with http.get(_url(runtime, "legacy", "/%65xists/d%2Finner.txt")) as resp:
        assert (resp.status, await resp.json()) == (200, {"path": "d/inner.txt", "exists": True})
    async with http.get(_url(runtime, "legacy", "/%6Cist/d")) as resp:
        listing = await resp.json()
    assert resp.status == 200
    assert [e["name"] for e in listing] == ["inner.txt"]
    async with http.get(_url(runtime, "legacy", "/%64ownload/keep.txt")) as resp:
        assert (resp.status, await resp.read()) == (200, b"keep")
    async with http.get(_url(runtime, "legacy", "/%64ownload/nope")) as resp:
        assert resp.status == 404


async def test_sandboxd_read_routes_under_an_encoded_prefix_name_the_path(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    _populate(runtime.root)
    async with http.get(_url(runtime, "rest", "/v1/%66iles/d")) as resp:
        body = await resp.json()
    assert resp.status == 200
    assert (body["path"], [e["name"] for e in body["entries"]]) == ("/d", ["inner.txt"])
    async with http.get(_url(runtime, "rest", "/v1/%66iles/keep.txt")) as resp:
        assert (resp.status, await resp.read()) == (200, b"keep")
    async with http.head(_url(runtime, "rest", "/v1/%66iles/nope")) as resp:
        assert resp.status == 404
    async with http.put(_url(runtime, "rest", "/v1/%66iles/new.txt"), data=b"new") as resp:
        assert resp.status == 204, await resp.text()
    assert Path(runtime.root, "new.txt").read_bytes() == b"new"


@pytest.mark.parametrize("protocol", ["legacy", "rest"])
async def test_a_prefix_that_does_not_decode_to_a_route_is_a_404_and_touches_nothing(
    runtime: RuntimeServer, http: aiohttp.ClientSession, protocol: str
) -> None:
    """`%2F` (a separator aiohttp keeps encoded) and `%46` ("F", routes are case-sensitive) make no route."""
    _populate(runtime.root)
    before = _tree(runtime.root)
    base = "/" if protocol == "legacy" else "/v1/"
    for prefix in (f"{base}%2Ffiles/", f"{base}%46iles/", f"{base}%46ILES/", "/%2Fv1/files/"):
        async with http.delete(_url(runtime, protocol, prefix + "tmp?recursive=true")) as resp:
            assert resp.status == 404, (prefix, await resp.text())
            assert resp.content_type == "application/json"
    assert _tree(runtime.root) == before


async def _raw_request(port: int, head: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize(
    ("protocol", "target", "status"),
    [("legacy", "/files/tmp/scratch.txt?recursive=true", 200), ("rest", "/v1/files/tmp/scratch.txt", 204)],
)
async def test_an_absolute_form_request_target_deletes_only_the_named_file(
    runtime: RuntimeServer, protocol: str, target: str, status: int
) -> None:
    """`DELETE http://host/files/x HTTP/1.1` routes on its path; the raw target is the whole URL, which also
    made the path "" (the root) until December 7."""
    _populate(runtime.root)
    before = _tree(runtime.root)
    port = runtime.ports[protocol]
    head = f"DELETE http://127.0.0.1:{port}{target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    got, _ = await _raw_request(port, head)
    assert got == status
    assert _tree(runtime.root) == [p for p in before if p != "tmp/scratch.txt"]


@pytest.mark.parametrize("explicit", ["", "%2F", ".", "d/.."])
async def test_deleting_the_root_by_naming_it_still_empties_it_as_upstream(
    runtime: RuntimeServer, http: aiohttp.ClientSession, explicit: str
) -> None:
    """Spec §2.2.1: the root named (empty path, `/`, `.`), with `recursive=true`, loses its contents and stays."""
    _populate(runtime.root)
    async with http.delete(_url(runtime, "rest", "/v1/files/" + explicit + "?recursive=true")) as resp:
        assert resp.status == 204, await resp.text()
    assert _tree(runtime.root) == []
    assert Path(runtime.root).is_dir()
    _populate(runtime.root)
    async with http.delete(_url(runtime, "legacy", "/files/" + explicit + "?recursive=true")) as resp:
        assert resp.status == 200, await resp.text()
        assert orjson.loads(await resp.read())["message"].endswith("deleted.")
    assert _tree(runtime.root) == []


async def test_sandboxd_delete_through_a_symlink_to_the_root_keeps_the_root(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    """A path that only resolves to the root (a link to it) is not the root named: 400, nothing removed."""
    _populate(runtime.root)
    Path(runtime.root, "d", "up").symlink_to("..")
    Path(runtime.root, "here").symlink_to(".")
    before = _tree(runtime.root)
    for path in ("here", "here/", "d/up", "d/up/."):
        async with http.delete(_url(runtime, "rest", f"/v1/files/{path}?recursive=true")) as resp:
            assert resp.status == 400, (path, await resp.text())
            assert (await resp.json())["code"] == "INVALID_ARGUMENT"
    assert _tree(runtime.root) == before
    # The legacy route removes the link itself, as `rm` does.
    async with http.delete(_url(runtime, "legacy", "/files/here?recursive=true")) as resp:
        assert resp.status == 200, await resp.text()
    assert _tree(runtime.root) == [p for p in before if p != "here"]


async def test_sandboxd_delete_of_the_configured_root_spelled_out_empties_it(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    _populate(runtime.root)
    spelled = runtime.state.configured_root.replace("/", "%2F")
    async with http.delete(_url(runtime, "rest", f"/v1/files/{spelled}?recursive=true")) as resp:
        assert resp.status == 204, await resp.text()
    assert _tree(runtime.root) == []
