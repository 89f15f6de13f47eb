"""benchmarks.client_watch: reading the watcher process's output (first Ready per claim, torn lines)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.client_watch import read_ready


def test_first_line_per_claim_wins_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    lines = [
        json.dumps({"claim": "ns/a", "ready": 10.5, "requested": 10.0}),
        json.dumps({"claim": "ns/b", "ready": 11.0, "requested": None}),
        json.dumps({"claim": "ns/a", "ready": 99.0, "requested": 10.0}),
        '{"claim": "ns/c", "rea',
    ]
    out.write_text("\n".join(lines))
    assert read_ready(out) == {"ns/a": (10.5, 10.0), "ns/b": (11.0, None)}


def test_missing_file_is_no_claims(tmp_path: Path) -> None:
    assert read_ready(tmp_path / "absent.jsonl") == {}
