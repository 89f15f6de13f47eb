"""A sandbox command interrupted while its worker thread is blocked in a standard stream - a read of a standard
input still open (`cp - CLAIM:PATH` from a pipe nothing writes to yet), a write to an output nobody reads
(`exec ... | less`) - exits 130 / 143 after `_CLEANUP_GRACE`: closing the SDK client does not wake such a
read or write. Until December 7 (review of the worker thread, `cli/interruptible.py`) the first signal was
ignored there - on the main thread it had stopped them at once - and a second one aborted the interpreter
(`Fatal Python error: _enter_buffered_busy`: its shutdown closed the standard input the worker held)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.helpers import signals_as_from_a_shell

pytestmark = pytest.mark.unit

#: `cp - c1:x` or `logs c1` with an SDK client whose upload reads its source and whose log is endless; the
#: signal comes from outside once the worker is in the standard stream.
_BLOCKED_IN_A_STREAM = """
import sys
from types import SimpleNamespace
from agent_sandbox.cli import connection, interruptible
from agent_sandbox.cli.main import main

interruptible._CLEANUP_GRACE = 1.0

def upload(path, source, **kwargs):
    sys.stderr.write("in the stream\\n"); sys.stderr.flush()
    source.read()  # standard input, held open by the test

def log(*args, **kwargs):
    sys.stderr.write("in the stream\\n"); sys.stderr.flush()
    while True:
        yield "x" * 65536  # to a standard output the test never reads

class Client:
    context_namespace = "demo"
    def __init__(self, *args, **kwargs): pass
    def close(self): pass
    def get_sandbox(self, claim, namespace):
        return SimpleNamespace(files=SimpleNamespace(write=upload), logs=log, follow_logs=log)

connection.SandboxClient = Client
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "argv", [("cp", "-", "c1:x"), ("logs", "-f", "c1")], ids=["cp from standard input", "logs to a full pipe"]
)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_a_worker_blocked_in_a_standard_stream(
    argv: tuple[str, ...], sig: signal.Signals
) -> None:
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_BLOCKED_IN_A_STREAM),
            *argv,
            "--router-url",
            "http://127.0.0.1:9",
        ],
        stdin=stdin_r,
        stdout=stdout_w,
        stderr=subprocess.PIPE,
        preexec_fn=signals_as_from_a_shell,
    )
    os.close(stdin_r)
    os.close(stdout_w)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == b"in the stream\n"
        time.sleep(0.5)  # in the read (or the write's full pipe)
        proc.send_signal(sig)
        try:
            rc = proc.wait(timeout=10)  # a hang, before: only a second signal ended it
        except subprocess.TimeoutExpired:
            proc.send_signal(sig)
            rc = proc.wait(timeout=10)
            pytest.fail(f"the first signal was not enough; the second: exit {rc}, {proc.stderr.read()!r}")
        assert (rc, proc.stderr.read()) == (128 + sig, b"")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(stdin_w)
        os.close(stdout_r)
        proc.stderr.close()  # type: ignore[union-attr]
