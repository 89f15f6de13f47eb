"""The benchmarks' progress log: one timestamped line per event, on stderr.

Owns: `log`, the `[bench HH:MM:SS] ...` lines every benchmark prints while it runs (stderr, so that stdout
stays free for the reports some entry points print).
"""

from __future__ import annotations

import sys
import time

__all__ = ["log"]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
