"""`parse_time` (api/meta.py) against what our own code writes, its fast path against the full reading, and the
Python SDK's copy against it, over generated values (hypothesis).

`parse_time` reads kube-apiserver's `format: date-time` grammar first since December 6 (~4 us a value); the
canonical forms (`metav1.Time`, RFC3339Nano) take a fast path (~0.4 us) that must give identical results."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_sandbox.api import meta

pytestmark = pytest.mark.unit

MIN = datetime.min.replace(tzinfo=UTC)
MAX = datetime.max.replace(tzinfo=UTC)
instants = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999)
).map(lambda d: d.replace(tzinfo=UTC))


@given(instants)
def test_what_we_write_reads_back_exactly(moment: datetime) -> None:
    # Annotations (last-activity, resumed-at, suspended-at, first-ready-at) and condition times are written
    # with these two and compared after a read: the round trip must be exact (microseconds; seconds).
    assert meta.parse_time(meta.format_rfc3339nano(moment)) == moment
    assert meta.parse_time(meta.format_time(moment)) == moment.replace(microsecond=0)


def _two(hi: int) -> st.SearchStrategy[str]:
    return st.integers(0, hi).map(lambda n: f"{n:02d}")


# Canonical-looking values, in and out of range (hour 24, second 60, February 30, year 0000, 1-12 digits).
canonical = st.builds(
    lambda y, mo, d, h, mi, s, frac: f"{y:04d}-{mo}-{d}T{h}:{mi}:{s}{frac}Z",
    st.sampled_from([0, 1, 2, 1969, 1970, 2000, 2026, 9999]) | st.integers(0, 9999),
    _two(13),
    _two(32),
    _two(25),
    _two(61),
    _two(61),
    st.just("") | st.text("0123456789", min_size=1, max_size=12).map(lambda f: "." + f),
)


def _full_reading(value: str) -> datetime | None:
    """`parse_time` without its fast path."""
    saved = meta._CANONICAL_TIME_RE
    meta._CANONICAL_TIME_RE = re.compile(r"(?!)")
    try:
        return meta.parse_time(value)
    finally:
        meta._CANONICAL_TIME_RE = saved


@settings(max_examples=500)
@given(canonical)
def test_the_fast_path_reads_as_the_full_grammar(value: str) -> None:
    assert meta.parse_time(value) == _full_reading(value)


@pytest.mark.parametrize(
    "value",
    [
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00.1Z",
        "2026-01-01T00:00:00.123456789Z",
        "0000-01-01T00:00:00Z",
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59.999999999Z",
        "2026-01-01T24:00:00Z",
        "2026-02-29T00:00:00Z",
        "2024-02-29T00:00:00Z",
    ],
)
def test_the_fast_path_edges(value: str) -> None:
    assert meta.parse_time(value) == _full_reading(value)


# Anything near the grammar: case, separators, offsets in and out of range, fractions, whitespace, junk.
near = st.builds(
    lambda lead, date, sep, clock, dot, frac, zone, tail: f"{lead}{date}{sep}{clock}{dot}{frac}{zone}{tail}",
    st.sampled_from(["", " ", "\n"]),
    st.sampled_from(
        ["2026-01-01", "0000-02-29", "9999-12-31", "0001-01-01", "2026-02-30", "2026-1-01", "20260101"]
    ),
    st.sampled_from(["T", "t", " ", "_", "TT"]),
    st.sampled_from(["00:00:00", "23:59:59", "24:00:00", "12:00", "00:00:60", "1:00:00"]),
    st.sampled_from(["", ".", ",", "X", "\n"]),
    st.sampled_from(["", "5", "123456", "123456789", "1234567890123"]),
    st.sampled_from(
        ["Z", "z", "", "+00:00", "-00:00", "+24:00", "-99:99", "+05:30", "+0530", "+05", "Zt1", "Z+01:00"]
    ),
    st.sampled_from(["", " ", "\n", "x", "t", "T00:00:00Z"]),
)


@settings(max_examples=1000)
@given(near | canonical | st.text(max_size=40))
def test_the_sdk_reads_times_as_the_control_plane(value: str) -> None:
    # The SDK installs alone, with its own copy of parse_time (agent_sandbox_sdk/_apitime.py).
    from agent_sandbox_sdk._apitime import parse_time as _parse_time

    assert _parse_time(value) == meta.parse_time(value)


@given(near | canonical)
def test_clamped_instants_stay_usable(value: str) -> None:
    # A clamped instant (datetime.min/max) is only ever compared, subtracted from `now`, or has a deadline
    # computed with `deadline_after`: none of these may raise.
    parsed = meta.parse_time(value)
    if parsed is None:
        return
    now = datetime.now(UTC)
    assert isinstance((parsed - now).total_seconds(), float)
    assert isinstance(parsed.timestamp(), float)
    assert meta.deadline_after(parsed, 10**12) is None or parsed < MAX
    assert parsed in (MIN, MAX) or MIN < parsed < MAX or parsed == parsed.astimezone(UTC)
    _ = parsed + timedelta(0)


@settings(max_examples=300)
@given(canonical | near)
def test_the_sdks_fast_path_reads_as_its_full_grammar(value: str) -> None:
    from agent_sandbox_sdk import _apitime as sdk

    saved = sdk._CANONICAL_TIME_RE
    try:
        fast = sdk.parse_time(value)
        sdk._CANONICAL_TIME_RE = re.compile(r"(?!)")
        assert fast == sdk.parse_time(value) == _full_reading(value)
    finally:
        sdk._CANONICAL_TIME_RE = saved
