"""`agent-sandbox exec` and `cp` when the router (or the sandbox) stops answering: a bounded wait and one clear
error, never a hang; and a command that is quiet for longer than that bound still runs to its end, kept alive
by the runtime's keep-alive lines.

A real router that is stopped (SIGSTOP: the kernel still accepts its connections, nothing answers) stands for a
hung router; the runtimes are the real ones the local runner serves. The SDK's idle limit for command streams
(90 s) is lowered to 2 s so that this runs in seconds.

Until December 6 `exec` without --timeout waited for good (`-o json` up to a day), and `cp` waited out its
--timeout twice before saying anything (the listing that looks at the destination swallowed the failure).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.cli.main import main
from agent_sandbox.cli.sandboxes import EXIT_ERROR
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import _commands
from tests.integration.sdk.conftest import EXT, RUNTIME_IMAGE, router_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: The idle limit of command streams in these tests (the SDK's default is 90 s).
IDLE = 2.0


@pytest.fixture(autouse=True)
def short_idle_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_commands, "STREAM_IDLE_TIMEOUT", IDLE, raising=False)


def runtime_pool(cluster: DevCluster, namespace: str, name: str, *runtime_args: str) -> None:
    """A SandboxTemplate and a one-member warm pool `name` of runtimes started with `runtime_args`."""
    admin = cluster.admin()
    spec = {"containers": [{"name": "runtime", "image": RUNTIME_IMAGE, "args": list(runtime_args)}]}
    for plural, body in (
        ("sandboxtemplates", {"apiVersion": EXT, "kind": "SandboxTemplate", "metadata": {"name": name},
                              "spec": {"podTemplate": {"spec": spec}}}),
        ("sandboxwarmpools", {"apiVersion": EXT, "kind": "SandboxWarmPool", "metadata": {"name": name},
                              "spec": {"replicas": 1, "sandboxTemplateRef": {"name": name}}}),
    ):  # fmt: skip
        status, out = admin.request("POST", f"/apis/{EXT}/namespaces/{namespace}/{plural}", body)
        assert status == 201, out


def run_cli(argv: list[str], within: float) -> tuple[int | None, float]:
    """`agent-sandbox ARGV` in this process: (its exit code, or None if it had not ended within `within` s;
    seconds taken). A CLI that hangs is left behind in a daemon thread (it ends when the router is resumed)."""
    done: dict[str, Any] = {}

    def target() -> None:
        done["code"] = main(argv)

    start = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(within)
    return done.get("code"), time.monotonic() - start


def common(cluster: DevCluster, router: str, namespace: str) -> list[str]:
    return ["--kubeconfig", str(cluster.kubeconfig), "--router-url", router, "-n", namespace]


@pytest.fixture
def stopped_router(cluster: DevCluster) -> Iterator[str]:
    """A router of its own, Ready, then stopped (SIGSTOP); its URL. Resumed before it is stopped for good."""
    port = cluster.reserve_port("cli_stopped_router_http")
    with router_process(cluster, "cli_stopped_router", f"127.0.0.1:{port}"):
        pid = [s.pid for s in cluster.state.started if s.name == "cli-stopped-router"][-1]
        os.kill(pid, signal.SIGSTOP)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            os.kill(pid, signal.SIGCONT)


@pytest.fixture
def claim(
    cluster: DevCluster, namespace: str, controller: Started, router: str, capfd: pytest.CaptureFixture[str]
) -> str:
    """A Ready claim `sb` of a runtime that keeps quiet streams alive every 0.5 s (default 30 s)."""
    runtime_pool(cluster, namespace, "quiet", "--stream-keepalive=0.5")
    code, _ = run_cli(["create", "quiet", "--name", "sb", *common(cluster, router, namespace)], 120)
    assert code == 0, capfd.readouterr().err
    capfd.readouterr()
    return "sb"


def test_exec_through_a_router_that_never_answers_ends_after_the_idle_limit(
    cluster: DevCluster, namespace: str, claim: str, stopped_router: str, capfd: pytest.CaptureFixture[str]
) -> None:
    for output in ([], ["-o", "json"]):
        argv = ["exec", *common(cluster, stopped_router, namespace), *output, claim, "--", "true"]
        code, took = run_cli(argv, 30)
        err = capfd.readouterr().err
        assert code == EXIT_ERROR, (output, code, err)
        assert IDLE <= took < IDLE + 10, (output, took)
        assert err.startswith("error: "), err
        assert err.count("\n") == 1, err
        assert f"no answer from the router or the sandbox for {IDLE:g} s" in err, err


def test_cp_through_a_router_that_never_answers_waits_its_timeout_once(
    cluster: DevCluster,
    namespace: str,
    claim: str,
    stopped_router: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    local = tmp_path / "a.txt"
    local.write_text("x")
    for src, dst in ((f"{claim}:a.txt", "-"), (str(local), f"{claim}:dir")):
        argv = ["cp", *common(cluster, stopped_router, namespace), "--timeout", "3", src, dst]
        code, took = run_cli(argv, 30)
        err = capfd.readouterr().err
        assert code == EXIT_ERROR, (src, code, err)
        assert 3 <= took < 5.5, (src, took, err)  # one --timeout, not two
        assert "timed out" in err, err


def test_a_quiet_command_outlives_the_idle_limit_by_the_runtimes_keep_alive_lines(
    cluster: DevCluster, namespace: str, claim: str, router: str, capfd: pytest.CaptureFixture[str]
) -> None:
    quiet = ["sh", "-c", f"echo before; sleep {IDLE * 2.5:g}; echo after"]
    code, _ = run_cli(["exec", *common(cluster, router, namespace), claim, "--", *quiet], 60)
    out = capfd.readouterr()
    assert (code, out.out) == (0, "before\nafter\n"), out.err
    code, _ = run_cli(["exec", *common(cluster, router, namespace), "-o", "json", claim, "--", *quiet], 60)
    out = capfd.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out) == {
        "stdout": "before\nafter\n",
        "stderr": "",
        "exit_code": 0,
        "timed_out": False,
    }


def test_without_keep_alive_lines_a_quiet_command_meets_the_idle_limit(
    cluster: DevCluster, namespace: str, controller: Started, router: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """The control: the same quiet command on a runtime that sends none (`--stream-keepalive=0`) is cut after
    the idle limit, so it is the keep-alive lines that carry a quiet command past it."""
    runtime_pool(cluster, namespace, "silent", "--stream-keepalive=0")
    ns = common(cluster, router, namespace)
    code, _ = run_cli(["create", "silent", "--name", "mute", *ns], 120)
    assert code == 0, capfd.readouterr().err
    capfd.readouterr()
    code, took = run_cli(["exec", *ns, "mute", "--", "sh", "-c", f"echo before; sleep {IDLE * 2.5:g}"], 60)
    out = capfd.readouterr()
    # Cut by this idle limit, or by the router's, the same (X-Sandbox-Timeout): whichever notices first.
    assert (code, out.out) == (EXIT_ERROR, "before\n"), out.err
    assert IDLE <= took < IDLE * 2.5, took
