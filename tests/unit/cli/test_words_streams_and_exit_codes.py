"""The CLI's December 7 fixes that need no cluster: exec's words reach the program as given (with and without
-i), suspend/resume refuse a timeout past 30 days before the change, `logs --tail -1` is all lines, a closed
stdout / stderr, the exit codes of `cp` (3 for a file that is not there, 2 for a directory in the way), the
proxy's message for a name that does not resolve, and Ctrl-C while the CLI loads."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.unit


def _fake_exec(monkeypatch: pytest.MonkeyPatch, commands: list[str]) -> None:
    """`exec` against a handle whose commands are recorded (and exit 0), with and without -i."""
    from agent_sandbox.cli import exec_command, interactive
    from agent_sandbox_sdk.models import CommandEvent

    class Stream:
        def __enter__(self) -> Stream:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def __iter__(self) -> Any:
            yield CommandEvent(type="exit", exit_code=0)

    def stream(command: str, **kw: object) -> Stream:
        commands.append(command)
        return Stream()

    handle = SimpleNamespace(commands=SimpleNamespace(stream=stream))
    monkeypatch.setattr(exec_command, "make_client", lambda *a, **k: None)
    monkeypatch.setattr(exec_command, "_handle", lambda *a: handle)
    # -i: the session's own terminal handling is not what is tested; the command it starts is.
    monkeypatch.setattr(
        interactive,
        "run_interactive",
        lambda start, **kw: CommandEvent(type="exit", exit_code=0) if start(False) else None,
    )


@pytest.mark.parametrize("flags", [[], ["-i"]], ids=["plain", "stdin"])
@pytest.mark.parametrize(
    ("words", "sent"),
    [
        (["./my prog.sh"], "'./my prog.sh'"),
        (["echo a; echo b"], "'echo a; echo b'"),
        (["ls"], "ls"),
        (["sh", "-c", "echo a; echo b"], "sh -c 'echo a; echo b'"),
    ],
    ids=["space", "shell-code", "plain-word", "several"],
)
def test_exec_passes_each_word_as_given_with_and_without_stdin(
    words: list[str], sent: str, flags: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone word went to the runtime as it was: `exec sb -- "./my prog.sh"` ran `./my`, and with -i a file
    name holding `;` ran as shell code (until December 7). Each word is quoted for the runtime's shell, as
    kubectl exec passes its words."""
    from agent_sandbox.cli.main import main

    commands: list[str] = []
    _fake_exec(monkeypatch, commands)
    assert main(["exec", "sb", "-n", "demo", *flags, "--", *words]) == 0
    assert commands == [sent]


