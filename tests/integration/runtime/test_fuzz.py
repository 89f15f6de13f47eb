"""Property-based fuzzing of both protocols on a real server: no 5xx, no escape from the root, no leak.

The root lives inside a canary directory next to a `target/` directory that a symlink in the root points at;
after every example nothing but the root may have changed there. Commands come from a harmless list (the
fuzzing is of shapes, paths, headers and bodies, not of what a shell would do). The `make_runtime` fixture
checks afterwards that no process is left in the root and no child is left unreaped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import grpc
import orjson
import pytest
import yarl
from grpc import aio
from hypothesis import example, given
from hypothesis import strategies as st

from agent_sandbox.api import processv1 as pb
from agent_sandbox.runtime import RuntimeServer
from tests.helpers import fuzz_settings
from tests.integration.runtime.conftest import MakeRuntime
from tests.integration.runtime.helpers import ProcessClient

pytestmark = pytest.mark.integration

FUZZ = fuzz_settings("RUNTIME_FUZZ_EXAMPLES", 120)

SEGMENTS = st.sampled_from(
    [
        "..",
        ".",
        "",
        "a",
        "b",
        "out",
        "inside",
        "%2F",
        "%2E%2E",
        "/",
        "~",
        "etc",
        "passwd",
        "\\",
        "a b",
        "é",
        "%00",
        "%ff",
        "%",
    ]
)
PATHS = st.one_of(
    st.lists(SEGMENTS, max_size=6).map("/".join),
    st.text(max_size=30),
    st.lists(SEGMENTS, max_size=6).map(lambda s: quote("/".join(s), safe="")),
)
SAFE_COMMANDS = st.sampled_from(
    ["true", "false", "echo x", "pwd", "ls", "cat nope", "sh -c 'exit 3'", "echo 'unclosed", "", "   "]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)


def _dumps(value: object) -> bytes:
    return json.dumps(value).encode()  # big integers and NaN included, unlike orjson


class Canary:
    """An outer directory holding the root and a target the root links to; nothing else may change."""

    def __init__(self, base: Path) -> None:
        self.outer = base / "outer"
        self.target = self.outer / "target"
        self.target.mkdir(parents=True)
        (self.target / "secret").write_text("s")
        self.root = self.outer / "root"

    def link(self, server: RuntimeServer) -> None:
        os.symlink(self.target, Path(server.root, "out"))
        os.makedirs(Path(server.root, "inside"), exist_ok=True)

    def assert_untouched(self) -> None:
        assert sorted(os.listdir(self.outer)) == ["root", "target"]
        assert sorted(os.listdir(self.target)) == ["secret"]
        assert (self.target / "secret").read_text() == "s"


@pytest.fixture
async def fuzz_target(make_runtime: MakeRuntime, tmp_path: Path) -> tuple[RuntimeServer, Canary]:
    canary = Canary(tmp_path)
    server = await make_runtime(root_dir=canary.root, max_upload_bytes=4096, command_timeout=5.0)
    canary.link(server)
    return server, canary


@pytest.fixture
async def session() -> Any:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


def _url(server: RuntimeServer, protocol: str, raw_path: str) -> yarl.URL:
    # the path goes on the wire as generated (percent signs and all), only characters HTTP forbids are escaped
    path = quote(raw_path, safe="/%:@!$&'()*+,;=-._~")
    return yarl.URL(f"http://127.0.0.1:{server.ports[protocol]}{path}", encoded=True)


BAD_CODES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


def _no_5xx(status: int, what: object) -> None:
    assert status < 500, what


@FUZZ
@given(path=PATHS, endpoint=st.sampled_from(["/download/", "/list/", "/exists/"]))
async def test_legacy_paths(
    fuzz_target: tuple[RuntimeServer, Canary], session: aiohttp.ClientSession, path: str, endpoint: str
) -> None:
    server, canary = fuzz_target
    async with session.get(_url(server, "legacy", endpoint + path)) as resp:
        _no_5xx(resp.status, (endpoint, path))
        body = await resp.read()
    if resp.status == 200 and endpoint == "/download/":
        assert body != b"s"  # never the secret behind the escaping link
    canary.assert_untouched()


@FUZZ
@given(
    filename=PATHS,
    data=st.binary(max_size=64),
    recursive=st.sampled_from(["", "?recursive=true", "?recursive=x"]),
)
async def test_legacy_upload_and_delete(
    fuzz_target: tuple[RuntimeServer, Canary],
    session: aiohttp.ClientSession,
    filename: str,
    data: bytes,
    recursive: str,
) -> None:
    server, canary = fuzz_target
    # built by hand: the client library refuses control characters, the server must not crash on them
    part = (
        b'--BOUNDARY\r\nContent-Disposition: form-data; name="file"; filename="'
        + filename.encode()
        + b'"\r\nContent-Type: application/octet-stream\r\n\r\n'
        + data
        + b"\r\n--BOUNDARY--\r\n"
    )
    headers = {"Content-Type": "multipart/form-data; boundary=BOUNDARY"}
    async with session.post(_url(server, "legacy", "/upload"), data=part, headers=headers) as resp:
        _no_5xx(resp.status, filename)
    async with session.delete(_url(server, "legacy", "/files/" + filename + recursive)) as resp:
        _no_5xx(resp.status, (filename, await resp.text()))
    canary.assert_untouched()
    Path(server.root, "inside").mkdir(exist_ok=True)
    if not Path(server.root, "out").is_symlink():
        os.symlink(canary.target, Path(server.root, "out"))


@FUZZ
@given(
    body=st.one_of(
        st.binary(max_size=40),
        JSON_VALUES.map(_dumps),
        st.fixed_dictionaries(
            {"command": SAFE_COMMANDS},
            optional={
                "timeout_seconds": st.one_of(st.floats(), st.integers(), st.text(max_size=3), st.none()),
                "env": st.one_of(
                    st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2), JSON_VALUES
                ),
                "cwd": st.one_of(PATHS, JSON_VALUES),
            },
        ).map(_dumps),
    ),
    stream=st.booleans(),
    content_type=st.sampled_from([None, "application/json", "text/plain", "multipart/form-data; boundary=x"]),
)
async def test_legacy_execute_bodies(
    fuzz_target: tuple[RuntimeServer, Canary],
    session: aiohttp.ClientSession,
    body: bytes,
    stream: bool,
    content_type: str | None,
) -> None:
    server, canary = fuzz_target
    headers = {"Content-Type": content_type} if content_type else {}
    path = "/execute/stream" if stream else "/execute"
    async with session.post(_url(server, "legacy", path), data=body, headers=headers) as resp:
        _no_5xx(resp.status, body)
        text = await resp.read()
    if resp.status == 200 and not stream:
        result = orjson.loads(text)
        assert set(result) >= {"stdout", "stderr", "exit_code"}
        if result["stdout"].startswith("/"):  # pwd: never outside the root
            assert result["stdout"].strip().startswith(server.root)
    canary.assert_untouched()


@FUZZ
@given(
    path=PATHS,
    method=st.sampled_from(["GET", "HEAD", "PUT", "DELETE"]),
    query=st.sampled_from(
        ["", "?mode=0644", "?mode=0777", "?mode=9", "?mode=", "?recursive=1", "?recursive=maybe", "?x=%ff"]
    ),
    headers=st.dictionaries(
        st.sampled_from(
            ["Range", "If-Modified-Since", "If-None-Match", "If-Range", "Content-Type", "If-Unmodified-Since"]
        ),
        st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
        max_size=3,
    ),
    body=st.binary(max_size=64),
)
# Found by this test in CI: aiohttp's `request.content_type` raised IndexError on it (a 500).
@example(path="", method="PUT", query="?mode=0644", headers={"Content-Type": ";0*"}, body=b"")
async def test_rest_files(
    fuzz_target: tuple[RuntimeServer, Canary],
    session: aiohttp.ClientSession,
    path: str,
    method: str,
    query: str,
    headers: dict[str, str],
    body: bytes,
) -> None:
    server, canary = fuzz_target
    Path(server.root, "inside").mkdir(exist_ok=True)
    Path(server.root, "inside", "f").write_bytes(b"0123456789")
    data = body if method == "PUT" else None
    async with session.request(
        method, _url(server, "rest", "/v1/files/" + path + query), data=data, headers=headers
    ) as resp:
        _no_5xx(resp.status, (method, path, query, headers))
        got = await resp.read()
    if method == "GET" and resp.status in (200, 206):
        assert got != b"s"  # never the secret behind the escaping link
    canary.assert_untouched()
    if not Path(server.root, "out").is_symlink():
        os.symlink(canary.target, Path(server.root, "out"))


@FUZZ
@given(
    method=st.sampled_from(["Start", "Execute", "WriteStdin", "SendSignal", "ResizeTTY"]),
    raw=st.binary(max_size=64),
)
async def test_grpc_raw_requests(fuzz_target: tuple[RuntimeServer, Canary], method: str, raw: bytes) -> None:
    server, canary = fuzz_target
    path, _, _, streaming = pb.METHODS[method]
    async with aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        try:
            if streaming:
                call = channel.unary_stream(path)(raw, timeout=10)
                async for _ in call:
                    pass
            else:
                await channel.unary_unary(path)(raw, timeout=10)
        except grpc.aio.AioRpcError as err:
            failure = (err.code(), err.details())
        else:
            failure = None
    assert failure is None or failure[0] not in BAD_CODES, (method, raw, failure)
    canary.assert_untouched()


@FUZZ
@given(
    command=st.sampled_from(
        [["pwd"], ["true"], ["ls", "-a"], [], [""], ["nope-xyz"], ["/bin/sh", "-c", "exit 2"], ["a\x00b"]]
    ),
    cwd=st.one_of(st.none(), PATHS),
    env=st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
    pty=st.booleans(),
)
async def test_grpc_process_configs(
    fuzz_target: tuple[RuntimeServer, Canary],
    command: list[str],
    cwd: str | None,
    env: dict[str, str],
    pty: bool,
) -> None:
    server, canary = fuzz_target
    config: dict[str, Any] = {"env_vars": env}
    if cwd is not None:
        config["cwd"] = cwd
    async with aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        client = ProcessClient(channel)
        try:
            if pty:
                events = [
                    e async for e in client.events(client.start(*command, pty=(80, 24), timeout=10, **config))
                ]
                out = b"".join(e.stdout for e in events)
            else:
                out = (await client.execute(*command, timeout=10, **config)).stdout
        except grpc.aio.AioRpcError as err:
            failure, out = (err.code(), err.details()), b""
        else:
            failure = None
    assert failure is None or failure[0] not in BAD_CODES, (command, cwd, failure)
    if failure is None and command == ["pwd"]:
        assert out.strip().decode().startswith(server.root)
    canary.assert_untouched()
