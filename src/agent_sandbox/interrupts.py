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
"""

from __future__ import annotations

import asyncio
from typing import NoReturn

__all__ = ["raise_where_safe"]


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
