"""The benchmarks' progress log: one timestamped line per event, on stderr.

Owns: `log`, the `[bench HH:MM:SS] ...` lines every benchmark prints while it runs (stderr, so that stdout
stays free for the reports some entry points print), and `write_err`, the one write to stderr they all go
through - which never raises.
"""

from __future__ import annotations

import contextlib
import sys
import time

__all__ = ["log", "write_err"]


def write_err(line: str) -> None:
    """`line` on stderr; a terminal that is gone is ignored.

    After a hangup (the ssh session or the terminal window closed) every write to the terminal fails with
    EIO: an exception from a progress line would replace the interruption being handled and skip the
    teardown after it, leaving the cluster running. A closed stream (ValueError) is the same loss.
    """
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def log(msg: str) -> None:
    """A `[bench HH:MM:SS] msg` line on stderr (never raises: see `write_err`)."""
    write_err(f"[bench {time.strftime('%H:%M:%S')}] {msg}")
