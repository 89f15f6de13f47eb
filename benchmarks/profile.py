"""Pure summary of a py-spy profile (`py-spy record --format raw`: collapsed stacks, one per line).

Each line is `frame;frame;...;leaf count`, outermost frame first, frames spelled `function (file:line)`.
The summary gives the share of samples per function (self = leaf, inclusive = anywhere on the stack,
counted once per stack) and per area (package of the leaf frame), which is what docs/performance.md
tabulates before and after a fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

__all__ = ["area_of", "frame_key", "parse_collapsed", "summarize_profile"]

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
# Leaf-frame areas, first match wins (path fragments, as py-spy prints absolute paths).
_AREAS: tuple[tuple[str, str], ...] = (
    ("agent_sandbox/kube/_client", "kube client"),
    ("agent_sandbox/kube/_informer", "kube informer"),
    ("agent_sandbox/kube/_workqueue", "kube workqueue"),
    ("agent_sandbox/kube/_logging", "logging"),
    ("agent_sandbox/kube/", "kube runtime (other)"),
    ("agent_sandbox/controllers/claim/", "claim controller"),
    ("agent_sandbox/controllers/sandbox/", "sandbox controller"),
    ("agent_sandbox/controllers/warmpool/", "warm pool controller"),
    ("agent_sandbox/controllers/", "controllers (other)"),
    ("agent_sandbox/", "agent_sandbox (other)"),
    ("aiohttp/", "aiohttp"),
    ("yarl/", "aiohttp"),
    ("multidict/", "aiohttp"),
    ("prometheus_client/", "prometheus_client"),
    ("asyncio/", "asyncio"),
    ("uvloop/", "asyncio"),
    ("ssl.py", "ssl"),
    ("logging/", "logging"),
    ("json/", "json (stdlib)"),
    ("copy.py", "copy (stdlib)"),
)


def frame_key(frame: str) -> str:
    """`function (path:line)` -> `short/path.py:function` (line dropped, path from the package root)."""
    m = _FRAME.match(frame.strip())
    if m is None:
        return frame.strip()
    path = m.group("file")
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/lib/python3":
                path = path.split("/", 1)[1] if "/" in path else path
            break
    return f"{path}:{m.group('func')}"


def area_of(frame: str) -> str:
    """The area (package group) a frame belongs to; "other" when none matches."""
    for fragment, area in _AREAS:
        if fragment in frame:
            return area
    return "other"


def parse_collapsed(text: str) -> list[tuple[list[str], int]]:
    """Stacks and their sample counts from collapsed-stack text (malformed lines skipped)."""
    out: list[tuple[list[str], int]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        out.append((stack.split(";"), int(count)))
    return out


def _plumbing(frame: str) -> bool:
    """Frames on (nearly) every stack: the entry point and the event loop; left out of inclusive ranks."""
    return (
        frame.startswith("<module> ")
        or area_of(frame) == "asyncio"
        or "agent_sandbox/controllers/main.py" in frame
        or "/bin/agent-sandbox-controller" in frame
    )


def _top(counts: dict[str, int], total: int, top: int) -> list[dict[str, float | str]]:
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [{"name": k, "pct": round(100.0 * v / total, 1)} for k, v in ranked]


def summarize_profile(stacks: Iterable[tuple[list[str], int]], *, top: int = 20) -> dict[str, Any]:
    """Self and inclusive shares per function, and self share per area."""
    self_counts: dict[str, int] = {}
    incl_counts: dict[str, int] = {}
    area_counts: dict[str, int] = {}
    total = 0
    for frames, count in stacks:
        if not frames:
            continue
        total += count
        leaf = frames[-1]
        key = frame_key(leaf)
        self_counts[key] = self_counts.get(key, 0) + count
        area = area_of(leaf)
        area_counts[area] = area_counts.get(area, 0) + count
        for name in {frame_key(f) for f in frames if not _plumbing(f)}:
            incl_counts[name] = incl_counts.get(name, 0) + count
    if total == 0:
        return {"samples": 0, "self": [], "inclusive": [], "areas": []}
    return {
        "samples": total,
        "self": _top(self_counts, total, top),
        "inclusive": _top(incl_counts, total, top),
        "areas": _top(area_counts, total, len(area_counts)),
    }
