"""`glibc_malloc.tune`: which settings it applies, and that glibc then really keeps large blocks in mmap.

The behavioural check runs in a fresh interpreter per case (thresholds are process-wide): a 1 MiB block
is allocated and freed, then allocated again. With glibc's dynamic threshold the free raises the
threshold to 1 MiB, so the second block comes from the heap; with the threshold fixed it is mmapped
again (glibc's `mallinfo2().hblkhd` counts mmapped bytes).
"""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from agent_sandbox import glibc_malloc

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

_PROBE = """
import ctypes, sys
from agent_sandbox import glibc_malloc
if sys.argv[1] == "tune":
    assert glibc_malloc.tune({}) == {"MALLOC_MMAP_THRESHOLD_": 131072, "MALLOC_TRIM_THRESHOLD_": 131072}
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.free(libc.malloc(1 << 20))
block = libc.malloc(1 << 20)
print(libc.mallinfo2().hblkhd >= 1 << 20)
"""


def _second_block_mmapped(mode: str) -> bool:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


@glibc_only
def test_a_freed_large_block_no_longer_moves_the_threshold_once_tuned() -> None:
    assert not _second_block_mmapped("default")  # glibc's dynamic threshold rose to 1 MiB
    assert _second_block_mmapped("tune")


@glibc_only
def test_the_operators_environment_wins_and_the_opt_out_keeps_glibcs_defaults() -> None:
    assert glibc_malloc.tune({"MALLOC_MMAP_THRESHOLD_": "65536"}) == {"MALLOC_TRIM_THRESHOLD_": 131072}
    assert glibc_malloc.tune({"MALLOC_MMAP_THRESHOLD_": "1", "MALLOC_TRIM_THRESHOLD_": "1"}) == {}
    assert glibc_malloc.tune({glibc_malloc.OPT_OUT: "off"}) == {}
    assert glibc_malloc.tune({glibc_malloc.OPT_OUT: "OFF"}) == {}
