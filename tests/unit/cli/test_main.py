"""The installed CLI does not depend on a source checkout; `agent-sandbox bench` runs the checkout's benchmarks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "src" / "agent_sandbox"


def _installed_copy(tmp_path: Path) -> Path:
    """What a wheel installs: the package alone (pyproject: packages = ["src/agent_sandbox"])."""
    site = tmp_path / "site-packages"
    shutil.copytree(PACKAGE, site / "agent_sandbox", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def _run_installed(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    site = _installed_copy(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # -I: no current directory, no PYTHONPATH. The editable install's path entry (the checkout's src/) is
    # removed too, so the only agent_sandbox is the installed copy, far from any checkout.
    prelude = f"""
import sys
sys.path = [{str(site)!r}] + [p for p in sys.path if p != {str(ROOT / "src")!r}]
before = list(sys.path)
from agent_sandbox.cli.main import main
code = main({argv!r})
assert "benchmarks" not in sys.modules, "the CLI imported the checkout's benchmarks"
assert sys.path == before, "the CLI changed sys.path"
sys.exit(code)
"""
    return subprocess.run(
        [sys.executable, "-I", "-c", prelude], cwd=elsewhere, capture_output=True, text=True, timeout=120
    )


def test_installed_cli_help_works_without_a_checkout(tmp_path: Path) -> None:
    done = _run_installed(tmp_path, ["--help"])
    assert done.returncode == 0, done.stderr
    assert "bench" in done.stdout


def test_installed_cli_bench_outside_a_checkout_is_a_clear_error(tmp_path: Path) -> None:
    done = _run_installed(tmp_path, ["bench", "list"])
    assert done.returncode == 2, done.stderr
    assert "source checkout" in done.stderr
    assert "Traceback" not in done.stderr


def test_bench_inside_a_checkout_runs_python_m_benchmarks() -> None:
    # From a subdirectory: the checkout is found by walking up.
    done = subprocess.run(
        [sys.executable, "-m", "agent_sandbox.cli.main", "bench", "list"],
        cwd=ROOT / "docs",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "burst" in done.stdout
    assert "sustained" in done.stdout


@pytest.mark.parametrize("url", ["notaurl", "ftp://router:8080"])
def test_an_unusable_router_url_is_a_one_line_usage_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent_sandbox.cli.main import main

    assert main(["list", "--router-url", url, "--kubeconfig", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: --router-url / $AGENT_SANDBOX_ROUTER_URL {url!r}: "
        f"api_url must start with http:// or https://, got {url!r}\n"
    )


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "abc"])
@pytest.mark.parametrize(
    "command", [["exec", "c", "--"], ["create", "pool"], ["suspend", "c"], ["lifecycle", "resume", "c"]]
)
def test_a_timeout_must_be_a_positive_number(
    command: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent_sandbox.cli.main import main

    # `lifecycle resume --timeout nan` waited for good, and 0 or a negative number was taken (December 6).
    argv = (
        [*command[:2], "--timeout", value, *command[2:]]
        if command[0] != "lifecycle"
        else [*command, "--timeout", value]
    )
    with pytest.raises(SystemExit) as info:
        main([*argv, "true"] if command[0] == "exec" else argv)
    assert info.value.code == 2
    assert "argument --timeout: " in capsys.readouterr().err


def test_dev_status_takes_a_name_like_the_other_dev_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent_sandbox.cli.main import main

    monkeypatch.setenv("AGENT_SANDBOX_CACHE", str(tmp_path))
    assert main(["dev", "status"]) == 0
    assert capsys.readouterr().out == "no dev clusters\n"
    assert main(["dev", "status", "--name", "nosuch"]) == 1
    assert "no dev cluster named 'nosuch'" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "timeout"), [([], None), (["--timeout", "5"], 5.0)])
def test_exec_json_waits_for_the_command_as_long_as_the_runtime_lets_it_run(
    flags: list[str],
    timeout: float | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`exec -o json` without --timeout gave up on the answer after 70 s (a `sleep 75` failed), although the
    runtime lets a command run 300 s and `exec` without -o waits as long as it runs. It reads the command's
    stream, as `exec` does: the command's limit is the runtime's (or --timeout), and a router that stops
    answering is given up after the stream's idle limit (it waited up to a day for one, until December 6)."""
    from types import SimpleNamespace

    from agent_sandbox.cli import exec_command
    from agent_sandbox.cli.main import main
    from agent_sandbox_sdk.models import ExecutionResult

    calls: list[dict[str, object]] = []

    class Stream:
        def __enter__(self) -> Stream:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def result(self) -> ExecutionResult:
            return ExecutionResult(stdout="done\n", exit_code=0)

    def stream(command: str, **kw: object) -> Stream:
        calls.append({"command": command, **kw})
        return Stream()

    monkeypatch.setattr(exec_command, "make_client", lambda *a, **k: None)
    monkeypatch.setattr(
        exec_command, "_handle", lambda *a: SimpleNamespace(commands=SimpleNamespace(stream=stream))
    )
    assert main(["exec", "c", "-o", "json", *flags, "--", "sleep", "75"]) == 0
    assert calls == [{"command": "sleep 75", "timeout": timeout, "env": None, "cwd": None}]
    assert '"stdout": "done\\n"' in capsys.readouterr().out


