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


def test_minutes_report_rss_against_the_sandboxes_cached() -> None:
    from benchmarks.reliability.soak import Sample, Soak

    buckets = [(float("inf"), 0.0)]
    run = Soak(params={}, samples=[
        Sample(at_s=0.0, rss_mib=100.0, fds=10, queue_depth=0.0, sandboxes_cached=5000.0, pods_cached=5000.0, cpu_s=10.0, claim_buckets=buckets),
        Sample(at_s=50.0, rss_mib=101.0, fds=11, queue_depth=3.0, sandboxes_cached=5400.0, pods_cached=5600.0, cpu_s=35.0, claim_buckets=buckets),
        Sample(at_s=70.0, rss_mib=102.5, fds=11, queue_depth=0.0, sandboxes_cached=5200.0, pods_cached=5100.0, cpu_s=39.0, claim_buckets=buckets),
    ])  # fmt: skip
    minutes = run.as_dict()["minutes"]
    assert [
        (
            m["minute"],
            m["rss_mib_max"],
            m["sandboxes_cached_max"],
            m["pods_cached_max"],
            m["controller_cores"],
        )
        for m in minutes
    ] == [
        (1, 101.0, 5400.0, 5600.0, 0.5),  # 25 CPU seconds over the minute's 50 s
        (2, 102.5, 5200.0, 5100.0, 0.2),  # 4 over the next 20 s
    ]
