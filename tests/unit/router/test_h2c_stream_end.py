"""`_ServerFrames.on_stream_end`: which sandbox frames end a stream, for the h2c drain (`_Session.drain`), which
closes a connection once its accepted streams have ended."""

from __future__ import annotations

import hpack

from agent_sandbox.router._h2c_frames import (
    _END_HEADERS,
    _END_STREAM,
    _HEADERS,
    _RST_STREAM,
    _frame,
    _ServerFrames,
)

_DATA, _CONTINUATION = 0x0, 0x9


def _recorded() -> tuple[_ServerFrames, list[int]]:
    frames = _ServerFrames()
    ended: list[int] = []
    frames.on_stream_end = ended.append
    return frames, ended


def test_data_with_end_stream_and_a_reset_end_their_streams() -> None:
    frames, ended = _recorded()
    head = hpack.Encoder().encode([(":status", "200")])
    frames.feed(_frame(_HEADERS, _END_HEADERS, 1, head) + _frame(_DATA, 0, 1, b"part"))
    assert ended == []
    frames.feed(_frame(_DATA, _END_STREAM, 1, b"end") + _frame(_RST_STREAM, 0, 3, b"\x00\x00\x00\x07"))
    assert ended == [1, 3]


def test_trailers_end_their_stream_once_the_block_is_whole() -> None:
    """END_STREAM is on the HEADERS frame, the block ends in a CONTINUATION: the stream ends with the
    block (relayed whole), not before."""
    frames, ended = _recorded()
    encoder = hpack.Encoder()
    frames.feed(_frame(_HEADERS, _END_HEADERS, 1, encoder.encode([(":status", "200")])))
    trailers = encoder.encode([("grpc-status", "0"), ("grpc-message", "done")])
    out, _ = frames.feed(_frame(_HEADERS, _END_STREAM, 1, trailers[:3]))
    assert (out, ended) == (b"", [])
    frames.feed(_frame(_CONTINUATION, _END_HEADERS, 1, trailers[3:]))
    assert ended == [1]


def test_a_trailers_only_response_ends_its_stream() -> None:
    frames, ended = _recorded()
    block = hpack.Encoder().encode([(":status", "200"), ("grpc-status", "14")])
    frames.feed(_frame(_HEADERS, _END_HEADERS | _END_STREAM, 5, block))
    assert ended == [5]
