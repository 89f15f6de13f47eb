"""Where benchmark results go: one JSON file per run under benchmarks/results/, never overwritten.

Owns: `RESULTS` (the results directory), `write_result` (`<scenario>-<UTC timestamp>.json`) and
`write_result_with_markdown` (the same plus a `.md` beside it).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "write_result", "write_result_with_markdown"]

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(scenario: str, report: dict[str, Any], *, directory: Path | None = None) -> Path:
    """Write `<scenario>-<UTC timestamp>.json` under benchmarks/results/ and return its path."""
    out = directory or RESULTS
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"{scenario}-{stamp}.json"
    n = 1
    while path.exists():  # two results within one second (smoke runs, a series' spread): never overwrite
        n += 1
        path = out / f"{scenario}-{stamp}.{n}.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    return path


def write_result_with_markdown(scenario: str, report: dict[str, Any]) -> Path:
    """`write_result`, plus `<same name>.md` holding `report["markdown"]` under a title."""
    path = write_result(scenario, report)
    path.with_suffix(".md").write_text(
        f"# {scenario} {path.stem.rsplit('-', 1)[-1]}\n\n{report['markdown']}\n"
    )
    return path
