"""SIGTERM - what `timeout`, CI runners and systemd send - stops the CLI the way Ctrl-C does. Until December 6
it killed `agent-sandbox create` mid-wait, and the auto-named claim stayed behind, its name never printed.

Either stops it within a second when a thread other than the main one took it (the CLI embedded in a process
with threads): until December 7 `logs -f` on a silent pod never stopped, and `exec CLAIM -- sleep 600` only at
the runtime's keep-alive line, 28 s on (cli/interruptible.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from tests.helpers import signals_as_from_a_shell, wait_for
from tests.integration.sdk.conftest import EXT, RUNTIME_IMAGE, apply_pool

from .test_exec_cp import CLI, cli

pytestmark = pytest.mark.integration


def _claims(cluster: DevCluster, namespace: str) -> list[str]:
    status, body = cluster.admin().request("GET", f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims")
    assert status == 200, body
    return [item["metadata"]["name"] for item in body["items"]]


def _waiting_create(
    cluster: DevCluster, namespace: str, preexec: Callable[[], object]
) -> subprocess.Popen[bytes]:
    """`agent-sandbox create` waiting for a sandbox that cannot come (a Pod no node takes, cold from the
    template), once its claim exists."""
    apply_pool(cluster, namespace, replicas=0, nodeSelector={"no-such-node": "x"})
    proc = subprocess.Popen(
        [CLI, "create", "--template", "tmpl", "-n", namespace, "--kubeconfig", str(cluster.kubeconfig),
         "--router-url", "http://127.0.0.1:9", "-o", "name"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=preexec,
    )  # fmt: skip
    try:
        wait_for(lambda: _claims(cluster, namespace), what="the claim the CLI creates")
    except BaseException:
        proc.kill()
        raise
    return proc


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"]
)
def test_a_signal_during_create_rolls_the_claim_back(
    cluster: DevCluster, namespace: str, controller: Started, sig: signal.Signals
) -> None:
    # pytest-xdist's workers ignore SIGINT (and under nohup SIGHUP), and an ignored signal is inherited: the
    # CLI then leaves it ignored (a shell's foreground job has the defaults, as restored here)
    proc = _waiting_create(cluster, namespace, signals_as_from_a_shell)
    try:
        time.sleep(0.5)  # into the wait for Ready
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 128 + sig
    assert wait_for(lambda: _claims(cluster, namespace) == [] or None, timeout=30)


def test_nohup_keeps_a_hangup_ignored(cluster: DevCluster, namespace: str, controller: Started) -> None:
    """`nohup agent-sandbox ...`: an ignored SIGHUP stays ignored (the CLI's own handler is for a terminal
    that goes away under an interactive session)."""
    proc = _waiting_create(
        cluster, namespace, lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)
    )  # nohup's
    try:
        proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert proc.poll() is None  # still waiting for its sandbox
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_for(lambda: _claims(cluster, namespace) == [] or None, timeout=30)


#: The CLI's main() (argv after the signal's number) in a process whose main thread blocks SIGINT and SIGTERM:
#: the signal - sent once a line arrives on stdin - is taken by another thread, as kill(2) may give it to any.
_SIGNAL_ELSEWHERE = """
import os, signal, sys, threading
from agent_sandbox.cli.main import main

def take():
    sys.stdin.readline()
    os.kill(os.getpid(), int(sys.argv[1]))

threading.Thread(target=take, daemon=True).start()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
sys.exit(main(sys.argv[2:]))
"""


def _stopped_elsewhere(cluster: DevCluster, router: str, sig: signal.Signals, *argv: str) -> tuple[int, str]:
    """Run the CLI's `argv` as `_SIGNAL_ELSEWHERE`, send `sig` once it printed its first line (it then waits in
    a read), and return its exit code and stderr."""
    common = ("--kubeconfig", str(cluster.kubeconfig), "--router-url", router)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGNAL_ELSEWHERE, str(int(sig)), argv[0], *common, *argv[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=signals_as_from_a_shell,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        assert proc.stdout.readline(), proc.communicate(timeout=30)[1]
        proc.stdin.write("now\n")
        proc.stdin.flush()
        # Stopped within 2 s here; the 20 s bound tells it from the hang (and the runtime's 30 s keep-alive).
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, stderr


def test_a_signal_another_thread_took_stops_logs_follow_and_exec(
    cluster: DevCluster, namespace: str, controller: Started, router: str
) -> None:
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    ns = ("-n", namespace)
    created = cli(cluster, router, "create", "pool", *ns, "--name", "sb", "-o", "name")
    assert created.returncode == 0, created.stderr

    # The runtime's last log line, then nothing: the follow waits in a read of the API server's stream.
    code, stderr = _stopped_elsewhere(cluster, router, signal.SIGINT, "logs", "-f", "sb", "--tail", "1", *ns)
    assert (code, stderr) == (130, "")

    # A command that prints, then sleeps; the sleep is known by a duration no other test runs.
    nap = f"6{os.getpid() % 1000:03d}.5"
    script = f"echo started; exec sleep {nap}"
    code, stderr = _stopped_elsewhere(
        cluster, router, signal.SIGTERM, "exec", "sb", *ns, "--", "sh", "-c", script
    )
    assert (code, stderr) == (143, "")

    def gone() -> bool:
        listed = cli(cluster, router, "exec", "sb", *ns, "--", "ps", "-eo", "args")
        assert listed.returncode == 0, listed.stderr
        return f"sleep {nap}" not in listed.stdout

    # the remote command ends with the stream, as when the main thread takes the signal
    assert wait_for(gone, what="the remote sleep to end")


def test_a_signal_another_thread_took_during_create_rolls_the_claim_back(
    cluster: DevCluster, namespace: str, controller: Started
) -> None:
    apply_pool(cluster, namespace, replicas=0, nodeSelector={"no-such-node": "x"})
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGNAL_ELSEWHERE, str(int(signal.SIGTERM)), "create", "--template", "tmpl",
         "-n", namespace, "--kubeconfig", str(cluster.kubeconfig), "--router-url", "http://127.0.0.1:9",
         "-o", "name"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=signals_as_from_a_shell,
    )  # fmt: skip
    try:
        wait_for(lambda: _claims(cluster, namespace), what="the claim the CLI creates")
        _, stderr = proc.communicate("now\n", timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, stderr) == (143, "")
    assert wait_for(lambda: _claims(cluster, namespace) == [] or None, timeout=30)
