"""The soak's error-log count reads both controller log formats and only error-or-worse levels."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.reliability.soak import error_lines

pytestmark = pytest.mark.unit


def test_error_lines_in_json_and_console_logs(tmp_path: Path) -> None:
    log = tmp_path / "controller.log"
    log.write_text(
        '{"level":"info","msg":"error budget fine"}\n'
        '{"level":"error","msg":"Reconciler error"}\n'
        "2026-01-01T00:00:00Z\tERROR\tclaim\tboom\n"
        "2026-01-01T00:00:00Z\tINFO\tclaim\tan error word in an info line\n"
        '{"level":"dpanic","msg":"bad"}\n'
        "not a log line\n"
    )
    found = error_lines(log)
    assert len(found) == 3
    assert error_lines(log, offset=log.stat().st_size) == []
