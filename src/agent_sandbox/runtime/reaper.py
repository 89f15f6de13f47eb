"""Child exits noticed on the event loop: one reaper per loop, a pidfd per child.

No thread or SIGCHLD handler per child, so many servers share one loop and tests can embed a server. When the
runtime is PID 1 (a container), orphans re-parented to it are reaped too.
"""

from __future__ import annotations

import asyncio
import os
import signal

__all__ = ["Reaper", "exit_code_of", "loop_reaper"]


def exit_code_of(status: int) -> int:
    """Exit code from a wait status: the code, or -signal for a killed process (Python's convention)."""
    return os.waitstatus_to_exitcode(status)


class Reaper:
    """Notices child exits on one event loop through pidfds; as PID 1 also reaps adopted orphans."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._waiting: dict[int, tuple[int, asyncio.Future[int]]] = {}
        if os.getpid() == 1:
            loop.add_signal_handler(signal.SIGCHLD, self._reap_all)

    def watch(self, pid: int) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = self.loop.create_future()
        pidfd = os.pidfd_open(pid)
        self._waiting[pid] = (pidfd, fut)
        self.loop.add_reader(pidfd, self._poll, pid)
        self._poll(pid)  # it may have exited already
        return fut

    def _poll(self, pid: int) -> None:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere (PID 1 sweep): status lost
            done, status = pid, -1
        if done:
            self._finish(pid, status)

    def _finish(self, pid: int, status: int) -> None:
        entry = self._waiting.pop(pid, None)
        if entry is None:
            return
        pidfd, fut = entry
        self.loop.remove_reader(pidfd)
        os.close(pidfd)
        if not fut.done():
            fut.set_result(exit_code_of(status) if status != -1 else -1)

    def _reap_all(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._finish(pid, status)


_reapers: dict[asyncio.AbstractEventLoop, Reaper] = {}


def loop_reaper() -> Reaper:
    """The running loop's reaper (made on first use, and again if its loop was closed)."""
    loop = asyncio.get_running_loop()
    reaper = _reapers.get(loop)
    if reaper is None or reaper.loop.is_closed():
        reaper = _reapers[loop] = Reaper(loop)
    return reaper
