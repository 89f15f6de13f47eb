"""The program named in the CLI's hints runs when pasted (agent_sandbox/invocation.py).

`make install` puts the CLI in `.venv/bin/`, not on PATH: `dev up` printed `stop it: agent-sandbox dev down
--name X`, which a shell answers with "command not found" (until December 7).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_sandbox import invocation
from agent_sandbox.cli.main import main
from agent_sandbox.invocation import cli_command, cli_program

pytestmark = pytest.mark.unit


def _script(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "agent-sandbox"
    path.write_text('#!/bin/sh\necho ran "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `.venv/bin` with an `agent-sandbox` script and this Python's stand-in; cwd is its parent; no
    `agent-sandbox` on PATH."""
    bin_dir = tmp_path / "checkout" / ".venv" / "bin"
    _script(bin_dir)
    monkeypatch.chdir(tmp_path / "checkout")
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    return bin_dir


def _runs(hint: str, env_path: str) -> str:
    done = subprocess.run(
        ["/bin/sh", "-c", hint],
        env={"PATH": env_path},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_invoked_by_a_path_the_hint_names_that_path_as_typed(
    venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", [".venv/bin/agent-sandbox", "dev", "up"])
    hint = cli_command("dev down --name x")
    assert hint == ".venv/bin/agent-sandbox dev down --name x"
    assert _runs(hint, os.environ["PATH"]) == "ran dev down --name x\n"


def test_on_path_it_is_the_bare_name(venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(venv / "agent-sandbox"), "dev", "up"])  # as the kernel passes it
    monkeypatch.setenv("PATH", str(venv))
    assert cli_command("dev down --name x") == "agent-sandbox dev down --name x"


def test_another_install_on_path_is_not_the_one_that_ran(
    venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _script(tmp_path / "other")
    monkeypatch.setenv("PATH", str(tmp_path / "other"))
    monkeypatch.setattr(sys, "argv", [".venv/bin/agent-sandbox"])
    assert cli_program() == ".venv/bin/agent-sandbox"


def test_run_as_a_module_it_is_the_script_next_to_this_python(
    venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["/somewhere/benchmarks/__main__.py"])
    assert cli_program() == str(venv / "agent-sandbox")


def test_a_path_with_a_space_is_quoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "my venv" / "bin"
    _script(bin_dir)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "argv", [str(bin_dir / "agent-sandbox")])
    hint = cli_command("dev down --name x")
    assert _runs(hint, str(tmp_path / "empty")) == "ran dev down --name x\n"


def test_a_name_found_nowhere_stays_the_bare_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(sys, "argv", ["-c"])
    assert cli_program() == invocation.PROGRAM


def test_the_cli_hints_use_it(
    venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENT_SANDBOX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", [".venv/bin/agent-sandbox"])
    assert main(["dev", "kubeconfig", "--name", "nope"]) != 0
    assert "start one with `.venv/bin/agent-sandbox dev up`" in capsys.readouterr().err
    from agent_sandbox.devcluster.cluster import down_command

    assert (
        down_command("x")
        == f"AGENT_SANDBOX_CACHE={tmp_path / 'cache'} .venv/bin/agent-sandbox dev down --name x"
    )
