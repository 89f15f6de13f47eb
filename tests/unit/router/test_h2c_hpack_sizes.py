"""SETTINGS_HEADER_TABLE_SIZE changes as the router's HPACK encoders must follow them (RFC 9113 6.5.3, RFC
7541 4.2 and 6.3; docs/design/router-h2c-hpack.md), each checked against a decoder driven as the h2 library
and nghttp2 drive theirs: a SETTINGS value applies to the peer's decoder when the peer receives the ACK, in
order, and a smaller value evicts its table at once.

Review of d0f2211 (rev-hpack) found two defects it left, fixed since (`_TableSetting.lowest`): a size lowered
then raised again (both acknowledged, or in one SETTINGS frame) before the router's next block was never
signalled, so the client's decoder, which evicted its table at the smaller size, met references to entries it
no longer had (COMPRESSION_ERROR).
"""

from __future__ import annotations

import hpack
from hpack.hpack import INDEX_NONE

from agent_sandbox.router._h2c_frames import (
    _END_HEADERS,
    _END_STREAM,
    _HEADERS,
    _SETTINGS,
    _ClientFrames,
    _frame,
    _ServerFrames,
)
from agent_sandbox.router._h2c_hpack import _HpackSettings

_ACK = 0x1
_BIG = [(b":status", b"200"), (b"x-big", b"v" * 3000)]


def _settings(*sizes: int) -> bytes:
    return _frame(_SETTINGS, 0, 0, b"".join((1).to_bytes(2, "big") + s.to_bytes(4, "big") for s in sizes))


class _Link:
    """A client and a sandbox through the router's two directions, sharing one `_HpackSettings`."""

    def __init__(self) -> None:
        tables = _HpackSettings()
        self.up = _ClientFrames(1 << 16, tables)
        self.up.swallow_ack = False  # no router SETTINGS of its own here
        self.down = _ServerFrames(1 << 16, tables)
        self.sandbox_encoder = hpack.Encoder()
        self.client_decoder = hpack.Decoder()  # the client's: its table size set on each ACK it receives
        self._sent: list[list[int]] = []  # client SETTINGS values not yet acknowledged, in order

    def client_settings(self, *sizes: int) -> None:
        out, _ = self.up.feed(_settings(*sizes))
        assert out == [_settings(*sizes)]  # relayed as sent (all at most 4096)
        for size in sizes:  # the sandbox's encoder follows at once, as it receives them
            self.sandbox_encoder.header_table_size = size
        self._sent.append(list(sizes))

    def sandbox_ack(self) -> None:
        out, _ = self.down.feed(_frame(_SETTINGS, _ACK, 0, b""))
        assert out == _frame(_SETTINGS, _ACK, 0, b"")
        for size in self._sent.pop(0):  # RFC 9113 6.5.3: processed in order, at the ACK
            self.client_decoder.header_table_size = size

    def response(self, stream: int, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        out, _ = self.down.feed(
            _frame(_HEADERS, _END_HEADERS | _END_STREAM, stream, self.sandbox_encoder.encode(headers))
        )
        assert self.down.failed is None, self.down.failed
        return [(bytes(k), bytes(v)) for k, v in self.client_decoder.decode(out[9:], raw=True)]


def test_a_smaller_size_pending_is_signalled_in_the_next_block() -> None:
    link = _Link()
    assert link.response(1, _BIG) == _BIG
    link.client_settings(0)
    assert link.response(3, _BIG) == _BIG  # update to 0 before the ACK: the client decodes it
    link.sandbox_ack()
    assert link.response(5, _BIG) == _BIG
    assert not link.down.encoder.header_table.dynamic_entries


def test_several_settings_before_one_ack_apply_in_order() -> None:
    link = _Link()
    link.client_settings(2048)
    link.client_settings(4096)
    assert link.response(1, _BIG) == _BIG  # the smallest of acked and pending: 2048, x-big not indexed
    link.sandbox_ack()
    assert link.response(3, _BIG) == _BIG
    link.sandbox_ack()
    assert link.response(5, _BIG) == _BIG  # 4096 again: indexed now
    assert link.response(7, _BIG) == _BIG
    assert link.down.settings.client.encoder_limit == 4096


def test_a_peer_advertising_zero() -> None:
    link = _Link()
    link.client_settings(0)
    link.sandbox_ack()
    for stream in range(1, 20, 2):
        assert link.response(stream, _BIG) == _BIG
    assert not link.down.encoder.header_table.dynamic_entries


def test_lowered_then_raised_between_two_blocks_signals_the_minimum_then_the_final() -> None:
    """SETTINGS(0), SETTINGS(4096), both acknowledged, then a block: the client's decoder evicted x-big at
    the first ACK; the router's encoder must send size updates 0 then 4096 (RFC 7541 4.2: the smallest
    maximum in the interval, then the final), not a reference to x-big (h2: InvalidTableIndex 62)."""
    link = _Link()
    assert link.response(1, _BIG) == _BIG
    link.client_settings(0)
    link.client_settings(4096)
    link.sandbox_ack()
    link.sandbox_ack()
    assert link.response(3, _BIG) == _BIG


def test_one_settings_frame_lowering_then_raising() -> None:
    """One SETTINGS frame with SETTINGS_HEADER_TABLE_SIZE 0 then 4096 (processed in order, RFC 9113 6.5.3):
    the same as two frames for the client's decoder (nghttp2 then expects an update to at most 0)."""
    link = _Link()
    assert link.response(1, _BIG) == _BIG
    link.client_settings(0, 4096)
    link.sandbox_ack()
    assert link.response(3, _BIG) == _BIG


class _Nghttp2Encoder(hpack.Encoder):
    """hpack's encoder with nghttp2's indexing policy (`hd_deflate_should_indexing`): :path, age,
    content-length, etag, if-modified-since, if-none-match, location, set-cookie and any field over 3/4 of
    the table are literals without indexing; the router indexes them all, so its table evicts sooner."""

    _NEVER = frozenset((b":path", b"age", b"content-length", b"etag", b"if-modified-since", b"if-none-match",
                        b"location", b"set-cookie"))  # fmt: skip

    def add(self, to_add: tuple[bytes, bytes], sensitive: bool, huffman: bool = False) -> bytes:
        name, value = to_add
        if name in self._NEVER or len(name) + len(value) + 32 > self.header_table.maxsize * 3 // 4:
            match = self.header_table.search(name, value)
            if match is not None and match[2] is not None:
                return self._encode_indexed(match[0])
            if match is None:
                return self._encode_literal(name, value, INDEX_NONE, huffman)
            return self._encode_indexed_literal(match[0], value, INDEX_NONE, huffman)
        return super().add(to_add, sensitive, huffman)


def test_budget_margin_for_nghttp2_indexing() -> None:
    """The worst legitimate asymmetry found: a server on nghttp2 (h2o, Envoy, nghttpd) sending a 3,000-byte
    header it indexes and a fresh content-length and etag it does not: the router re-emits the big header
    each time its table evicts it. ~15x over 3,000 responses, half the budget's 32x."""
    link = _Link()
    link.sandbox_encoder = _Nghttp2Encoder()
    for i in range(3000):
        headers = [(b":status", b"200"), (b"content-security-policy", b"x" * 3000),
                   (b"content-length", b"%d" % (100000 + i)), (b"etag", b'"%x"' % i)]  # fmt: skip
        assert link.response(2 * i + 1, headers) == headers
    budget = link.down.budget
    assert 10 * budget.received < budget.sent < 20 * budget.received
