"""A sandbox command's work in a worker thread, so that Ctrl-C and SIGTERM stop it within a second wherever the
kernel delivered them.

Why: Python runs a signal's handler only in the main thread, between two bytecodes. A process-directed signal
(kill(2), a terminal's Ctrl-C) may be taken by any thread that does not block it; when that is not the main
thread (a CLI embedded in a process with threads, a spinner thread), the main thread - blocked in a socket read
of the SDK - is not woken, and the handler waits for the read to return: `logs -f` on a silent pod never
stopped, `exec CLAIM -- sleep 600` stopped only at the runtime's keep-alive line 28 s later (December 7).

What: the work runs in a worker thread; the main thread waits for it in one-second slices, so a pending
handler runs within a second. The handler's KeyboardInterrupt (or `main`'s SIGTERM/SIGHUP one) then closes the SDK clients the
work uses - `SandboxClient.close()` shuts their sockets down, which wakes the blocked read: the legacy
runtime kills a streamed command whose connection ends, and a create in flight deletes its auto-named claim -
and, once the worker is done with that clean-up (a second signal stops waiting at once), goes on to `main`'s
exit 130 / 143. What the worker raises then (the client-closed error) is not reported: the interruption is.
Work that closing a client does not wake - a read of standard input (`cp - CLAIM:PATH` from a pipe still open),
a write to an output nobody reads (`exec ... | less`) - is given `_CLEANUP_GRACE` and then left to the
process's exit: the first signal stopped those at once on the main thread, but until December 7 (a review) it
was waited for here until a second one, which then aborted the interpreter (`Fatal Python error:
_enter_buffered_busy`: its shutdown closed the standard input the worker held).
`proxy` and `exec -i/-t` keep the main thread (an asyncio loop, SIGWINCH handling) and wake themselves.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from .exit_codes import Handler

__all__ = ["add_closer", "interruptible", "run_interruptibly"]

T = TypeVar("T")

#: How often the waiting main thread looks for a signal another thread took.
_WAKE_EVERY = 1.0
#: Where `make_client` records how to close the clients a command made (see `interruptible`).
_CLOSERS = "interrupt_closers"
#: How long an interrupted command's work has, once its clients are closed, to end (a create's rollback DELETE
#: takes well under a second; a worker blocked in a standard stream never ends by itself).
_CLEANUP_GRACE = 5.0


def add_closer(args: argparse.Namespace, close: Callable[[], None]) -> None:
    """Close with `close` (a client's) when the command running with `args` is interrupted."""
    closers: list[Callable[[], None]] | None = getattr(args, _CLOSERS, None)
    if closers is not None:
        closers.append(close)


def interruptible(handler: Handler) -> Handler:
    """`handler` run by `run_interruptibly`, closing the clients it makes (`make_client` -> `add_closer`)."""

    def run(args: argparse.Namespace) -> int:
        closers: list[Callable[[], None]] = []
        setattr(args, _CLOSERS, closers)
        return run_interruptibly(lambda: handler(args), closers)

    return run


def run_interruptibly(work: Callable[[], T], closers: Sequence[Callable[[], None]]) -> T:
    """`work()`'s result (or exception), computed in a worker thread while this one waits awake.

    An interruption of the wait calls every closer (the list is read then: the work may add to it), waits for
    the worker to finish, and is raised. Called off the main thread, `work()` just runs: no signal handler
    runs there to be waited for."""
    if threading.current_thread() is not threading.main_thread():
        return work()
    done = threading.Event()
    outcome: list[tuple[bool, object]] = []

    def work_in_worker() -> None:
        # The worker does not block the stopping signals: the programs it starts (an exec credential plugin,
        # `kubectl port-forward`) would inherit the mask and outlive a Ctrl-C. Linux offers a process-directed
        # signal to the main thread first (it does not block them), whose handler runs at once; when another
        # thread takes it all the same, the one-second wake does.
        # Held while the worker lives: a worker left blocked in one of them (`_CLEANUP_GRACE`) keeps the
        # interpreter's shutdown from closing it under its lock, which aborts the process.
        streams = (sys.stdin, sys.stdout, sys.stderr)  # noqa: F841
        try:
            outcome.append((True, work()))
        except BaseException as err:  # handed to the main thread, which raises it
            outcome.append((False, err))
        finally:
            done.set()

    # A daemon: a second signal exits without waiting for a worker still cleaning up.
    worker = threading.Thread(target=work_in_worker, name="agent-sandbox-command", daemon=True)
    try:
        # In the `try`: the worker may be in its read before start() returns, and the signal land in start().
        worker.start()
        _wait(done, worker)
    except BaseException:  # KeyboardInterrupt: Ctrl-C, or `main`'s SIGTERM / SIGHUP
        for close in list(closers):
            with contextlib.suppress(Exception):  # best effort: the interruption is what is reported
                close()
        # The worker's own clean-up (a create's rollback), for at most `_CLEANUP_GRACE`; a second signal ends the
        # wait at once.
        _wait(done, worker, _CLEANUP_GRACE)
        raise
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]


def _wait(done: threading.Event, worker: threading.Thread, limit: float | None = None) -> None:
    """Until `done`, awake every second (a signal's handler runs in this, the main, thread when it wakes); or
    until the worker is seen not running a second on (a signal in start() before the thread was made); or for
    at most `limit` seconds."""
    deadline = None if limit is None else time.monotonic() + limit
    while True:
        wait = _WAKE_EVERY if deadline is None else min(_WAKE_EVERY, deadline - time.monotonic())
        if wait <= 0 or done.wait(wait) or not worker.is_alive():
            return