def test_dev_up_router_is_not_an_abbreviation() -> None:
    """`dev up --router` (docs/router.md, lifecycle.md) was refused as an ambiguous prefix of the top-level
    --router-url and --router-token-file."""
    from agent_sandbox.cli.main import build_parser

    args = build_parser().parse_args(["dev", "up", "--name", "x", "--controller", "--router", "--lifecycle"])
    assert (args.name, args.controller, args.router, args.lifecycle) == ("x", True, True, True)


def test_no_command_takes_abbreviations() -> None:
    """As kubectl: `list --kubec X` was taken for --kubeconfig by the command's parser (not the top level's)."""
    from agent_sandbox.cli.main import build_parser

    _, unknown = build_parser().parse_known_args(["list", "--kubec", "x"])
    assert unknown == ["--kubec", "x"]


def _exec_json_against(
    monkeypatch: pytest.MonkeyPatch, stream_result: Callable[[], Any], run_result: Any = None
) -> list[str]:
    """`exec -o json` with a fake handle whose stream collects to `stream_result()`; the calls it made."""
    from types import SimpleNamespace

    from agent_sandbox.cli import exec_command

    calls: list[str] = []

    class Stream:
        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def result(self) -> Any:
            calls.append("stream")
            return stream_result()

    def run(command: str, **kw: object) -> Any:
        calls.append("run")
        return run_result

    commands = SimpleNamespace(stream=lambda command, **kw: Stream(), run=run)
    monkeypatch.setattr(exec_command, "make_client", lambda *a, **k: None)
    monkeypatch.setattr(exec_command, "_handle", lambda *a: SimpleNamespace(commands=commands))
    return calls


