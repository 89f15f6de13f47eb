"""`kill` stops a benchmark the way Ctrl-C does: what it started is torn down first.

Every benchmark that brings up a dev cluster or its own processes stops them in a `finally`. Python ends a
process on SIGTERM without running any `finally`, so `kill <pid>` of a benchmark left its cluster running (etcd,
kube-apiserver, kwok, the controller, the soak's client-watch process) until someone ran `agent-sandbox dev down`.
A benchmark started in the background cannot be stopped with SIGINT either: the shell starts background jobs with
SIGINT ignored.
"""

from __future__ import annotations

import signal
from types import FrameType

__all__ = ["stop_cleanly_on_sigterm"]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # A second SIGTERM during the teardown ends the process at once, as an impatient user expects.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def stop_cleanly_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt in the main thread, as Ctrl-C does.

    `finally` blocks run, and so does `asyncio.run`'s cancellation of the tasks still running, before the
    process exits. Call it first thing in the `__main__` block of a benchmark that starts a cluster or processes.
    """
    signal.signal(signal.SIGTERM, _interrupt)