def test_suspend_and_resume_refuse_a_timeout_past_30_days_before_the_change(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`suspend --timeout 1e10` suspended the sandbox, then failed waiting with an OverflowError traceback
    (exit 1). Refused first, as every --timeout: a usage error (exit 2)."""
    from agent_sandbox.cli import claim_commands
    from agent_sandbox.cli.main import main

    def no_client(*a: object, **k: object) -> None:
        raise AssertionError("the change was attempted")

    monkeypatch.setattr(claim_commands, "make_client", no_client)
    for command in ("suspend", "resume"):
        with pytest.raises(SystemExit) as exited:
            main([command, "c1", "-n", "demo", "--timeout", "1e10"])
        assert exited.value.code == 2
        assert capsys.readouterr().err.endswith(
            "error: argument --timeout: must be a positive number of seconds up to 2592000 (30 days), "
            "got '1e10'\n"
        )


@pytest.mark.parametrize(("given", "tail"), [("-1", None), ("-5", None), ("0", 0), ("20", 20)])
def test_logs_tail_negative_is_every_line(given: str, tail: int | None) -> None:
    """kubectl's `--tail=-1` is all lines; it was sent to the API server as it was (HTTP 422, exit 1)."""
    from agent_sandbox.cli.main import build_parser

    assert build_parser().parse_args(["logs", "c1", f"--tail={given}"]).tail == tail


def test_a_listen_address_that_does_not_resolve_is_said_in_the_resolvers_words() -> None:
    """`proxy --address nonsense.invalid` said "Unknown error -2" (a resolver code taken for an errno)."""
    from agent_sandbox.cli.proxy import _listen_reason

    unresolved = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert _listen_reason(unresolved) == "Name or service not known"
    in_use = OSError(98, "error while attempting to bind on address ('127.0.0.1', 1): address already in use")
    assert _listen_reason(in_use) == "Address already in use"


class _Files:
    """A sandbox's file API: `dd` a directory at the root, `dd/f1` a directory (listing says so), no `nope`."""

    def list(self, path: str, **kw: object) -> list[Any]:
        from agent_sandbox_sdk.models import FileEntry

        now = datetime.now(UTC)
        if path in ("", "."):
            return [FileEntry(name="dd", size=0, type="directory", modified=now)]
        return [FileEntry(name="f1", size=0, type="directory", modified=now)]

    def read_to(self, path: str, destination: object, **kw: object) -> int:
        from agent_sandbox_sdk import SandboxRequestError

        raise SandboxRequestError(f"GET http://router.test/download/{path}: HTTP 404: Not Found", 404)

    def write(self, path: str, data: object, **kw: object) -> None:
        from agent_sandbox_sdk import SandboxRequestError

        raise SandboxRequestError(
            "POST http://router.test/upload: HTTP 400: File upload failed: target path is a directory", 400
        )


def _fake_cp(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_sandbox.cli import sandboxes

    client = SimpleNamespace(get_sandbox=lambda claim, namespace: SimpleNamespace(files=_Files()))
    monkeypatch.setattr(sandboxes, "make_client", lambda *a, **k: client)


def test_cp_of_a_file_that_is_not_there_exits_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not found is exit 3 (the documented code for a 404); a missing file was a plain error, exit 1."""
    from agent_sandbox.cli.main import main

    _fake_cp(monkeypatch)
    assert main(["cp", "c1:nope", str(tmp_path / "x"), "-n", "demo"]) == 3
    assert capsys.readouterr().err == "error: c1:nope: no such file or directory\n"


def test_cp_of_a_file_onto_a_directory_in_the_sandbox_says_so_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cp f1 c1:dd` with a directory dd/f1 printed the runtime's raw `POST ...: HTTP 400: ...`, exit 1; as a
    download onto a local directory: the path and "is a directory", exit 2."""
    from agent_sandbox.cli.main import main

    _fake_cp(monkeypatch)
    local = tmp_path / "f1"
    local.write_text("x")
    assert main(["cp", str(local), "c1:dd", "-n", "demo"]) == 2
    assert capsys.readouterr().err == "error: c1:dd/f1: is a directory\n"


#: A script that runs the CLI's `main` with a fake client: `list` prints one claim, `exec` relays the events.
_FAKE_CLI = """
import sys
from types import SimpleNamespace
from agent_sandbox.cli import claim_commands, exec_command
from agent_sandbox.cli.main import main
from agent_sandbox_sdk.models import CommandEvent, SandboxInfo

info = SandboxInfo(claim_name="c1", namespace="demo", ready=True, suspended=False)
claim_commands.make_client = lambda *a, **k: SimpleNamespace(list_sandboxes=lambda *a: [info])
events = [
    CommandEvent(type="stdout", data=b"out\\n"),
    CommandEvent(type="stderr", data=b"err\\n"),
    CommandEvent(type="exit", exit_code=int(sys.argv[1])),
]
exec_command.make_client = lambda *a, **k: None
exec_command._handle = lambda *a: SimpleNamespace(
    commands=SimpleNamespace(stream=lambda command, **kw: iter(events))
)
sys.exit(main(sys.argv[2:]))
"""


def _run_closed(redirect: str, exit_code: int, *argv: str) -> subprocess.CompletedProcess[str]:
    """`_FAKE_CLI` under bash with `redirect` (`>&-`: no stdout; `2>&-`: no stderr), the other kept."""
    script = f'"$0" -c "$1" {exit_code} {" ".join(argv)} {redirect}'
    return subprocess.run(
        ["bash", "-c", script, sys.executable, textwrap.dedent(_FAKE_CLI)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("argv", [["list", "-n", "demo"], ["exec", "c1", "-n", "demo", "--", "echo", "hi"]])
def test_a_closed_stdout_is_one_error_line_and_exit_1(argv: list[str]) -> None:
    """`list >&-` and `exec ... >&-` ended in an AttributeError traceback (`sys.stdout` is None)."""
    done = _run_closed(">&-", 0, *argv)
    assert (done.returncode, done.stderr) == (1, "error: cannot write to standard output\n")


@pytest.mark.parametrize("exit_code", [0, 7])
def test_a_closed_stderr_drops_the_commands_stderr_and_keeps_its_exit_code(exit_code: int) -> None:
    """`exec ... 2>&-` of a command that wrote to stderr exited 1 (an AttributeError nobody could see)."""
    done = _run_closed("2>&-", exit_code, "exec", "c1", "-n", "demo", "--", "sh", "-c", "x")
    assert (done.returncode, done.stdout) == (exit_code, "out\n")


def test_ctrl_c_while_the_cli_loads_exits_130_without_a_traceback() -> None:
    """A Ctrl-C in the ~0.5 s the CLI takes to load its imports printed a KeyboardInterrupt traceback. Here it
    arrives where it most likely does, in the imports of `agent_sandbox.cli.main` (as the console script
    imports it)."""
    script = textwrap.dedent(
        """
        import sys

        class CtrlC:
            def find_spec(self, name, path=None, target=None):
                if name == "agent_sandbox.devcluster":
                    raise KeyboardInterrupt
                return None

        sys.meta_path.insert(0, CtrlC())
        from agent_sandbox.cli.main import main
        sys.exit(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "list"], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stderr) == (130, "")
