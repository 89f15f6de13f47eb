"""Heap probe loaded into the controller process by `benchmarks.reliability.churn` only.

The churn run puts this directory first on the controller's PYTHONPATH (with PYTHONTRACEMALLOC on), so
Python imports it at start-up as `sitecustomize`. A daemon thread then waits for request files
`$CHURN_HOOK_DIR/request-<label>` and answers each with `<label>.json`: RSS, tracemalloc's traced total,
every allocation site (file:line, bytes, blocks; after a full `gc.collect()`), the most common object
types, and the length of every dict/set/list/deque attribute of every live `agent_sandbox` and
`prometheus_client` object summed per class attribute (how the per-object maps are counted without
a debug endpoint in the product). Nothing here runs unless CHURN_HOOK_DIR is set.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import threading
import time
import tracemalloc
from collections import Counter, deque
from typing import Any

_PREFIXES = ("agent_sandbox", "prometheus_client")
_CONTAINERS = (dict, set, frozenset, list, deque)


def _rss_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost",
    )]  # fmt: skip


def _malloc() -> dict[str, int]:
    """glibc's heap: bytes in use vs held free (memory freed but not given back to the OS shows as free)."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {"arena": info.arena, "mmap": info.hblkhd, "in_use": info.uordblks, "free": info.fordblks}


def _pymalloc() -> dict[str, int]:
    """pymalloc's arenas (mmap'd directly, so not in mallinfo): allocated vs. used, from _debugmallocstats.

    That function prints to the C stderr only; fd 2 is pointed at a scratch file for the call (a log line
    the controller writes in that instant lands there instead of its log).
    """
    import sys
    import tempfile

    with tempfile.TemporaryFile() as scratch:
        saved = os.dup(2)
        try:
            os.dup2(scratch.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        scratch.seek(0)
        text = scratch.read().decode(errors="replace")
    wanted = {
        "# arenas allocated current": "arenas_current",
        "# bytes in allocated blocks": "allocated_blocks",
        "# bytes in available blocks": "available_blocks",
        "# bytes lost to pool headers": "pool_headers",
        "# bytes lost to quantization": "quantization",
        "Total": "total",
    }
    out: dict[str, int] = {}
    for line in text.splitlines():
        head, _, value = line.rpartition("=")
        key = wanted.get(head.strip())
        if key:
            out[key] = int(value.strip().replace(",", ""))
        elif "unused pools" in head:
            out["unused_pools_bytes"] = int(value.strip().replace(",", ""))
    return out


def _attributes(obj: object) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    own = getattr(obj, "__dict__", None)
    if isinstance(own, dict):
        attrs.update(own)
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            try:
                attrs[name] = getattr(obj, name)
            except AttributeError:
                continue
    return attrs


def _containers(objects: list[object]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for obj in objects:
        cls = type(obj)
        module = getattr(cls, "__module__", "")
        if not isinstance(module, str) or not module.startswith(_PREFIXES):
            continue
        try:
            attrs = _attributes(obj)
        except Exception:  # a property raising on a half-built object: skip it
            continue
        for name, value in attrs.items():
            if isinstance(value, _CONTAINERS):
                row = out.setdefault(
                    f"{module}.{cls.__qualname__}.{name}", {"instances": 0, "items": 0, "sample": []}
                )
                row["instances"] += 1
                row["items"] += len(value)
                if len(row["sample"]) < 5 and len(value) and module.startswith("agent_sandbox"):
                    row["sample"].extend(repr(k)[:160] for k in list(value)[: 5 - len(row["sample"])])
    return out


def _allocation_sites() -> list[list[Any]]:
    if not tracemalloc.is_tracing():
        return []
    snapshot = tracemalloc.take_snapshot().filter_traces(
        (tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__))
    )
    sites = []
    for stat in snapshot.statistics("lineno"):
        frame = stat.traceback[0]
        sites.append([f"{frame.filename}:{frame.lineno}", stat.size, stat.count])
    return sites


def _dump(label: str, directory: str) -> None:
    rss_before = _rss_kib()
    collected = gc.collect()
    objects = gc.get_objects()
    report = {
        "label": label,
        "at": time.time(),
        "rss_kib": rss_before,
        "gc_collected": collected,
        "malloc": _malloc(),
        "pymalloc": _pymalloc(),
        "gc_objects": len(objects),
        "types": Counter(type(o).__name__ for o in objects).most_common(40),
        "containers": _containers(objects),
    }
    del objects
    if tracemalloc.is_tracing():
        current, peak = tracemalloc.get_traced_memory()
        report["traced_current"], report["traced_peak"] = current, peak
        report["tracemalloc_overhead"] = tracemalloc.get_tracemalloc_memory()
    report["sites"] = _allocation_sites()
    tmp = os.path.join(directory, f".{label}.json")
    with open(tmp, "w") as fh:
        json.dump(report, fh)
    os.replace(tmp, os.path.join(directory, f"{label}.json"))


def _serve(directory: str) -> None:
    while True:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            names = []
        for name in names:
            if name.startswith("request-"):
                label = name.removeprefix("request-")
                try:
                    _dump(label, directory)
                except Exception as exc:  # say so in the report instead of dying with the thread
                    with open(os.path.join(directory, f"{label}.json"), "w") as fh:
                        json.dump({"label": label, "error": repr(exc)}, fh)
                finally:
                    os.unlink(os.path.join(directory, name))
        time.sleep(0.5)


_directory = os.environ.get("CHURN_HOOK_DIR")
if _directory:
    threading.Thread(target=_serve, args=(_directory,), name="churn-hook", daemon=True).start()
