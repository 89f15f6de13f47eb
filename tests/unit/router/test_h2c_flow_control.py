"""The connection-level flow-control window of the client's DATA frames the h2c router drops (those of refused
streams): given back to the client, as the sandbox never sees them to give it back (RFC 9113 6.9)."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from agent_sandbox.router._h2c_frames import _refused_dropped

DATA, HEADERS, RST_STREAM, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x8
END_STREAM, END_HEADERS, PADDED = 0x1, 0x4, 0x8


def _raw(ftype: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + stream.to_bytes(4, "big") + payload


def _window_update(increment: int) -> bytes:
    return _raw(WINDOW_UPDATE, 0, 0, struct.pack("!I", increment))


def test_a_dropped_data_frame_returns_its_length_on_the_connection() -> None:
    kept, window = _refused_dropped([_raw(DATA, 0, 3, b"x" * 1000)], above=1)
    assert (kept, window) == ([], _window_update(1000))


def test_padding_counts_and_the_frames_of_a_read_make_one_update() -> None:
    """The whole payload is flow-controlled, pad length and padding included (RFC 9113 6.9.1)."""
    padded = _raw(DATA, PADDED | END_STREAM, 5, bytes([200]) + b"y" * 10 + bytes(200))
    kept, window = _refused_dropped([_raw(DATA, 0, 3, b"x" * 16384), padded], above=1)
    assert kept == []
    assert window == _window_update(16384 + 211)


def test_accepted_streams_are_kept_and_only_data_is_flow_controlled() -> None:
    accepted = [_raw(DATA, 0, 1, b"a" * 500), _raw(HEADERS, END_HEADERS | END_STREAM, 1, b"\x88")]
    refused = [
        _raw(HEADERS, END_HEADERS, 3, b"\x88"),
        _raw(RST_STREAM, 0, 3, struct.pack("!I", 8)),
        _raw(WINDOW_UPDATE, 0, 5, struct.pack("!I", 100)),
    ]
    connection = [_raw(WINDOW_UPDATE, 0, 0, struct.pack("!I", 100))]
    kept, window = _refused_dropped([*accepted, *refused, *connection], above=1)
    assert kept == [*accepted, *connection]
    assert window == b""  # no DATA dropped: nothing to return


def test_an_empty_data_frame_returns_nothing() -> None:
    """A WINDOW_UPDATE of 0 is a PROTOCOL_ERROR (RFC 9113 6.9)."""
    assert _refused_dropped([_raw(DATA, END_STREAM, 3, b"")], above=1) == ([], b"")


@given(st.lists(st.tuples(st.integers(1, 15), st.integers(0, 300)), max_size=12), st.integers(0, 15))
def test_exactly_the_dropped_data_is_returned(sent: list[tuple[int, int]], above: int) -> None:
    frames = [_raw(DATA, 0, stream, b"d" * size) for stream, size in sent]
    kept, window = _refused_dropped(frames, above)
    assert kept == [f for (s, _), f in zip(sent, frames, strict=True) if not (s > above and s % 2)]
    total = sum(n for s, n in sent if s > above and s % 2)
    assert window == (_window_update(total) if total else b"")
