"""The CLI against a real cluster, router and runtime (December 7): exec's words reach the program as given,
with and without -i; a closed stdout / stderr; suspend's --timeout past 30 days refused before the change;
`logs --tail -1`; the exit codes and messages of `cp` and `proxy`."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from tests.integration.cli.test_exec_cp import CLI, cli
from tests.integration.sdk.conftest import RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _shell(
    cluster: DevCluster, router: str, argv: list[str], redirect: str
) -> subprocess.CompletedProcess[str]:
    """The CLI's `argv` run by bash with `redirect` (`>&-`, `2>&-`: started without stdout / stderr)."""
    common = ["--kubeconfig", str(cluster.kubeconfig), "--router-url", router]
    line = shlex.join([CLI, argv[0], *common, *argv[1:]])
    return subprocess.run(
        ["bash", "-c", f"{line} {redirect}"], capture_output=True, text=True, timeout=120, check=False
    )


def test_cli_words_closed_streams_and_exit_codes(
    cluster: DevCluster, namespace: str, controller: Started, router: str, tmp_path: Path
) -> None:
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    created = cli(cluster, router, "create", "pool", *ns, "--name", "sb")
    assert created.returncode == 0, created.stderr

    # exec: one word with a space is one program, with and without -i (it ran `./my` until December 7).
    script = tmp_path / "my prog.sh"
    script.write_text('#!/bin/sh\necho ran "$0"\n')
    script.chmod(0o755)
    assert cli(cluster, router, "cp", str(script), "sb:my prog.sh", *ns).returncode == 0
    for flags in ((), ("-i",)):
        out = cli(cluster, router, "exec", "sb", *ns, *flags, "--", "./my prog.sh", stdin="")
        assert (out.returncode, out.stdout) == (0, "ran ./my prog.sh\n"), (flags, out.stderr)
        # A word holding shell code is a program's name, never run as code (-i ran both commands).
        out = cli(cluster, router, "exec", "sb", *ns, *flags, "--", "echo a; echo b", stdin="")
        assert out.returncode != 0, flags
        assert "a\n" not in out.stdout, flags
        out = cli(cluster, router, "exec", "sb", *ns, *flags, "--", "echo", "a; echo b", stdin="")
        assert (out.returncode, out.stdout) == (0, "a; echo b\n"), (flags, out.stderr)

    # A closed stdout: one error line, exit 1 (until December 7 an AttributeError traceback).
    for argv in (["list", *ns], ["exec", "sb", *ns, "--", "echo", "hi"]):
        done = _shell(cluster, router, argv, ">&-")
        assert (done.returncode, done.stderr) == (1, "error: cannot write to standard output\n"), argv
    # A closed stderr: the command's stderr dropped, its exit code kept (it was 1).
    for code in (0, 3):
        argv = ["exec", "sb", *ns, "--", "sh", "-c", f"echo o; echo e >&2; exit {code}"]
        done = _shell(cluster, router, argv, "2>&-")
        assert (done.returncode, done.stdout) == (code, "o\n")

    # suspend/resume --timeout past 30 days: refused before the change (it suspended, then an OverflowError).
    for command in ("suspend", "resume"):
        refused = cli(cluster, router, command, "sb", *ns, "--timeout", "1e10")
        assert refused.returncode == 2, refused.stderr
        assert (
            "argument --timeout: must be a positive number of seconds up to 2592000 (30 days)"
            in refused.stderr
        )
    got = cli(cluster, router, "get", "sb", *ns, "-o", "json")
    assert json.loads(got.stdout)["suspended"] is False

    # logs --tail -1: every line, as kubectl's (an HTTP 422 until December 7).
    every = cli(cluster, router, "logs", "sb", "--tail", "-1", *ns)
    assert every.returncode == 0, every.stderr
    assert every.stdout == cli(cluster, router, "logs", "sb", *ns).stdout

    # cp: a file not there is not found, exit 3; a file onto a directory in the sandbox, exit 2.
    missing = cli(cluster, router, "cp", "sb:nope", str(tmp_path / "x"), *ns)
    assert (missing.returncode, missing.stderr) == (3, "error: sb:nope: no such file or directory\n")
    made = cli(cluster, router, "exec", "sb", *ns, "--", "mkdir", "-p", "dd/f1")
    assert made.returncode == 0, made.stderr
    local = tmp_path / "f1"
    local.write_text("x")
    onto = cli(cluster, router, "cp", str(local), "sb:dd", *ns)
    assert (onto.returncode, onto.stderr) == (2, "error: sb:dd/f1: is a directory\n")

    # proxy: an address that does not resolve, in the resolver's words ("Unknown error -2" until December 7).
    proxy = cli(cluster, router, "proxy", "sb", "8888", "--address", "nonsense.invalid", *ns)
    assert proxy.returncode == 1
    assert proxy.stderr.startswith("error: cannot listen on nonsense.invalid:0: "), proxy.stderr
    assert "Unknown error" not in proxy.stderr
