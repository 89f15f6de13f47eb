"""HPACK state of the h2c pass-through (`_h2c`): the router's encoders, the table sizes each peer allows, and
the budget on what re-encoding may add (docs/design/router-h2c-hpack.md).

The router decodes every header block and encodes it again (to drop fields), so it is an HPACK peer of both
sides. Its encoders keep a dynamic table as the sending peer's did, because one without (until December 7)
turned a peer's 1-byte reference to a 4 KB table entry into 4 KB of literal: 66 KB in came out as 240 MB,
blocking the event loop for seconds, from a client whose credential was not checked yet.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import hpack
from hpack.hpack import INDEX_INCREMENTAL, INDEX_NEVER, INDEX_NONE

__all__ = [
    "_TABLE_SIZE",
    "FrameSizeError",
    "HeaderBudgetExceeded",
    "_Budget",
    "_HpackSettings",
    "_TableEncoder",
    "_TableSetting",
]

_TABLE_SIZE = 4096
"""The largest dynamic table the router keeps, encoding or decoding, per connection and direction: HPACK's
initial size (RFC 9113 6.5.2), which grpc-go, grpcio, nghttp2 and Go's encoders do not go beyond anyway. A
peer's SETTINGS_HEADER_TABLE_SIZE is relayed lowered to it, so neither side's encoder uses more."""

_SENSITIVE = frozenset((b"authorization", b"proxy-authorization"))
"""Encoded never-indexed whatever the sender marked (RFC 7541 7.1.3): credentials."""

_PENDING_SETTINGS = 1000
"""SETTINGS frames of one peer that the other has not acknowledged, at most: the record is bounded."""

_HEADER_SETTING = 0x1


class FrameSizeError(ValueError):
    """A frame whose length its type does not allow (a SETTINGS payload not a multiple of 6): GOAWAY with
    FRAME_SIZE_ERROR (RFC 9113 6.5), not PROTOCOL_ERROR."""


class HeaderBudgetExceeded(Exception):
    """Re-encoded header blocks outgrew the bytes they came from (`_Budget`): GOAWAY(ENHANCE_YOUR_CALM)."""


class _Budget:
    """Re-encoded header-block bytes against header-block bytes received, in one direction of a connection.

    With both tables in step (`_TableEncoder`), a block comes out about as large as it came in: up to ~1.6x
    for a lack of Huffman coding (8-bit literals for 5-bit codes), less where the router drops fields. What
    remains is the two tables holding different entries (the router indexes fields the peer sent unindexed,
    and evicts sooner): a crafted pattern gets ~400x out of it (a 1-byte reference to an entry the router's
    table just evicted). So output may be `RATIO` times the input plus `SLACK`, far above legitimate traffic
    and bounding what a peer gets for its bytes.
    """

    RATIO = 32
    SLACK = 1 << 20

    __slots__ = ("received", "sent")

    def __init__(self) -> None:
        self.received = 0
        self.sent = 0

    def spend(self, size: int) -> None:
        self.sent += size
        if self.sent > self.RATIO * self.received + self.SLACK:
            raise HeaderBudgetExceeded(
                f"{self.sent} bytes of re-encoded header blocks for {self.received} received"
            )


class _TableSetting:
    """One peer's SETTINGS_HEADER_TABLE_SIZE (the size of its decoder's table), as its SETTINGS frames and the
    other side's acknowledgements pass the router: values as relayed, i.e. at most `_TABLE_SIZE`.

    An encoder may use a new value once the SETTINGS frame is acknowledged (RFC 9113 6.5.3); until then it may
    still use the old one. So the router's encoder towards the peer uses the smallest of the acknowledged and
    pending values (a decrease is signalled at once, which any decoder accepts, an increase once
    acknowledged), and the router's decoder of the other side, whose encoder the relayed value bounds, takes
    the largest.

    A decoder applies each acknowledged value in order, and a smaller one evicts its table at once (nghttp2,
    so curl and Envoy), so a size lowered and raised again before the router's next block - in two frames or
    in one - must still reach it as the smallest, then the final (RFC 7541 4.2): `lowest` keeps the smallest
    the encoder's limit went down to since its last block (`for_block`).
    """

    __slots__ = ("acked", "lowest", "pending")

    def __init__(self) -> None:
        self.acked = _TABLE_SIZE
        self.pending: deque[tuple[int, int] | None] = deque()
        """Per unacknowledged SETTINGS frame: (its smallest table size, its last), or None without one."""
        self.lowest = _TABLE_SIZE

    def advertised(self, value: int | None, smallest: int | None = None) -> None:
        if len(self.pending) >= _PENDING_SETTINGS:
            raise ValueError(f"over {_PENDING_SETTINGS} SETTINGS frames unacknowledged")
        self.pending.append(None if value is None else (value if smallest is None else smallest, value))
        self.lowest = min(self.lowest, self.encoder_limit)

    def acknowledged(self) -> None:
        if self.pending:  # an ACK with nothing to acknowledge is the peer's error, not the router's to track
            sizes = self.pending.popleft()
            if sizes is not None:
                self.lowest = min(self.lowest, sizes[0])
                self.acked = sizes[1]

    @property
    def encoder_limit(self) -> int:
        if not self.pending:
            return self.acked
        return min((self.acked, *(v[0] for v in self.pending if v is not None)))

    @property
    def decoder_limit(self) -> int:
        if not self.pending:
            return self.acked
        return max((self.acked, *(max(v) for v in self.pending if v is not None)))

    def for_block(self) -> tuple[int, int]:
        """(the smallest limit since the last block, the limit now) for the block about to be encoded."""
        final = self.encoder_limit
        lowest, self.lowest = min(self.lowest, final), final
        return lowest, final

    def relayed(self, payload: bytes) -> bytes:
        """A SETTINGS frame's payload as relayed: SETTINGS_HEADER_TABLE_SIZE lowered to `_TABLE_SIZE` (the
        router's decoder takes no more), the rest unchanged; the frame's values recorded (`advertised`)."""
        if len(payload) % 6:
            raise FrameSizeError(f"SETTINGS payload of {len(payload)} bytes, not a multiple of 6")
        value: int | None = None
        smallest: int | None = None
        out = bytearray(payload)
        for at in range(0, len(payload), 6):
            if int.from_bytes(payload[at : at + 2], "big") == _HEADER_SETTING:
                value = min(int.from_bytes(payload[at + 2 : at + 6], "big"), _TABLE_SIZE)
                smallest = value if smallest is None else min(smallest, value)
                out[at + 2 : at + 6] = value.to_bytes(4, "big")
        self.advertised(value, smallest)
        return bytes(out)


class _HpackSettings:
    """The table sizes of one h2c connection, shared by its two directions (`_ClientFrames` sees the client's
    SETTINGS and its ACKs of the sandbox's, `_ServerFrames` the reverse)."""

    __slots__ = ("client", "sandbox")

    def __init__(self) -> None:
        self.client = _TableSetting()
        """The client's decoder: bounds the router's encoder of sandbox blocks and the sandbox's encoder."""
        self.sandbox = _TableSetting()
        """The sandbox's decoder: bounds the router's encoder of client blocks and the client's encoder."""


class _TableEncoder(hpack.Encoder):
    """`hpack.Encoder` with the dynamic table, no Huffman coding, and credentials never indexed.

    Indexes every field that fits the table (Go's policy; a field larger than the table is a literal without
    indexing rather than one that empties it), so a field the peer repeats costs a byte or two again after the
    router, as it did before it. No Huffman coding: it was nearly all of `hpack`'s encoding time (~80 us a
    gRPC block); the literals are ~30% larger, on the pod network. One per connection and direction.
    """

    def __init__(self) -> None:
        super().__init__()

    def follow(self, setting: _TableSetting) -> None:
        """Use the table `setting` allows from the next block on, signalling the smallest it went down to
        since the last block first (RFC 7541 4.2), as the decoder evicted at that size."""
        lowest, final = setting.for_block()
        self.limit(lowest)
        self.limit(final)

    def limit(self, size: int) -> None:
        """Use a table of at most `size` bytes from the next block on (which then starts with the update)."""
        if size != self.header_table.maxsize:
            self.header_table_size = size
            changes = self.table_size_changes
            if len(changes) > 2:  # RFC 7541 4.2: the smallest, then the final, is all a decoder needs
                smallest, final = min(changes), changes[-1]
                changes[:] = [smallest, final] if smallest != final else [final]

    def encode_block(self, headers: list[Any]) -> bytes:
        """`headers` (decoded tuples of bytes: `hpack.NeverIndexedHeaderTuple` keeps its mark) as a header
        block. `hpack.Encoder.encode`'s per-field type handling and logging skipped: they were half the cost."""
        out = []
        table = self.header_table
        if table.resized:
            out.append(self._encode_table_size_change())
            table.resized = False
        add, never = self.add, hpack.NeverIndexedHeaderTuple
        for field in headers:
            out.append(add((field[0], field[1]), type(field) is never))
        return b"".join(out)

    def add(self, to_add: tuple[bytes, bytes], sensitive: bool, huffman: bool = False) -> bytes:
        name, value = to_add
        sensitive = sensitive or name in _SENSITIVE
        match = self.header_table.search(name, value)
        if match is not None and match[2] is not None and not sensitive:
            index = match[0]
            return bytes((0x80 | index,)) if index < 0x7F else self._encode_indexed(index)
        index = not sensitive and len(name) + len(value) + 32 <= self.header_table.maxsize
        bit = INDEX_INCREMENTAL if index else INDEX_NEVER if sensitive else INDEX_NONE
        if match is None:
            encoded = self._encode_literal(name, value, bit, huffman)
        else:
            encoded = self._encode_indexed_literal(match[0], value, bit, huffman)
        if index:
            self.header_table.add(name, value)
        return encoded
