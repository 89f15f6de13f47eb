"""HTTP/2 framing for the h2c pass-through (`_h2c`): the client's frames split and its header blocks
re-encoded (`_ClientFrames`), the sandbox's frame boundaries followed (`_FrameBoundary`), frames built.

The byte level of an h2c connection, apart from what the session decides about streams and sandboxes: what
reaches the sandbox of a client block (`_forwarded`), and which frame sequences are refused as malformed.
"""

from __future__ import annotations

import struct
from typing import Any

from ._h2c_hpack import _encoder

__all__ = [
    "_END_HEADERS",
    "_END_STREAM",
    "_GOAWAY",
    "_HEADERS",
    "_MAX_BUFFER",
    "_SETTINGS",
    "_ClientFrames",
    "_FrameBoundary",
    "_forwarded",
    "_frame",
    "_stream_of",
]

_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PUSH_PROMISE, _GOAWAY, _CONTINUATION = (
    0x0,
    0x1,
    0x3,
    0x4,
    0x5,
    0x7,
    0x9,
)
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
_MAX_BUFFER = 1 << 20
_MAX_OPEN_STREAMS = 10_000
"""Client streams the router keeps as open at most (`_ClientFrames.open`): a client cannot have more running
than the sandbox's SETTINGS_MAX_CONCURRENT_STREAMS allows (grpc-go's default has no limit, nghttp2's is
100), but the record must be bounded whatever the sandbox says; a stream beyond it is refused like one
naming another sandbox (GOAWAY, the client retries it on a new connection)."""
_MAX_FRAME = 16384
"""The frame size every HTTP/2 peer accepts (SETTINGS_MAX_FRAME_SIZE's initial value, RFC 9113 6.5.2): the
router re-frames the header blocks it re-encodes to it, whatever the sandbox advertised."""
_NOT_FORWARDED = frozenset(
    (
        # Consumed by the router's authorization, never forwarded (router spec 1.2, 1.5), as on HTTP/1.1.
        b"authorization",
        b"proxy-authorization",
        # Connection-specific: an HTTP/2 request carrying one is malformed (RFC 9113 8.2.2); HTTP/1.1 drops
        # these hop-by-hop headers too. `te` is kept when it is `trailers` (gRPC sends it).
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"upgrade",
    )
)


