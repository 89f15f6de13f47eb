"""The legacy protocol on a real server (spec §2.1): shapes, status codes, quirks, and our extensions."""

from __future__ import annotations

import asyncio
import base64
import gc
import logging
import os
import signal
import stat
import time
import urllib.parse
from pathlib import Path

import aiohttp
import orjson
import pytest
import yarl

from agent_sandbox.runtime import RuntimeServer
from tests.integration.runtime.conftest import MakeRuntime, url
from tests.integration.runtime.helpers import leaked_processes, make_special_files

pytestmark = pytest.mark.integration


async def _execute(http: aiohttp.ClientSession, server: RuntimeServer, body: object) -> tuple[int, object]:
    async with http.post(url(server, "legacy", "/execute"), data=orjson.dumps(body)) as resp:
        return resp.status, await resp.json()


async def test_health(runtime: RuntimeServer, http: aiohttp.ClientSession) -> None:
    async with http.get(url(runtime, "legacy", "/")) as resp:
        assert resp.status == 200
        assert await resp.json() == {"status": "ok", "message": "Sandbox Runtime is active."}


async def test_execute_runs_without_a_shell_in_the_root(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    status, body = await _execute(http, runtime, {"command": "echo hi"})
    assert (status, body) == (
        200,
        {"stdout": "hi\n", "stderr": "", "exit_code": 0, "timed_out": False, "truncated": False},
    )
    # shlex quoting is honoured; $VAR and pipes are not interpreted (no shell)
    status, body = await _execute(http, runtime, {"command": "echo 'a  b' $HOME | x"})
    assert body["stdout"] == "a  b $HOME | x\n"
    status, body = await _execute(http, runtime, {"command": "pwd"})
    assert body["stdout"] == runtime.root + "\n"
    status, body = await _execute(http, runtime, {"command": "sh -c 'echo out; echo err >&2; exit 3'"})
    assert (body["stdout"], body["stderr"], body["exit_code"]) == ("out\n", "err\n", 3)


@pytest.mark.parametrize(
    ("command", "stderr"),
    [
        (
            "no-such-program-xyz",
            "Failed to execute command: [Errno 2] No such file or directory: 'no-such-program-xyz'",
        ),
        ("echo 'unclosed", "Failed to execute command: No closing quotation"),
        ("", "Failed to execute command: empty command"),
        (
            "python3 -c '" + "#" * 140_000 + "'",  # an agent's whole script inline, past one argument's limit
            "Failed to execute command: [Errno 7] Argument list too long: 'python3' - one argument may hold at "
            "most 128 KiB and all of them with the environment about 2 MiB: write a long script to a file and "
            "run the file",
        ),
    ],
)
async def test_execution_problems_are_200_with_exit_code_1(
    runtime: RuntimeServer, http: aiohttp.ClientSession, command: str, stderr: str
) -> None:
    status, body = await _execute(http, runtime, {"command": command})
    assert status == 200
    assert body == {"stdout": "", "stderr": stderr, "exit_code": 1, "timed_out": False, "truncated": False}


async def test_timeout_kills_the_whole_process_group(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    started = time.monotonic()
    status, body = await _execute(
        http, runtime, {"command": "sh -c 'sleep 300 & sleep 301 & wait'", "timeout_seconds": 0.5}
    )
    assert time.monotonic() - started < 10
    assert status == 200
    assert body["timed_out"] is True
    assert body["exit_code"] == 1
    assert "timed out after 0.5 seconds" in body["stderr"]
    for _ in range(50):
        if not leaked_processes(runtime.root):
            break
        await asyncio.sleep(0.1)
    assert leaked_processes(runtime.root) == []


@pytest.mark.parametrize(
    ("child", "answered_within"),
    [
        ("sleep 30", (0.2, 0.9)),  # quiet: holds the pipes and says nothing -> the quiet window
        ("while true; do echo tick; sleep 0.2; done", (1.4, 20)),  # chatty: the drain limit, no later
    ],
)
async def test_a_background_child_does_not_hold_the_answer(
    make_runtime: MakeRuntime,
    http: aiohttp.ClientSession,
    child: str,
    answered_within: tuple[float, float],
) -> None:
    """`sh -c 'server & echo started'`: the command exits at once, its child keeps stdout open. The answer
    comes once the pipes have been quiet for `output_quiet_after_exit` after the exit (here 0.3 s), and at the
    latest `output_drain_after_exit` after it (sandboxd's WaitDelay, here 1.5 s), however chatty the child.
    It used to wait for the child (30 s for `sleep 30`, forever for a chatty one), then the whole drain limit
    (10 s by default) for every `server &`."""
    runtime = await make_runtime(output_drain_after_exit=1.5, output_quiet_after_exit=0.3)
    started = time.monotonic()
    status, body = await _execute(
        http, runtime, {"command": f"sh -c '({child}) & echo started'", "timeout_seconds": 60}
    )
    elapsed = time.monotonic() - started
    assert (status, body["exit_code"], body["timed_out"]) == (200, 0, False)
    # The chatty child may write before the command does (CI saw "tick\nstarted\n..." on a loaded box).
    assert "started" in body["stdout"].splitlines()
    low, high = answered_within
    assert low < elapsed < high, elapsed
    await _end_children(runtime)


async def test_what_a_background_child_says_soon_after_the_exit_is_kept(
    make_runtime: MakeRuntime, http: aiohttp.ClientSession
) -> None:
    """Output that follows the exit within the quiet window is part of the answer (each piece restarts the
    window); what comes after a quiet window is not, and does not delay the answer."""
    runtime = await make_runtime(output_drain_after_exit=20.0, output_quiet_after_exit=1.0)
    command = "sh -c '(sleep 0.3; echo soon; sleep 0.3; echo sooner; sleep 5; echo late) & echo started'"
    started = time.monotonic()
    status, body = await _execute(http, runtime, {"command": command, "timeout_seconds": 60})
    elapsed = time.monotonic() - started
    assert (status, body["stdout"]) == (200, "started\nsoon\nsooner\n")
    assert 1.5 < elapsed < 5, elapsed
    await _end_children(runtime)


async def _end_children(runtime: RuntimeServer) -> None:
    """The children run on (as they should); end them and wait until they are gone, so that the fixture's
    leak check does not race the kill that stopping the server would send."""
    runtime.state.supervisor.signal_all(signal.SIGKILL)
    for _ in range(100):
        if not leaked_processes(runtime.root):
            break
        await asyncio.sleep(0.05)
    assert leaked_processes(runtime.root) == []


async def test_default_timeout_comes_from_the_config(
    make_runtime: MakeRuntime, http: aiohttp.ClientSession
) -> None:
    server = await make_runtime(command_timeout=0.3)
    _status, body = await _execute(http, server, {"command": "sleep 30"})
    assert body["timed_out"] is True


async def test_env_and_cwd_per_command(runtime: RuntimeServer, http: aiohttp.ClientSession) -> None:
    Path(runtime.root, "sub").mkdir()
    status, body = await _execute(
        http, runtime, {"command": "sh -c 'echo $GREETING; pwd'", "env": {"GREETING": "hey"}, "cwd": "sub"}
    )
    assert body["stdout"] == f"hey\n{runtime.root}/sub\n"
    status, body = await _execute(http, runtime, {"command": "pwd", "cwd": "../.."})
    assert (status, body) == (403, {"message": "Access denied"})


async def test_output_is_bounded_with_a_marker(
    make_runtime: MakeRuntime, http: aiohttp.ClientSession
) -> None:
    server = await make_runtime(max_output_bytes=1000)
    _status, body = await _execute(http, server, {"command": "head -c 5000 /dev/zero"})
    assert body["truncated"] is True
    assert body["stdout"].startswith("\0" * 1000)
    assert body["stdout"].endswith("\n[output truncated: 4000 more bytes]\n")
    assert body["exit_code"] == 0


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        (b"{bad json", ["body", 1]),
        (b"{}", ["body", "command"]),
        (b'{"command": 5}', ["body", "command"]),
        (b"[1]", ["body"]),
        (b'{"command": "true", "timeout_seconds": -1}', ["body", "timeout_seconds"]),
        (b'{"command": "true", "timeout_seconds": "x"}', ["body", "timeout_seconds"]),
        (b'{"command": "true", "env": {"A=B": "c"}}', ["body", "env"]),
        (b'{"command": "true", "cwd": 3}', ["body", "cwd"]),
    ],
)
async def test_malformed_execute_bodies_are_422(
    runtime: RuntimeServer, http: aiohttp.ClientSession, raw: bytes, loc: list[object]
) -> None:
    async with http.post(url(runtime, "legacy", "/execute"), data=raw) as resp:
        assert resp.status == 422
        body = await resp.json()
    assert body["detail"][0]["loc"] == loc


