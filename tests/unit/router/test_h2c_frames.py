"""Frame boundaries of the sandbox->client h2c stream, where the router may put a frame of its own."""

from __future__ import annotations

import itertools

import hpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_sandbox.router._h2c import _ClientFrames, _FrameBoundary


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


def _raw(ftype: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + stream.to_bytes(4, "big") + payload


HEADERS, CONTINUATION, DATA = 0x1, 0x9, 0x0
END_HEADERS = 0x4


def _block(**headers: str) -> bytes:
    return bytes(hpack.Encoder().encode(list(headers.items())))


def test_a_split_header_block_is_held_until_it_can_be_checked() -> None:
    block = _block(x_sandbox_id="beta")
    first, rest = _raw(HEADERS, 0, 3, block[:2]), _raw(CONTINUATION, END_HEADERS, 3, block[2:])
    client = _ClientFrames()
    assert client.feed(first) == ([], [])  # nothing of the block leaves before all of it is seen
    assert client.buffered == len(first)
    frames, blocks = client.feed(rest)
    assert frames == [first, rest]
    assert blocks == [(3, [("x_sandbox_id", "beta")])]


@pytest.mark.parametrize(
    "frames",
    [
        [_raw(CONTINUATION, END_HEADERS, 1, b"")],  # continues nothing
        [_raw(HEADERS, 0, 1, b""), _raw(CONTINUATION, END_HEADERS, 3, b"")],  # another stream's
        [_raw(HEADERS, 0, 1, b""), _raw(DATA, 0, 1, b"x")],  # another frame inside a block
        [_raw(HEADERS, 0, 1, b""), _raw(HEADERS, END_HEADERS, 3, b"")],  # a block inside a block
        [_raw(HEADERS, END_HEADERS, 0, b"")],  # on the connection's stream
    ],
)
def test_header_blocks_out_of_order_are_refused(frames: list[bytes]) -> None:
    with pytest.raises(ValueError, match=r"HEADERS|CONTINUATION|inside"):
        _ClientFrames().feed(b"".join(frames))


def test_the_first_authorization_header_counts() -> None:
    """As upstream's `Header.Get` and the HTTP/1.1 path."""
    from agent_sandbox.router._h2c import _routing

    assert _routing([("authorization", "Bearer a"), ("authorization", "Bearer b")])[2] == b"Bearer a"