def _frame(ftype: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack("!I", len(payload))[1:] + bytes((ftype, flags)) + struct.pack("!I", stream) + payload


def _header_fragment(flags: int, payload: bytes) -> bytes:
    """A HEADERS payload without padding and priority fields."""
    start, end = 0, len(payload)
    if flags & _PADDED:
        if not payload:
            raise ValueError("padded HEADERS without pad length")
        end -= payload[0]
        start = 1
    if flags & _PRIORITY:
        start += 5
    if start > end:
        raise ValueError("HEADERS padding/priority longer than the frame")
    return payload[start:end]


def _forwarded(headers: list[Any]) -> list[Any]:
    """The decoded header fields of a client block that go on to the sandbox: all but `_NOT_FORWARDED`
    (credentials, connection-specific fields and the names `connection` lists), in order."""
    drop = _NOT_FORWARDED
    for name, value in headers:
        if name.lower() == b"connection":
            drop = drop | {n.strip().lower() for n in bytes(value).split(b",")}
    return [
        h
        for h in headers
        if (name := h[0].lower()) not in drop and (name != b"te" or h[1].strip().lower() == b"trailers")
    ]


def _header_frames(stream: int, flags: int, priority: bytes, block: bytes) -> bytes:
    """`block` as a HEADERS frame and as many CONTINUATIONs as `_MAX_FRAME` needs: END_STREAM and the
    priority fields of the client's HEADERS (`flags`, `priority`) on the HEADERS frame, END_HEADERS on the last
    frame, no padding (it only hid the block's length, which re-encoding changes anyway)."""
    room = _MAX_FRAME - len(priority)
    rest = block[room:]
    first_flags = (flags & _END_STREAM) | (_PRIORITY if priority else 0) | (0 if rest else _END_HEADERS)
    out = [_frame(_HEADERS, first_flags, stream, priority + block[:room])]
    while rest:
        chunk, rest = rest[:_MAX_FRAME], rest[_MAX_FRAME:]
        out.append(_frame(_CONTINUATION, 0 if rest else _END_HEADERS, stream, chunk))
    return b"".join(out)


class _ClientFrames:
    """Splits the client->server byte stream into frames, decodes every header block and re-encodes it for
    the sandbox without the fields it must not see (`_forwarded`).

    Re-encoding: the router's encoder never uses HPACK's dynamic table (`_StaticEncoder`; every block it
    sends starts with a table size update to 0), so the sandbox's decoder keeps no state the router must
    follow: a block the router drops (a refused stream's) or a SETTINGS_HEADER_TABLE_SIZE the sandbox
    advertises cannot put the two out of step. The client's own encoder state is followed by `decoder`.
    """

    def __init__(self, max_header_list_size: int = _MAX_BUFFER) -> None:
        import hpack

        self.decoder = hpack.Decoder()
        self.decoder.max_allowed_table_size = 1 << 16
        # A header list (RFC 7541 4.1 sizes) up to `--max-request-header-bytes`, as HTTP/1.1 takes a head. The
        # bound stays (an index into a 64 KiB table inflates 1 byte to 64 KiB), but `hpack`'s default, 64 KiB,
        # refused gRPC calls with large metadata that the sandbox's server takes (grpc-go: 16 MiB) and ended
        # the connection with every call on it (until December 6).
        self.decoder.max_header_list_size = max_header_list_size
        self.encoder = _encoder()
        self._buf = b""
        self._block = b""
        self._block_stream = 0
        self._block_flags = 0
        self._block_priority = b""
        self._in_block = False
        self._held: list[bytes] = []
        """Frames of the header block in progress: released with its last one, once it can be checked."""
        self.swallow_ack = True
        self.open: set[int] = set()
        """The client's open streams (RFC 9113 5.1: opened by a HEADERS without END_STREAM, until the client's
        END_STREAM or RST_STREAM): the only ones a header block may follow the request on (trailers)."""
        self.highest = 0
        """The highest stream the client opened: a new stream's id must be above it (RFC 9113 5.1.1)."""
        self.over_cap: int | None = None
        """The first stream opened while `open` held `_MAX_OPEN_STREAMS`: it and every later one are refused
        (`_Session.feed`) and not recorded."""

    def feed(self, data: bytes) -> tuple[list[bytes], list[tuple[int, list[tuple[str, str]]]]]:
        """Consume bytes; returns (complete frames in order, decoded header blocks (stream, headers)).

        Raises:
            ValueError: a header block out of order (RFC 9113 6.2, 6.10: a block is HEADERS on a stream
                then only CONTINUATIONs of that stream up to END_HEADERS), so no block is attributed to a
                stream it does not belong to; hpack errors for blocks that do not decode.
        """
        self._buf += data
        frames: list[bytes] = []
        blocks: list[tuple[int, list[tuple[str, str]]]] = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 9:
            length = int.from_bytes(buf[pos : pos + 3], "big")
            if len(buf) - pos < 9 + length:
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            stream = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            payload = buf[pos + 9 : pos + 9 + length]
            frame = buf[pos : pos + 9 + length]
            pos += 9 + length
            if ftype == _SETTINGS and flags & _ACK and self.swallow_ack:
                # The client's acknowledgement of the router's own SETTINGS: the sandbox never sent
                # those, and an unexpected ACK is a protocol error to it.
                self.swallow_ack = False
                continue
            if ftype == _HEADERS:
                if self._in_block or stream == 0:
                    raise ValueError(f"HEADERS on stream {stream} inside a header block or on stream 0")
                self._headers_on(stream, flags)
                self._block = _header_fragment(flags, payload)
                self._block_stream = stream
                self._block_flags = flags
                if flags & _PRIORITY:
                    start = 1 if flags & _PADDED else 0
                    self._block_priority = payload[start : start + 5]
                else:
                    self._block_priority = b""
            elif ftype == _CONTINUATION:
                if not self._in_block or stream != self._block_stream:
                    raise ValueError(f"CONTINUATION on stream {stream} outside its header block")
                self._block += payload
            elif self._in_block:
                raise ValueError(f"frame type {ftype} inside the header block of stream {self._block_stream}")
            elif ftype == _PUSH_PROMISE:
                # Clients never push (RFC 9113 8.4); its header block, which no check covered, was relayed
                # unparsed (until December 6).
                raise ValueError(f"PUSH_PROMISE from the client on stream {stream}")
            else:
                if (ftype == _DATA and flags & _END_STREAM) or ftype == _RST_STREAM:
                    self.open.discard(stream)
                frames.append(frame)
                continue
            self._in_block = not flags & _END_HEADERS
            self._held.append(frame)
            if len(self._block) > _MAX_BUFFER:  # a CONTINUATION flood
                raise ValueError(f"header block of stream {stream} over {_MAX_BUFFER} bytes")
            if not self._in_block:
                self._held.clear()
                # Raw, then latin-1 (lossless, never fails): gRPC sends `-bin` metadata values as raw
                # bytes (grpc-trace-bin), which a UTF-8 decode refused - and the router dropped the whole
                # connection with every stream on it (until December 6).
                headers = list(self.decoder.decode(self._block, raw=True))
                # Re-encoded, not relayed: relayed unchanged, the client's `authorization` (a ServiceAccount
                # token in tokenreview mode) reached the sandbox (until December 6). The decoded tuples keep
                # the client's never-indexed marks.
                block = self.encoder.encode(_forwarded(headers))
                frames.append(
                    _header_frames(self._block_stream, self._block_flags, self._block_priority, block)
                )
                blocks.append(
                    (
                        self._block_stream,
                        [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in headers],
                    )
                )
                self._block = b""
        self._buf = buf[pos:]
        return frames, blocks

    def _headers_on(self, stream: int, flags: int) -> None:
        """Follow the client's streams through a HEADERS frame (the frames before it, in order, are
        accounted for): a header block reaches the session only as a new stream's request, which it checks,
        or as the trailers of an open stream.

        Raises:
            ValueError: a block on a stream the client has not open, i.e. ended or never opened below the
                highest it opened (RFC 9113 5.1), on an even-numbered stream (clients open odd ones, 5.1.1),
                or a second block on an open stream without END_STREAM (trailers end it, 8.1; a malformed
                request, which 5.4.1 lets the router treat as a connection error). Taken for trailers by
                its id, such a block reached the sandbox with neither the target nor the credential checked
                (until December 6): a compliant server ends the connection for it, one that is not could
                run it as a request.
        """
        if stream in self.open:
            if not flags & _END_STREAM:
                raise ValueError(f"a second header block on stream {stream} without END_STREAM")
            self.open.discard(stream)
            return
        if not stream % 2:
            raise ValueError(f"HEADERS on even-numbered stream {stream}, which a client cannot open")
        if stream <= self.highest:
            if self.over_cap is not None and stream >= self.over_cap:
                return  # a stream refused as over the cap, never recorded: the session drops its blocks
            raise ValueError(
                f"HEADERS on stream {stream}, closed or never opened (the client opened {self.highest})"
            )
        self.highest = stream
        if flags & _END_STREAM:
            return  # opened half-closed: nothing may follow from the client
        if self.over_cap is None and len(self.open) >= _MAX_OPEN_STREAMS:
            self.over_cap = stream
        if self.over_cap is None:
            self.open.add(stream)

    @property
    def buffered(self) -> int:
        return len(self._buf) + sum(map(len, self._held))


class _FrameBoundary:
    """Follows HTTP/2 frame boundaries in the sandbox->client byte stream (frame headers only), so the
    router can put a frame of its own between two of the sandbox's."""

    __slots__ = ("_header", "_skip")

    def __init__(self) -> None:
        self._header = b""
        self._skip = 0

    @property
    def at_boundary(self) -> bool:
        return not self._header and not self._skip

    def feed(self, data: bytes) -> int:
        """Advance over `data`; the offset of the first frame boundary in it (0: at one already), or -1."""
        first = 0 if self.at_boundary else -1
        pos, n = 0, len(data)
        while pos < n:
            if self._skip:
                step = min(self._skip, n - pos)
                self._skip -= step
                pos += step
            else:
                take = min(9 - len(self._header), n - pos)
                self._header += data[pos : pos + take]
                pos += take
                if len(self._header) < 9:
                    continue
                self._skip = int.from_bytes(self._header[:3], "big")
                self._header = b""
            if first < 0 and self.at_boundary:
                first = pos
        return first


def _stream_of(frame: bytes) -> int:
    return int.from_bytes(frame[5:9], "big") & 0x7FFFFFFF
