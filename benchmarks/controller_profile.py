"""py-spy profiles of the controller during a measured phase: where they go and what a result records.

Owns: `profile_path_for` (`benchmarks/results/profiles/<scenario>-<label>-<UTC>.txt`), `finish_profiler`
(waits for the `py-spy record` that `Bench.profiler` started) and `profile_summary_for` (the summary of
`benchmarks/profile.py` plus the file, as a result records it).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import profile as prof
from .result_files import RESULTS

__all__ = ["finish_profiler", "profile_path_for", "profile_summary_for"]


def profile_path_for(scenario: str, label: str) -> Path:
    """A new profile file for one phase of a scenario (not created)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return RESULTS / "profiles" / f"{scenario}-{label}-{stamp}.txt"


def profile_summary_for(path: Path | None) -> dict[str, Any] | None:
    """The summary a result records of a profile file; None when there is none."""
    if path is None or not path.exists():
        return None
    summary = prof.summarize_profile(prof.parse_collapsed(path.read_text()))
    summary["file"] = str(path.relative_to(RESULTS.parent.parent))
    return summary


async def finish_profiler(proc: subprocess.Popen[bytes] | None, within: float = 60.0) -> None:
    """Wait for py-spy to write its profile; stop it after `within` seconds."""
    if proc is None:
        return
    deadline = time.monotonic() + within
    while proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 (a child process)
        await asyncio.sleep(0.2)
    if proc.poll() is None:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 10)
