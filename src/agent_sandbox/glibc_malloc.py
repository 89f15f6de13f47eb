"""Fixed glibc malloc thresholds for long-running processes (the controller), so RSS follows live memory.

Why: glibc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB on 64-bit),
after which multi-megabyte buffers - list responses, watch batches, JSON documents - are carved from the
heap, and the trim threshold (twice the mmap threshold) keeps what they leave behind. A controller that
decodes watch streams for hours then holds heap it no longer uses: in the 10-minute soak with its cached
objects level, RSS rose 8.4 MiB from minute 2 to 10 with glibc's defaults (docs/reliability.md). Fixing
both thresholds at 128 KiB (glibc's starting values) keeps large blocks in mmap, returned on free, and
trims the heap's top; measured in docs/design/glibc-malloc.md.

What: `tune()` calls `mallopt(M_MMAP_THRESHOLD)` and `mallopt(M_TRIM_THRESHOLD)` - the same settings as
the environment variables `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_`, which win when set (an
operator's choice is left alone). `AGENT_SANDBOX_MALLOC_TUNING=off` keeps glibc's dynamic defaults.
Elsewhere (musl, macOS, no mallopt) it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from collections.abc import Mapping

__all__ = ["MMAP_THRESHOLD", "OPT_OUT", "TRIM_THRESHOLD", "tune"]

log = logging.getLogger(__name__)

# <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

OPT_OUT = "AGENT_SANDBOX_MALLOC_TUNING"
MMAP_THRESHOLD = 128 * 1024
TRIM_THRESHOLD = 128 * 1024

_SETTINGS = (
    ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, TRIM_THRESHOLD),
)


def tune(environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """Fix glibc's mmap and trim thresholds unless the environment sets them; returns what was set."""
    env = os.environ if environ is None else environ
    if env.get(OPT_OUT, "").lower() == "off" or platform.libc_ver()[0] != "glibc":
        return {}
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return {}
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied: dict[str, int] = {}
    for variable, param, value in _SETTINGS:
        if variable in env:
            continue
        if mallopt(param, value) == 1:  # mallopt returns 1 on success, 0 on error
            applied[variable] = value
        else:
            log.warning("mallopt(%s, %d) failed; glibc keeps its default", variable.rstrip("_"), value)
    return applied
