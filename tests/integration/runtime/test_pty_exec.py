"""A command started with a PTY is executed as one without (spec §2.2.2: `command[0]` is the program, no implicit
shell): the same exec errors, the client's environment as given (docs/runtime.md).

The terminal is made the command's controlling one by a tiny /bin/sh wrapper (runtime/spawn.py); until
December 7 that shell showed: a script without `#!` ran as a shell script (without PTY: ENOEXEC, as sandboxd),
a missing `#!` interpreter was the shell's exit 127, and the client's PWD was replaced by the real cwd.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from agent_sandbox.runtime import RuntimeServer
from tests.integration.runtime.helpers import ProcessClient

pytestmark = pytest.mark.integration


async def _run(client: ProcessClient, *command: str, pty: bool, **config: object) -> tuple[int, bytes]:
    events = [e async for e in client.events(client.start(*command, pty=(80, 24) if pty else None, **config))]
    return events[-1].exit.exit_code, b"".join(e.stdout for e in events)


async def _start_error(client: ProcessClient, *command: str, pty: bool) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _run(client, *command, pty=pty)
    return err.value


def _script(root: str, name: str, text: bytes) -> None:
    Path(root, name).write_bytes(text)
    os.chmod(Path(root, name), 0o755)


@pytest.mark.parametrize("text", [b"echo ran-as-shell\n", b"", b"\x00\x01binary"])
async def test_a_program_the_kernel_cannot_exec_is_refused_with_and_without_pty(
    runtime: RuntimeServer, grpc_client: ProcessClient, text: bytes
) -> None:
    _script(runtime.root, "noshebang", text)
    for pty in (False, True):
        err = await _start_error(grpc_client, "./noshebang", pty=pty)
        assert err.code() == grpc.StatusCode.INTERNAL, (pty, err.details())
        assert "Exec format error" in (err.details() or ""), (pty, err.details())


async def test_a_missing_interpreter_is_not_found_with_and_without_pty(
    runtime: RuntimeServer, grpc_client: ProcessClient
) -> None:
    _script(runtime.root, "orphan", b"#!/no/such/interpreter\necho hi\n")
    for pty in (False, True):
        err = await _start_error(grpc_client, "./orphan", pty=pty)
        assert err.code() == grpc.StatusCode.NOT_FOUND, (pty, err.details())


async def test_scripts_and_binaries_still_run_under_a_pty(
    runtime: RuntimeServer, grpc_client: ProcessClient
) -> None:
    _script(runtime.root, "ok.sh", b"#!/bin/sh\necho script-ran\n")
    _script(runtime.root, "spaced.sh", b"#!  /bin/sh -e\necho spaced-ran\n")
    assert await _run(grpc_client, "./ok.sh", pty=True) == (0, b"script-ran\r\n")
    assert await _run(grpc_client, "./spaced.sh", pty=True) == (0, b"spaced-ran\r\n")
    assert await _run(grpc_client, "echo", "binary-ran", pty=True) == (0, b"binary-ran\r\n")


@pytest.mark.parametrize("pty", [False, True])
async def test_the_clients_pwd_is_kept(runtime: RuntimeServer, grpc_client: ProcessClient, pty: bool) -> None:
    Path(runtime.root, "sub").mkdir()
    code, out = await _run(
        grpc_client,
        "printenv",
        "PWD",
        "OTHER",
        pty=pty,
        cwd="sub",
        env_vars={"PWD": "/client/pwd", "OTHER": "x"},
    )
    assert code == 0
    assert out.replace(b"\r\n", b"\n") == b"/client/pwd\nx\n"


async def test_pwd_is_the_same_with_and_without_pty_when_the_client_names_none(
    runtime: RuntimeServer, grpc_client: ProcessClient
) -> None:
    Path(runtime.root, "sub").mkdir()
    direct = await _run(grpc_client, "printenv", "PWD", pty=False, cwd="sub")
    with_pty = await _run(grpc_client, "printenv", "PWD", pty=True, cwd="sub")
    assert (with_pty[0], with_pty[1].replace(b"\r\n", b"\n")) == direct


async def test_a_relative_interpreter_is_found_from_the_working_directory(
    runtime: RuntimeServer, grpc_client: ProcessClient
) -> None:
    Path(runtime.root, "bin").mkdir()
    os.symlink("/bin/sh", Path(runtime.root, "bin", "mysh"))
    _script(runtime.root, "bin/rel.sh", b"#!bin/mysh\necho rel-ran\n")
    for pty in (False, True):
        code, out = await _run(grpc_client, "./bin/rel.sh", pty=pty)
        assert (code, out.replace(b"\r\n", b"\n")) == (0, b"rel-ran\n"), pty


@pytest.mark.parametrize(
    ("name", "text", "code"),
    [
        # CRLF line ends: the kernel looks for "/bin/sh\r" (the review of December 7: the shell's 127 with a PTY).
        ("crlf.sh", b"#!/bin/sh\r\necho hi\r\n", grpc.StatusCode.NOT_FOUND),
        ("emptyline.sh", b"#!\necho hi\n", grpc.StatusCode.INTERNAL),  # no interpreter: Exec format error
    ],
)
async def test_a_shebang_the_kernel_refuses_is_refused_with_and_without_pty(
    runtime: RuntimeServer, grpc_client: ProcessClient, name: str, text: bytes, code: grpc.StatusCode
) -> None:
    _script(runtime.root, name, text)
    for pty in (False, True):
        err = await _start_error(grpc_client, f"./{name}", pty=pty)
        assert err.code() == code, (pty, err.details())


async def test_a_relative_path_entry_is_searched_from_the_commands_directory(
    runtime: RuntimeServer, grpc_client: ProcessClient
) -> None:
    """`PATH=bin:...` finds `bin/tool` under the command's cwd with and without a PTY (with one it was searched
    from the server's own directory: NOT_FOUND, until the review of December 7)."""
    Path(runtime.root, "bin").mkdir()
    _script(runtime.root, "bin/tool", b"#!/bin/sh\necho tool-ran\n")
    env = {"PATH": f"bin:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    assert await _run(grpc_client, "tool", pty=False, env_vars=env) == (0, b"tool-ran\n")
    assert await _run(grpc_client, "tool", pty=True, env_vars=env) == (0, b"tool-ran\r\n")
