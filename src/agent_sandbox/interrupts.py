"""Raise Ctrl-C's KeyboardInterrupt from a signal handler without wedging a running asyncio loop.

Why: the CLI and the benchmarks turn SIGTERM and SIGHUP into a KeyboardInterrupt so that their `finally`
blocks run. A handler installed with `signal.signal` runs between two bytecodes of whatever the main thread is
doing; when that is an asyncio loop, the exception can land inside the loop's own bookkeeping - after a
callback was taken off the ready queue and before it ran (CPython bpo-39622). When that callback is a task's
wake-up, the task is neither running nor waiting on anything: `asyncio.run`'s clean-up cancels it and waits
for it forever. A benchmark killed that way hung instead of tearing its cluster down (CI, December 6).

What: `raise_where_safe` raises at once in plain code, and, while an asyncio loop runs on this thread, between
two of its callbacks instead - the loop ends, and `asyncio.run` cancels its tasks and runs their `finally`
blocks, as Ctrl-C does (`asyncio.run` handles SIGINT the same way, but only SIGINT).

The long-running processes (controller, router, runtime, dev runner) stop the other way round: the first
SIGTERM/SIGINT starts a drain, a second one exits at once with status 1, as Go's signal handling and
controller-runtime do (`handle_stop_signals`, `exit_now`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable
from typing import NoReturn

__all__ = ["STOP_SIGNALS", "exit_now", "handle_stop_signals", "raise_where_safe"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _raise(interrupt: BaseException) -> NoReturn:
    raise interrupt


def raise_where_safe(interrupt: BaseException) -> None:
    """Raise `interrupt` from a signal handler: here, or as the next callback of this thread's running loop.

    A loop busy in one long callback sees it when that callback returns; a second signal that the caller turns
    into `SIG_DFL` still ends the process at once.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise interrupt from None
    # Thread-safe: it also wakes the loop from its selector wait, which the signal itself does not.
    loop.call_soon_threadsafe(_raise, interrupt)


def exit_now(code: int) -> NoReturn:
    """Exit with `code` at once, after flushing the log and the standard streams, without the interpreter's
    teardown (its garbage collection and module clean-up take 0.5-1.5 s on a loaded node; a second signal, or a
    process that has already stopped everything itself, needs none of it)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def handle_stop_signals(
    first: Callable[[str], None],
    again: Callable[[str], None],
    *,
    signals: Iterable[signal.Signals] = STOP_SIGNALS,
) -> None:
    """On the running loop, call ``first(name)`` for the first of ``signals`` (start the drain) and, for any
    later one, ``again(name)`` (kill what nothing would stop after the exit) followed by :func:`exit_now` with
    status 1. Platforms without loop signal handlers keep their default handling."""
    loop = asyncio.get_running_loop()
    received = False

    def on_signal(signum: int) -> None:
        nonlocal received
        name = signal.Signals(signum).name
        if received:
            again(name)
            exit_now(1)
        received = True
        first(name)

    for sig in signals:
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal, sig)
