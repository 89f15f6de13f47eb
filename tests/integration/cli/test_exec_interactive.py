"""`agent-sandbox exec -i` / `-t` as users run them (`kubectl exec -it`): piped standard input, and an
interactive shell in a real pseudo-terminal (the console script under `pty.fork`), with a resize. Through
the router's h2c pass-through to the runtime's sandboxd gRPC process API."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import termios
import time

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from tests.integration.sdk.conftest import RUNTIME_IMAGE, apply_pool

from .test_exec_cp import CLI, cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def sandbox(cluster: DevCluster, namespace: str, controller: Started, router: str) -> str:
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    created = cli(cluster, router, "create", "pool", "-n", namespace, "--name", "sb")
    assert created.returncode == 0, created.stderr
    return namespace


def test_piped_stdin_reaches_the_command(cluster: DevCluster, router: str, sandbox: str) -> None:
    out = cli(cluster, router, "exec", "-i", "-n", sandbox, "sb", "--", "cat", stdin="line one\nline two\n")
    assert (out.returncode, out.stdout, out.stderr) == (0, "line one\nline two\n", "")
    script = "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))\n"
    out = cli(cluster, router, "exec", "-i", "-n", sandbox, "sb", "--", "sh", "-c", f"python3 -c '{script}'",
              stdin="1 2 3 4\n")  # fmt: skip
    assert (out.returncode, out.stdout) == (0, "10\n")
    # A command that stops reading early still ends with its own status.
    out = cli(cluster, router, "exec", "-i", "-n", sandbox, "sb", "--", "sh", "-c", "head -n 1; exit 3",
              stdin="first\n" + "more\n" * 50_000)  # fmt: skip
    assert (out.returncode, out.stdout) == (3, "first\n")
    # Without -i standard input is not read (as kubectl exec).
    out = cli(cluster, router, "exec", "-n", sandbox, "sb", "--", "cat", stdin="ignored\n")
    assert (out.returncode, out.stdout) == (0, "")
    # -t without a terminal: a warning, and the command runs without one.
    out = cli(cluster, router, "exec", "-i", "-t", "-n", sandbox, "sb", "--", "sh", "-c", "cat; tty || true",
              stdin="x\n")  # fmt: skip
    assert out.returncode == 0
    assert out.stdout == "x\nnot a tty\n"
    assert "warning: -t ignored" in out.stderr
    # -t alone off a terminal: nothing is attached to the command's stdin, which ends at once (until December 6
    # `echo abc | agent-sandbox exec -t sb -- cat` hung forever)
    out = cli(cluster, router, "exec", "-t", "-n", sandbox, "sb", "--", "cat", stdin="abc\n")
    assert (out.returncode, out.stdout) == (0, "")
    assert "warning: -t ignored" in out.stderr
    # kubectl's shape without `--`: refused, where it used to run `-n NS ls` in the default namespace's `sb`
    out = cli(cluster, router, "exec", "sb", "-n", sandbox, "ls")
    assert out.returncode == 2
    assert "options after the claim need -- before the command" in out.stderr
    bad = cli(cluster, router, "exec", "-i", "-o", "json", "-n", sandbox, "sb", "--", "true")
    assert bad.returncode == 2
    assert "cannot be combined with -i / -t" in bad.stderr


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _read_until(fd: int, needle: bytes, seen: bytearray, deadline: float) -> None:
    while needle not in seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{needle!r} never arrived; the terminal showed {bytes(seen)!r}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed its terminal
                chunk = b""
            assert chunk, f"the terminal closed before {needle!r}; it showed {bytes(seen)!r}"
            seen += chunk


def test_an_interactive_shell_in_a_terminal(cluster: DevCluster, router: str, sandbox: str) -> None:
    """`exec -it sb -- sh` from a terminal: the remote shell has a TTY of the local terminal's size, follows a
    resize, gets keys raw (Ctrl-C interrupts the remote command, not the CLI), and its exit status is ours."""
    argv = [CLI, "exec", "-it", "--kubeconfig", str(cluster.kubeconfig), "--router-url", router,
            "-n", sandbox, "sb", "--", "sh"]  # fmt: skip
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on the pseudo-terminal's other end
        os.execv(CLI, argv)
    try:
        _set_size(fd, 33, 101)
        seen = bytearray()
        deadline = time.monotonic() + 60
        os.write(fd, b"echo tty=$(tty | cut -c1-8) size=$(stty size)\n")
        _read_until(fd, b"tty=/dev/pts size=33 101", seen, deadline)
        _set_size(fd, 40, 120)  # the kernel sends the CLI SIGWINCH
        os.kill(
            pid, signal.SIGWINCH
        )  # and so does this test, in case the child's session was not the foreground
        time.sleep(0.5)
        os.write(fd, b"echo now=$(stty size)\n")
        _read_until(fd, b"now=40 120", seen, deadline)
        os.write(fd, b"sleep 30; echo slept\n")
        time.sleep(0.5)
        os.write(fd, b"\x03")  # Ctrl-C: interrupts the remote sleep; the CLI keeps running
        os.write(fd, b"echo after=$((6*7))\n")
        _read_until(fd, b"after=42", seen, deadline)
        assert (
            b"\nslept" not in seen
        )  # the sleep was interrupted (its command line, echoed, has "echo slept")
        os.write(fd, b"exit 7\n")
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 7, bytes(seen)
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


def test_a_terminal_without_stdin_leaves_ctrl_c_to_the_cli(
    cluster: DevCluster, router: str, sandbox: str
) -> None:
    """`exec -t` alone (as kubectl): the command gets a TTY, the local terminal stays cooked - nothing would
    read the keys - so Ctrl-C stops the CLI (130) instead of vanishing into a raw terminal."""
    argv = [CLI, "exec", "-t", "--kubeconfig", str(cluster.kubeconfig), "--router-url", router,
            "-n", sandbox, "sb", "--", "sh", "-c", "echo tty=$(tty | cut -c1-8); sleep 30"]  # fmt: skip
    pid, fd = pty.fork()
    if pid == 0:
        # As in a terminal session: a test run in the background (CI) inherits SIGINT ignored, and so would the CLI.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execv(CLI, argv)
    try:
        seen = bytearray()
        _read_until(fd, b"tty=/dev/pts", seen, time.monotonic() + 60)
        os.write(fd, b"\x03")  # the terminal driver turns it into SIGINT for the CLI
        started = time.monotonic()
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 130, bytes(seen)
        assert time.monotonic() - started < 10
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


def test_a_hangup_restores_the_terminal(cluster: DevCluster, router: str, sandbox: str) -> None:
    """SIGHUP (a terminal window closed, an SSH session dropped) stops `exec -it` as Ctrl-C stops the CLI:
    129, and the terminal back in its cooked mode. Until December 6 the signal killed the CLI with the
    terminal left raw (no echo, no line editing)."""
    argv = [CLI, "exec", "-it", "--kubeconfig", str(cluster.kubeconfig), "--router-url", router,
            "-n", sandbox, "sb", "--", "sh"]  # fmt: skip
    pid, fd = pty.fork()
    if pid == 0:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a test run under nohup would pass it on ignored
        os.execv(CLI, argv)
    try:
        seen = bytearray()
        os.write(fd, b"echo ready=$((6*7))\n")
        _read_until(fd, b"ready=42", seen, time.monotonic() + 60)
        assert not termios.tcgetattr(fd)[3] & termios.ICANON  # raw while the session runs
        os.kill(pid, signal.SIGHUP)
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 129, bytes(seen)
        lflag = termios.tcgetattr(fd)[3]
        assert lflag & termios.ICANON
        assert lflag & termios.ECHO
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
