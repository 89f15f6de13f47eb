"""`kill` or a closed terminal stops a benchmark the way Ctrl-C does: what it started is torn down first.

Every benchmark that brings up a dev cluster or its own processes stops them in a `finally`. Python ends a
process on SIGTERM or SIGHUP without running any `finally`, so `kill <pid>` of a benchmark (or the hangup of
the terminal or SSH session it ran in) left its cluster running (etcd, kube-apiserver, kwok, the controller,
the soak's client-watch process) until someone ran `agent-sandbox dev down`. A benchmark started in the
background cannot be stopped with SIGINT either: the shell starts background jobs with SIGINT ignored.
"""

from __future__ import annotations

import signal
from types import FrameType

from agent_sandbox.interrupts import raise_where_safe

__all__ = ["STOPPING_SIGNALS", "exit_status", "stop_cleanly_on_sigterm"]

#: The signals turned into Ctrl-C's KeyboardInterrupt (the CLI handles the same two, cli/main.py).
STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


#: How the KeyboardInterrupt of a signal reads (`exit_status` reads the signal back).
_STOPPED_BY = "stopped by signal "


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGHUP:
        # A hangup is one event that may arrive twice (the kernel's, then the exiting shell's): later ones must
        # not cut the teardown short.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    else:
        # A second SIGTERM during the teardown ends the process at once, as an impatient user expects.
        signal.signal(signum, signal.SIG_DFL)
    raise_where_safe(KeyboardInterrupt(f"{_STOPPED_BY}{signum}"))


def exit_status(stop: KeyboardInterrupt) -> int:
    """The status a shell gives a program the interruption's signal stopped: 128 + the signal, 130 for Ctrl-C."""
    text = str(stop)
    if text.startswith(_STOPPED_BY) and text[len(_STOPPED_BY) :].isdigit():
        return 128 + int(text[len(_STOPPED_BY) :])
    return 128 + signal.SIGINT


def stop_cleanly_on_sigterm() -> None:
    """Make SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, as Ctrl-C does.

    `finally` blocks run, and so does `asyncio.run`'s cancellation of the tasks still running, before the
    process exits. A signal inherited as ignored stays ignored: `nohup python -m benchmarks ...` must survive
    the hangup it was started to survive. Call it first thing in the `__main__` block of a benchmark that
    starts a cluster or processes.
    """
    for sig in STOPPING_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _interrupt)
