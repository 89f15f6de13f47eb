"""What a slow stop is waiting for: the stacks of every thread and every asyncio task, logged once.

Why: every step of the manager's stop is bounded, yet a stop can still outlast the kubelet's grace (30 s by
default) when something below those bounds waits (CI, December 7: a controller not stopped 20 s after
SIGTERM, with nothing in its log to say where it was). The process is then SIGKILLed, and the log is all that
is left. This report puts in it where each thread and each task was waiting, in time for the kubelet's kill.

How: a daemon `threading.Timer`, so it fires even when the event loop itself is blocked. From the timer thread
it logs every thread's Python stack (`sys._current_frames`); then, on the loop (if the loop still turns), every
pending task's await chain - one line per coroutine it is suspended in, down to the innermost future. Both go
out as single log records (the stacks in a `stacks` field), so JSON logs stay one object per line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import traceback
from types import CoroutineType, FrameType, GeneratorType
from typing import Any

__all__ = ["StopReport", "task_await_chain", "thread_stacks"]

log = logging.getLogger("agent_sandbox.kube.manager")


def _frame_line(frame: FrameType | None, fallback: str) -> str:
    if frame is None:
        return fallback
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"


def task_await_chain(task: asyncio.Task[Any]) -> list[str]:
    """Where `task` is suspended: its coroutine, each coroutine that one awaits, then what the last awaits."""
    lines: list[str] = []
    awaited: object = task.get_coro()
    for _ in range(64):  # a chain is a few dozen deep at most; bounded so a cycle cannot loop forever
        # The concrete types, not the ABCs: a future's iterator registers as a Generator without frames.
        if isinstance(awaited, CoroutineType):
            lines.append(_frame_line(awaited.cr_frame, f"{awaited.__qualname__} (finished)"))
            awaited = awaited.cr_await
        elif isinstance(awaited, GeneratorType):
            lines.append(_frame_line(awaited.gi_frame, f"{awaited.__qualname__} (finished)"))
            awaited = awaited.gi_yieldfrom
        else:
            if awaited is not None:
                lines.append(f"awaiting {type(awaited).__name__}: {awaited!r}"[:300])
            break
    return lines


def thread_stacks() -> str:
    """Every thread's Python stack, by thread name (for a log record's `stacks` field)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts: list[str] = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"thread {names.get(ident, ident)}:\n{stack}")
    return "\n".join(parts)


def _log_tasks(after: float) -> None:
    parts: list[str] = []
    current = asyncio.current_task()
    for task in asyncio.all_tasks():
        if task is current or task.done():
            continue
        chain = "\n  ".join(task_await_chain(task))
        parts.append(f"task {task.get_name()}:\n  {chain}")
    log.warning(
        "stop still running after %.0fs: %d tasks pending",
        after,
        len(parts),
        extra={"stacks": "\n".join(sorted(parts))},
    )


class StopReport:
    """Log the stacks of every thread and task once, `after` seconds from `arm()`, unless cancelled first."""

    def __init__(self, after: float) -> None:
        """Args: after: seconds a stop may run before it is reported (<= 0: never)."""
        self.after = after
        self._timer: threading.Timer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def arm(self) -> None:
        """Start the clock (call on the loop whose tasks are to be reported)."""
        if self.after <= 0 or self._timer is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._timer = threading.Timer(self.after, self._report)
        self._timer.daemon = True
        self._timer.name = "stop-report"
        self._timer.start()

    def cancel(self) -> None:
        """The stop finished: no report."""
        if self._timer is not None:
            self._timer.cancel()

    def _report(self) -> None:
        log.warning(
            "stop still running after %.0fs: thread stacks follow",
            self.after,
            extra={"stacks": thread_stacks()},
        )
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile: the stop finished after all
                loop.call_soon_threadsafe(_log_tasks, self.after)