async def test_oversized_json_body_is_413(make_runtime: MakeRuntime, http: aiohttp.ClientSession) -> None:
    server = await make_runtime(max_json_body_bytes=1024)
    status, body = await _execute(http, server, {"command": "echo " + "x" * 4096})
    assert status == 413
    assert "message" in body


async def test_stream_execute_ndjson_events_in_order(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    body = {"command": "sh -c 'echo one; echo two >&2; sleep 0.2; echo three'"}
    events = []
    first_event_at = None
    started = time.monotonic()
    async with http.post(url(runtime, "legacy", "/execute/stream"), data=orjson.dumps(body)) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/x-ndjson")
        async for line in resp.content:
            events.append(orjson.loads(line))
            if first_event_at is None and events[-1]["type"] == "stdout":
                first_event_at = time.monotonic() - started
    assert events[0]["type"] == "start"
    assert events[-1] == {"type": "exit", "exit_code": 0, "timed_out": False}
    out = "".join(e["data"] for e in events if e["type"] == "stdout")
    err = "".join(e["data"] for e in events if e["type"] == "stderr")
    assert (out, err) == ("one\nthree\n", "two\n")
    assert first_event_at is not None


async def test_stream_execute_raw_bytes_on_request(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    """`"output_encoding": "base64"`: the bytes exactly as written (not UTF-8, NULs); default stays text."""
    script = "printf '\\377\\376\\000'; printf '\\303' >&2; printf '\\251' >&2"
    for encoding in ("base64", None):
        body: dict[str, object] = {"command": f'sh -c "{script}"'}
        if encoding:
            body["output_encoding"] = encoding
        async with http.post(url(runtime, "legacy", "/execute/stream"), data=orjson.dumps(body)) as resp:
            events = [orjson.loads(line) async for line in resp.content]
        chunks = [e for e in events if e["type"] in ("stdout", "stderr")]
        if encoding:
            assert all(set(e) == {"type", "data_base64"} for e in chunks), chunks
            out = b"".join(base64.b64decode(e["data_base64"]) for e in chunks if e["type"] == "stdout")
            err = b"".join(base64.b64decode(e["data_base64"]) for e in chunks if e["type"] == "stderr")
            assert (out, err) == (b"\xff\xfe\x00", b"\xc3\xa9")
        else:
            out_text = "".join(e["data"] for e in chunks if e["type"] == "stdout")
            err_text = "".join(e["data"] for e in chunks if e["type"] == "stderr")
            assert (out_text, err_text) == ("\ufffd\ufffd\x00", "\u00e9")  # split character kept
    bad = {"command": "true", "output_encoding": "latin-1"}
    async with http.post(url(runtime, "legacy", "/execute/stream"), data=orjson.dumps(bad)) as resp:
        assert resp.status == 422
        assert (await resp.json())["detail"][0]["loc"] == ["body", "output_encoding"]
    failed = {"command": "no-such-xyz", "output_encoding": "base64"}
    async with http.post(url(runtime, "legacy", "/execute/stream"), data=orjson.dumps(failed)) as resp:
        events = [orjson.loads(line) async for line in resp.content]
    assert base64.b64decode(events[0]["data_base64"]).startswith(b"Failed to execute command: [Errno 2]")


async def test_stream_execute_timeout_and_spawn_failure(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    body = {"command": "sleep 30", "timeout_seconds": 0.3}
    async with http.post(url(runtime, "legacy", "/execute/stream"), data=orjson.dumps(body)) as resp:
        events = [orjson.loads(line) async for line in resp.content]
    assert events[-1]["type"] == "exit"
    assert events[-1]["timed_out"] is True
    async with http.post(
        url(runtime, "legacy", "/execute/stream"), data=b'{"command": "no-such-xyz"}'
    ) as resp:
        events = [orjson.loads(line) async for line in resp.content]
    assert events[-1] == {"type": "exit", "exit_code": 1, "timed_out": False}
    assert events[0]["data"].startswith("Failed to execute command: [Errno 2]")


async def test_client_disconnect_kills_the_command(runtime: RuntimeServer) -> None:
    body = orjson.dumps({"command": "sh -c 'echo started; sleep 300'"})
    session = aiohttp.ClientSession()
    async with session, session.post(url(runtime, "legacy", "/execute/stream"), data=body) as resp:
        async for line in resp.content:
            if b"started" in line:
                break
    for _ in range(100):
        if not leaked_processes(runtime.root):
            break
        await asyncio.sleep(0.1)
    assert leaked_processes(runtime.root) == []


async def test_the_process_limit_holds_for_requests_that_arrive_together(
    make_runtime: MakeRuntime, http: aiohttp.ClientSession
) -> None:
    """`--max-processes` was checked before the spawn's first await and counted after it: 150 commands sent
    together all ran under the default limit of 64 (until December 6). Past the limit: 429, on both routes."""
    server = await make_runtime(max_processes=3)

    async def one(route: str) -> int:
        body = orjson.dumps({"command": "sleep 2"})
        async with http.post(url(server, "legacy", route), data=body) as resp:
            if resp.status == 429:
                assert (await resp.json())["message"] == "too many running commands (limit 3)"
            else:
                await resp.read()
            return resp.status

    statuses = await asyncio.gather(
        *(one("/execute") for _ in range(8)), *(one("/execute/stream") for _ in range(4))
    )
    assert sorted(statuses) == [200] * 3 + [429] * 9, statuses


def _pending_pumps() -> list[asyncio.Task[object]]:
    return [
        t
        for t in asyncio.all_tasks()
        if not t.done() and getattr(t.get_coro(), "__qualname__", "") == "Process._pump"
    ]


async def test_commands_given_up_on_leave_no_task_behind(runtime: RuntimeServer) -> None:
    """A command with lots of output that times out, or whose streaming client goes away: its output pumps
    were cancelled while their queue was full and waited forever to hand on their end marker - tasks pending
    for good, "Task was destroyed but it is pending!" when collected (until December 6)."""
    gc.disable()  # a collected pending task would vanish from `all_tasks` and hide the leak
    try:
        async with aiohttp.ClientSession() as session:
            body = orjson.dumps({"command": "yes", "timeout_seconds": 0.3})
            for _ in range(2):
                async with session.post(url(runtime, "legacy", "/execute"), data=body) as resp:
                    assert (await resp.json())["timed_out"] is True
        for _ in range(8):  # the cancellation that follows a disconnect cut the cleanup short now and then
            session = aiohttp.ClientSession()
            async with (
                session,
                session.post(
                    url(runtime, "legacy", "/execute/stream"), data=orjson.dumps({"command": "yes"})
                ) as resp,
            ):
                await resp.content.readline()
        for _ in range(100):
            if not _pending_pumps() and runtime.state.supervisor.running == 0:
                break
            await asyncio.sleep(0.05)
        assert runtime.state.supervisor.running == 0
        assert _pending_pumps() == []
    finally:
        gc.enable()


async def _upload(
    http: aiohttp.ClientSession, server: RuntimeServer, filename: str, data: bytes, query: str = ""
) -> tuple[int, object]:
    form = aiohttp.FormData(quote_fields=False)  # as requests/urllib3 send it (the upstream SDK)
    form.add_field("file", data, filename=filename, content_type="application/octet-stream")
    async with http.post(url(server, "legacy", "/upload" + query), data=form) as resp:
        return resp.status, await resp.json()


async def test_an_upload_takes_a_mode_as_sandboxd_does(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    """Ours: `?mode=0600` sets the file's mode as it is written (a secret is never 0644, not even briefly);
    without it a new file is 0644 (test_legacy_files.py: a file written again keeps its mode); a malformed mode
    is refused before the body."""
    assert (await _upload(http, runtime, "secret", b"s", "?mode=0600"))[0] == 200
    assert stat.S_IMODE(Path(runtime.root, "secret").stat().st_mode) == 0o600
    assert (await _upload(http, runtime, "plain", b"p"))[0] == 200
    assert stat.S_IMODE(Path(runtime.root, "plain").stat().st_mode) == 0o644
    status, body = await _upload(http, runtime, "bad", b"b", "?mode=4755")
    assert (status, body) == (400, {"message": "File upload failed: mode '4755' must match ^0[0-7]{3}$"})
    assert not Path(runtime.root, "bad").exists()


async def test_files_round_trip(runtime: RuntimeServer, http: aiohttp.ClientSession) -> None:
    status, body = await _upload(http, runtime, "dir/sub/hello.txt", b"hi there")
    assert (status, body) == (200, {"message": "File 'dir/sub/hello.txt' uploaded successfully."})
    assert Path(runtime.root, "dir/sub/hello.txt").read_bytes() == b"hi there"
    for path in ("dir%2Fsub%2Fhello.txt", "dir/sub/hello.txt"):
        async with http.get(url(runtime, "legacy", f"/download/{path}")) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "application/octet-stream"
            assert resp.headers["Content-Disposition"] == 'attachment; filename="dir/sub/hello.txt"'
            assert await resp.read() == b"hi there"
    async with http.get(url(runtime, "legacy", "/list/dir%2Fsub")) as resp:
        entries = await resp.json()
    assert [(e["name"], e["size"], e["type"]) for e in entries] == [("hello.txt", 8, "file")]
    assert isinstance(entries[0]["mod_time"], float)
    async with http.get(url(runtime, "legacy", "/list/")) as resp:
        assert [(e["name"], e["type"]) for e in await resp.json()] == [("dir", "directory")]
    async with http.get(url(runtime, "legacy", "/exists/dir%2Fsub%2Fhello.txt")) as resp:
        assert await resp.json() == {"path": "dir/sub/hello.txt", "exists": True}
    async with http.get(url(runtime, "legacy", "/exists/nope")) as resp:
        assert await resp.json() == {"path": "nope", "exists": False}
    # extension: delete (409 for a non-empty directory without recursive)
    async with http.delete(url(runtime, "legacy", "/files/dir")) as resp:
        assert resp.status == 409
    async with http.delete(url(runtime, "legacy", "/files/dir%2Fsub%2Fhello.txt")) as resp:
        assert resp.status == 200
    async with http.delete(url(runtime, "legacy", "/files/dir?recursive=true")) as resp:
        assert resp.status == 200
    async with http.delete(url(runtime, "legacy", "/files/dir")) as resp:
        assert resp.status == 404
    assert os.listdir(runtime.root) == []


async def test_not_found_shapes(runtime: RuntimeServer, http: aiohttp.ClientSession) -> None:
    Path(runtime.root, "d").mkdir()
    Path(runtime.root, "f").write_text("x")
    for path, expected in (
        ("/download/nope", "File not found"),
        ("/download/d", "File not found"),
        ("/list/f", "Path is not a directory"),
        ("/list/nope", "Path is not a directory"),
    ):
        async with http.get(url(runtime, "legacy", path)) as resp:
            assert (resp.status, await resp.json()) == (404, {"message": expected}), path


@pytest.mark.parametrize(
    "path",
    [
        "/download/..%2F..%2Fetc%2Fpasswd",
        "/download/%2E%2E/%2E%2E/etc/passwd",
        "/list/..%2F",
        "/exists/..%2F..%2Fetc",
        "/download/link/passwd",
        "/list/link",
        "/download/abs-link",
    ],
)
async def test_escapes_are_403(runtime: RuntimeServer, http: aiohttp.ClientSession, path: str) -> None:
    os.symlink("/etc", Path(runtime.root, "link"))
    os.symlink("/etc/passwd", Path(runtime.root, "abs-link"))
    async with http.get(yarl.URL(url(runtime, "legacy", path), encoded=True)) as resp:
        assert (resp.status, await resp.json()) == (403, {"message": "Access denied"})


async def test_absolute_paths_are_relative_to_the_root(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    Path(runtime.root, "etc").mkdir()
    Path(runtime.root, "etc", "passwd").write_text("mine")
    async with http.get(url(runtime, "legacy", "/download/%2Fetc%2Fpasswd")) as resp:
        assert await resp.read() == b"mine"


async def test_upload_refusals(make_runtime: MakeRuntime, http: aiohttp.ClientSession) -> None:
    server = await make_runtime(max_upload_bytes=100)
    status, body = await _upload(http, server, "../escape.txt", b"x")
    assert (status, body) == (403, {"message": "Access denied"})
    status, body = await _upload(http, server, "big.bin", b"x" * 101)
    assert status == 413
    assert not Path(server.root, "big.bin").exists()
    assert [n for n in os.listdir(server.root) if n.startswith(".sandboxd-tmp-")] == []
    Path(server.root, "adir").mkdir()
    status, body = await _upload(http, server, "adir", b"x")
    assert status == 400
    form = aiohttp.FormData(quote_fields=False)  # as requests/urllib3 send it (the upstream SDK)
    form.add_field("other", b"x", filename="a.txt")
    async with http.post(url(server, "legacy", "/upload"), data=form) as resp:
        assert resp.status == 422
    async with http.post(
        url(server, "legacy", "/upload"),
        data=b"garbage",
        headers={"Content-Type": "multipart/form-data; boundary=zz"},
    ) as resp:
        assert resp.status == 400
    async with http.post(url(server, "legacy", "/upload"), data=b"garbage") as resp:
        assert resp.status == 422  # not multipart/form-data: no `file` part, as FastAPI reads it


async def test_unknown_routes_are_json_404_and_405(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    async with http.get(url(runtime, "legacy", "/nope")) as resp:
        assert (resp.status, await resp.json()) == (404, {"detail": "Not Found"})
    async with http.get(url(runtime, "legacy", "/execute")) as resp:
        assert (resp.status, await resp.json()) == (405, {"detail": "Method Not Allowed"})


@pytest.mark.parametrize("name", ["fifo", "sock"])
async def test_a_fifo_or_a_socket_is_not_a_file(
    runtime: RuntimeServer, http: aiohttp.ClientSession, name: str
) -> None:
    """Not a regular file: `404 File not found`, as upstream's `os.path.isfile` says. Opening a socket fails
    (ENXIO) before the check: a 500 with a traceback until December 6."""
    make_special_files(runtime.root)
    async with http.get(url(runtime, "legacy", f"/download/{name}")) as resp:
        assert (resp.status, await resp.json()) == (404, {"message": "File not found"})


@pytest.mark.parametrize("route", ["/execute", "/execute/stream", "/upload"])
async def test_a_body_that_does_not_decode_is_400(
    runtime: RuntimeServer, route: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A body that is not what its Content-Encoding says: a 400 naming the encoding, no traceback in the log
    (a 500 and two tracebacks per request until December 6; `br`, which aiohttp refuses up front, was a 400)."""
    headers = {"Content-Encoding": "gzip"}
    if route == "/upload":
        headers["Content-Type"] = "multipart/form-data; boundary=zz"
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(url(runtime, "legacy", route), data=b"not gzip at all", headers=headers) as resp,
    ):
        assert resp.status == 400, await resp.text()
        assert "gzip" in (await resp.json())["message"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("name", ["cr\rx.txt", "nl\nx.txt", "tab\tx.txt"])
async def test_a_name_with_a_control_character_downloads(
    runtime: RuntimeServer, http: aiohttp.ClientSession, name: str
) -> None:
    """Its Content-Disposition names it in the RFC 5987 form (a CR or LF in a header was a 500: "Forbidden
    control character detected in headers"); a LF in the path is routed (`.*` stopped at it: a 404)."""
    Path(runtime.root, name).write_bytes(b"odd")
    quoted = urllib.parse.quote(name, safe="")
    async with http.get(yarl.URL(url(runtime, "legacy", f"/download/{quoted}"), encoded=True)) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Disposition"] == f"attachment; filename*=utf-8''{quoted}"
        assert await resp.read() == b"odd"
    async with http.get(yarl.URL(url(runtime, "legacy", f"/exists/{quoted}"), encoded=True)) as resp:
        assert await resp.json() == {"path": name, "exists": True}
    async with http.delete(yarl.URL(url(runtime, "legacy", f"/files/{quoted}"), encoded=True)) as resp:
        assert resp.status == 200, await resp.text()
    assert not Path(runtime.root, name).exists()


async def test_a_directory_with_a_newline_in_its_name_lists(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    Path(runtime.root, "d\ne").mkdir()
    Path(runtime.root, "d\ne", "f").write_bytes(b"")
    async with http.get(yarl.URL(url(runtime, "legacy", "/list/d%0Ae"), encoded=True)) as resp:
        assert resp.status == 200, await resp.text()
        assert [e["name"] for e in await resp.json()] == ["f"]


@pytest.mark.parametrize(
    ("filename", "message"),
    [
        ("adir", "File upload failed: target path is a directory"),
        ("", "File upload failed: target path is a directory"),
        ("/", "File upload failed: target path is a directory"),
        ("afile/x", "File upload failed: a parent of the target is not a directory: File exists"),
        ("a" * 300, "File upload failed: file name too long"),
        (("d" * 200 + "/") * 25 + "f", "File upload failed: file name too long"),
    ],
)
async def test_upload_refusals_are_400_without_the_host_path(
    runtime: RuntimeServer, http: aiohttp.ClientSession, filename: str, message: str
) -> None:
    """The root is the host's volume directory: no answer names it (docs/runtime.md). Until December 6 these
    said `[Errno 21] target path is a directory: '/var/lib/.../root/adir'`, and a name too long was a 500."""
    Path(runtime.root, "adir").mkdir()
    Path(runtime.root, "afile").write_bytes(b"")
    status, body = await _upload(http, runtime, filename, b"x")
    assert (status, body) == (400, {"message": message})
    assert sorted(os.listdir(runtime.root)) == ["adir", "afile"]