def test_exec_json_runs_through_execute_on_a_runtime_without_a_stream(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Upstream's python-runtime has only POST /execute: its 404 for /execute/stream made `exec -o json` fail
    # there once the CLI read the stream (December 6); it runs the command through /execute instead.
    from agent_sandbox.cli.main import main
    from agent_sandbox_sdk import SandboxRequestError
    from agent_sandbox_sdk.models import ExecutionResult

    def no_stream() -> Any:
        raise SandboxRequestError("POST http://router.test/execute/stream: HTTP 404: Not Found", 404)

    calls = _exec_json_against(monkeypatch, no_stream, ExecutionResult(stdout="hi\n", exit_code=0))
    assert main(["exec", "c", "-o", "json", "--", "echo", "hi"]) == 0
    assert calls == ["stream", "run"]
    assert '"stdout": "hi\\n"' in capsys.readouterr().out


def test_exec_json_says_a_timed_out_command_as_the_table_output_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The stream reports how the command was killed (-9); scripts reading `exit_code` got -9 where sandboxd's
    # run and the process's own exit status say 124, and nothing said it timed out.
    from agent_sandbox.cli.main import main
    from agent_sandbox_sdk.models import ExecutionResult

    _exec_json_against(monkeypatch, lambda: ExecutionResult(stdout="partial\n", exit_code=-9, timed_out=True))
    assert main(["exec", "c", "-o", "json", "--timeout", "1", "--", "sleep", "5"]) == 124
    out, err = capsys.readouterr()
    assert '"exit_code": 124' in out
    assert '"stdout": "partial\\n"' in out
    assert "timed out after 1 s" in err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (
            [],
            "error: the command timed out: the runtime's time limit ended it (300 s unless the runtime sets another; --timeout N sets one)",
        ),
        (["--timeout", "2.5"], "error: the command timed out after 2.5 s"),
    ],
    ids=["runtime-limit", "timeout-flag"],
)
@pytest.mark.parametrize("output", ["table", "json"])
def test_a_command_the_runtime_killed_for_its_own_limit_exits_124_with_one_line(
    flags: list[str],
    said: str,
    output: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`exec CLAIM -- sleep 400` without --timeout: the runtime's limit (300 s) ends it and the stream's exit
    event says `timed_out`. The message formatted --timeout, None then: a TypeError traceback and exit 1 (no
    JSON with -o json), where docs/sdk/python.md promises exit 124."""
    from types import SimpleNamespace

    from agent_sandbox.cli import exec_command
    from agent_sandbox.cli.main import main
    from agent_sandbox_sdk.models import CommandEvent, ExecutionResult

    class Stream:
        def __enter__(self) -> Stream:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def __iter__(self) -> Any:
            yield CommandEvent(type="stdout", data=b"partial\n")
            yield CommandEvent(type="exit", exit_code=-9, timed_out=True)

        def result(self) -> ExecutionResult:
            return ExecutionResult(stdout="partial\n", exit_code=-9, timed_out=True)

    commands = SimpleNamespace(stream=lambda command, **kw: Stream())
    monkeypatch.setattr(exec_command, "make_client", lambda *a, **k: None)
    monkeypatch.setattr(exec_command, "_handle", lambda *a: SimpleNamespace(commands=commands))
    assert main(["exec", "c", "-o", output, *flags, "--", "sleep", "400"]) == 124
    out, err = capsys.readouterr()
    assert err == said + "\n"
    if output == "json":
        assert '"exit_code": 124' in out
        assert '"timed_out": true' in out


def test_a_dev_clusters_router_wins_over_the_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--dev-cluster NAME` is NAME's kubeconfig *and* router (its help says so); $AGENT_SANDBOX_ROUTER_URL,
    set for another cluster, sent NAME's sandboxes to that router. --router-url still wins over both, and the
    environment's router serves a dev cluster that runs none."""
    import argparse

    from agent_sandbox.cli import connection

    routers = {"dev": "http://127.0.0.1:7001", "bare": None}
    monkeypatch.setattr(connection, "_dev_cluster", lambda name: ("kubeconfig", routers[name]))
    monkeypatch.setenv("AGENT_SANDBOX_ROUTER_URL", "http://127.0.0.1:7002")

    def url(router_url: str | None, dev_cluster: str | None) -> str | None:
        return connection._router_url(argparse.Namespace(router_url=router_url, dev_cluster=dev_cluster))

    assert url(None, "dev") == "http://127.0.0.1:7001"
    assert url("http://127.0.0.1:7003", "dev") == "http://127.0.0.1:7003"
    assert url(None, "bare") == "http://127.0.0.1:7002"
    assert url(None, None) == "http://127.0.0.1:7002"
