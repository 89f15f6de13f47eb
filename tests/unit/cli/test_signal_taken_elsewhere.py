"""A Ctrl-C or SIGTERM that a thread other than the main one took stops the sandbox commands while they wait
in a socket read: the main thread wakes every second to run the handler, which closes the SDK client - its
close() shuts the sockets down, waking the read (`cli/interruptible.py`). Until December 7 `logs -f` on a
silent pod never stopped, and `exec CLAIM -- sleep 600` stopped at the runtime's keep-alive line, 28 s later
(probe p3)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from agent_sandbox.cli.interruptible import run_interruptibly
from tests.helpers import signals_as_from_a_shell

pytestmark = pytest.mark.unit

#: The CLI with an SDK client whose every wait is a read of a socket nothing writes to (a silent pod, a quiet
#: command, a sandbox never Ready); its close() shuts the socket down, as the SDK's does. A thread that does
#: not block the signals takes the one sent once the read has begun; the main thread blocks them.
_SIGNAL_ELSEWHERE = """
import os, signal, socket, sys, threading
from types import SimpleNamespace
from agent_sandbox.cli import connection
from agent_sandbox.cli.main import main
from agent_sandbox_sdk.exceptions import SandboxClientClosedError

ours, theirs = socket.socketpair()
reading = threading.Event()

def blocked(*args, **kwargs):
    reading.set()
    ours.recv(1)  # b"" once close() shut the socket down
    raise SandboxClientClosedError("the connection was closed while the call was in flight (client closed)")

class Events:  # a stream of command events (a context manager), or of log text
    def __init__(self, *args, **kwargs): pass
    def __iter__(self): yield blocked()
    def __enter__(self): return self
    def __exit__(self, *exc): pass
    def result(self): blocked()

class Client:
    context_namespace = "demo"
    def __init__(self, *args, **kwargs): pass
    def close(self):
        sys.stderr.write("client closed\\n")
        ours.shutdown(socket.SHUT_RDWR)
    def get_sandbox(self, claim, namespace):
        return SimpleNamespace(
            follow_logs=Events, commands=SimpleNamespace(stream=Events), files=SimpleNamespace(write=blocked)
        )
    create_sandbox = blocked

connection.SandboxClient = Client

def take():
    reading.wait()
    os.kill(os.getpid(), int(sys.argv[1]))

threading.Thread(target=take, daemon=True).start()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
sys.exit(main(sys.argv[2:]))
"""

_ROUTER = ("--router-url", "http://127.0.0.1:9", "-n", "demo")


@pytest.mark.parametrize(
    "argv",
    [
        ("logs", "-f", "c1"),
        ("exec", "c1", "--", "sleep", "600"),
        ("exec", "c1", "-o", "json", "--", "sleep", "600"),
        ("create", "pool"),
        ("cp", "-", "c1:x"),
    ],
    ids=["logs -f", "exec", "exec -o json", "create", "cp"],
)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_another_thread_took_stops_the_wait(argv: tuple[str, ...], sig: signal.Signals) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SIGNAL_ELSEWHERE), str(int(sig)), *argv, *_ROUTER],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,  # a hang, before: nothing ever wakes the read
        check=False,
        preexec_fn=signals_as_from_a_shell,
    )
    # 130 / 143 as a shell reports them; the client closed (the stream's end kills the remote command, a create
    # rolls its claim back); neither a traceback nor the closed client's error said
    assert (done.returncode, done.stderr) == (128 + sig, "client closed\n"), done.stderr


def test_the_work_s_result_and_errors_reach_the_caller() -> None:
    assert run_interruptibly(lambda: threading.current_thread().name, []) == "agent-sandbox-command"
    with pytest.raises(BrokenPipeError):  # `| head`: the entry point's exit 141 needs to see it
        run_interruptibly(_broken_pipe, [])


def test_off_the_main_thread_the_work_runs_in_place() -> None:
    """No signal handler runs off the main thread: nothing to wake for, and no thread to add."""
    names: list[str] = []
    thread = threading.Thread(
        target=lambda: names.append(run_interruptibly(lambda: threading.current_thread().name, [])),
        name="embedding",
    )
    thread.start()
    thread.join()
    assert names == ["embedding"]


def _broken_pipe() -> None:
    raise BrokenPipeError


def test_programs_the_work_starts_can_be_stopped() -> None:
    """The worker's signal mask is what the programs it starts inherit (an exec credential plugin, `kubectl
    port-forward`): blocking Ctrl-C there kept them running after the CLI had stopped (a review, December 7)."""
    blocked = run_interruptibly(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, []), [])
    assert not blocked & {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    child = run_interruptibly(
        lambda: subprocess.run(
            ["sh", "-c", "grep SigBlk /proc/self/status"], capture_output=True, text=True, check=True
        ),
        [],
    )
    mask = int(child.stdout.split()[1], 16)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        assert mask & (1 << (sig - 1)) == 0, child.stdout
