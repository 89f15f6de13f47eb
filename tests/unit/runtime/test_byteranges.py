"""Parsing a multi-range `Range` header as Go's `http.parseRange` does (pure logic)."""

from __future__ import annotations

import pytest

from agent_sandbox.runtime.byteranges import ByteRange, _Invalid, _parse

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-9,20-29", [ByteRange(0, 10), ByteRange(20, 10)]),
        ("bytes= 0-9 , -5 ,", [ByteRange(0, 10), ByteRange(95, 5)]),
        ("bytes=90-,0-500", [ByteRange(90, 10), ByteRange(0, 100)]),  # past the end: clipped
        ("bytes=100-,200-300", []),  # none overlaps
        ("bytes=-0,0-0", [ByteRange(0, 1)]),  # an empty suffix overlaps nothing
        ("bytes=-500,1-1", [ByteRange(0, 100), ByteRange(1, 1)]),
        ("bytes=-0", []),  # a lone empty suffix: unsatisfiable (416), as RFC 9110 has it
        ("bytes=+1-+2", [ByteRange(1, 2)]),  # Go's ParseInt takes a `+`
        (f"bytes=90-{2**63 - 1}", [ByteRange(90, 10)]),  # int64's largest: clipped
        (f"bytes={2**63 - 1}-", []),
    ],
)
def test_ranges(header: str, expected: list[ByteRange]) -> None:
    assert _parse(header, 100)[0] == expected


@pytest.mark.parametrize(
    ("header", "no_overlap"),
    [
        ("bytes=", False),  # no range at all: the whole file (200), as Go serves it - a 416 until the review
        ("bytes=,", False),
        ("bytes= , ", False),
        ("bytes=100-", True),  # starts past the end: 416
        ("bytes=-0", True),
        ("bytes=0-1", False),
    ],
)
def test_no_overlap_tells_an_unsatisfiable_range_from_none(header: str, no_overlap: bool) -> None:
    assert _parse(header, 100)[1] is no_overlap


@pytest.mark.parametrize(
    "header",
    [
        "items=0-1,2-3",
        "bytes=0-1,x",
        "bytes=5-1,6-7",
        "bytes=0-1,2",
        "bytes=\u0661-\u0662,3-4",
        "bytes=--1,0-1",
        "bytes=0-99999999999999999999999",  # past int64: Go's ParseInt fails
        f"bytes={2**63}-",
        f"bytes=-{2**63}",
        "Bytes=0-1",  # the unit is case-sensitive in Go
        "bytes=0--1",
    ],
)
def test_malformed(header: str) -> None:
    with pytest.raises(_Invalid):
        _parse(header, 100)
