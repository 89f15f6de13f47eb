"""Frame boundaries of the sandbox->client h2c stream, where the router may put a frame of its own."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from agent_sandbox.router._h2c import _FrameBoundary


def _frame(length: int) -> bytes:
    return length.to_bytes(3, "big") + b"\x00\x00" + b"\x00\x00\x00\x01" + b"p" * length


def test_at_start_and_after_whole_frames() -> None:
    boundary = _FrameBoundary()
    assert boundary.at_boundary
    assert boundary.feed(_frame(3) + _frame(0)) == 0
    assert boundary.at_boundary


def test_first_boundary_inside_a_read() -> None:
    boundary = _FrameBoundary()
    data = _frame(5) + _frame(2)
    assert boundary.feed(data[:4]) == 0  # began at a boundary
    assert not boundary.at_boundary  # now inside a frame header
    assert boundary.feed(data[4:12]) == -1  # the first frame ends at byte 14 of the stream
    assert boundary.feed(data[12:16]) == 14 - 12
    assert not boundary.at_boundary  # inside the second frame's header
    assert boundary.feed(data[16:]) == len(data) - 16
    assert boundary.at_boundary


def test_a_read_inside_one_long_frame_has_no_boundary() -> None:
    boundary = _FrameBoundary()
    data = _frame(100)
    boundary.feed(data[:20])
    assert boundary.feed(data[20:50]) == -1
    assert boundary.feed(data[50:]) == len(data) - 50


@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    cuts=st.lists(st.integers(0, 300), max_size=8),
)
def test_any_split_finds_the_same_boundaries(lengths: list[int], cuts: list[int]) -> None:
    stream = b"".join(_frame(n) for n in lengths)
    ends, pos = {0}, 0
    for n in lengths:
        pos += 9 + n
        ends.add(pos)
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    boundary = _FrameBoundary()
    for start, end in itertools.pairwise(points):
        first = boundary.feed(stream[start:end])
        expected = min((e - start for e in ends if start <= e <= end), default=-1)
        assert first == expected
    assert boundary.at_boundary
