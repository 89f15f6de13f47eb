"""HTTP/2 framing for the h2c pass-through (`_h2c`): the client's frames split and its header blocks
re-encoded (`_ClientFrames`), the sandbox's frame boundaries followed (`_FrameBoundary`), frames built.

The byte level of an h2c connection, apart from what the session decides about streams and sandboxes: what
reaches the sandbox of a client block (`_forwarded`), and which frame sequences are refused as malformed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from ._h2c_hpack import (
    _TABLE_SIZE,
    FrameSizeError,
    HeaderBudgetExceeded,
    _Budget,
    _HpackSettings,
    _TableEncoder,
)
from ._request import trailer_allowed

__all__ = [
    "_END_HEADERS",
    "_END_STREAM",
    "_GOAWAY",
    "_HEADERS",
    "_MAX_BUFFER",
    "_RST_STREAM",
    "_SETTINGS",
    "_ClientFrames",
    "_ServerFrames",
    "_forwarded",
    "_frame",
    "_goaway_code",
    "_refused_dropped",
    "_stream_of",
]

_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PUSH_PROMISE, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = (
    0x0,
    0x1,
    0x3,
    0x4,
    0x5,
    0x7,
    0x8,
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


def _forwarded(headers: list[Any], trailers: bool = False) -> list[Any]:
    """The decoded header fields of a client block that go on to the sandbox: all but `_NOT_FORWARDED`
    (credentials, connection-specific fields and the names `connection` lists), in order; of a trailer
    section (`trailers`) also none that `trailer_allowed` refuses, as on HTTP/1.1."""
    drop = _NOT_FORWARDED
    for name, value in headers:
        if name.lower() == b"connection":
            drop = drop | {n.strip().lower() for n in bytes(value).split(b",")}
    return [
        h
        for h in headers
        if (name := h[0].lower()) not in drop
        and (name != b"te" or h[1].strip().lower() == b"trailers")
        and (not trailers or trailer_allowed(name))
    ]


def _trailer_fields(headers: list[Any]) -> list[Any]:
    """A sandbox trailer section as it goes on to the client: without the fields `trailer_allowed` refuses,
    as on HTTP/1.1 (pseudo-header fields too: a trailer section has none, RFC 9113 8.1)."""
    return [h for h in headers if trailer_allowed(name := bytes(h[0]).lower()) and not name.startswith(b":")]


def _goaway_code(exc: BaseException) -> int:
    """The GOAWAY error code for what ended a direction's frames: ENHANCE_YOUR_CALM (0xb) for a header list
    over the router's cap or re-encoded blocks over their budget (limits of the router, not errors of the
    peer's encoding), COMPRESSION_ERROR (0x9) for a block that does not decode (RFC 9113 4.3),
    FRAME_SIZE_ERROR (0x6) for a SETTINGS frame of a wrong length (6.5), else PROTOCOL_ERROR (0x1)."""
    import hpack

    if isinstance(exc, HeaderBudgetExceeded | hpack.OversizedHeaderListError):
        return 0xB
    if isinstance(exc, FrameSizeError):
        return 0x6
    return 0x9 if isinstance(exc, hpack.HPACKError) else 0x1


def _new_decoder(max_header_list_size: int) -> Any:
    import hpack

    decoder = hpack.Decoder()
    decoder.max_allowed_table_size = _TABLE_SIZE
    decoder.max_header_list_size = max_header_list_size
    return decoder


def _header_frames(stream: int, flags: int, priority: bytes, block: bytes, ftype: int = _HEADERS) -> bytes:
    """`block` as a HEADERS frame and as many CONTINUATIONs as `_MAX_FRAME` needs: END_STREAM and the
    priority fields of the client's HEADERS (`flags`, `priority`) on the HEADERS frame, END_HEADERS on the last
    frame, no padding (it only hid the block's length, which re-encoding changes anyway). A PUSH_PROMISE
    (`ftype`) carries its promised stream id in `priority`'s place."""
    room = _MAX_FRAME - len(priority)
    rest = block[room:]
    if ftype == _HEADERS:
        first_flags = (flags & _END_STREAM) | (_PRIORITY if priority else 0) | (0 if rest else _END_HEADERS)
    else:
        first_flags = 0 if rest else _END_HEADERS
    out = [_frame(ftype, first_flags, stream, priority + block[:room])]
    while rest:
        chunk, rest = rest[:_MAX_FRAME], rest[_MAX_FRAME:]
        out.append(_frame(_CONTINUATION, 0 if rest else _END_HEADERS, stream, chunk))
    return b"".join(out)


def _hpack_side(
    max_header_list_size: int, settings: _HpackSettings | None
) -> tuple[Any, _TableEncoder, _HpackSettings, _Budget]:
    """One direction's HPACK state: its decoder (header lists up to `max_header_list_size`), the router's
    encoder, the connection's table sizes (`settings`, shared with the other direction) and its budget."""
    return (
        _new_decoder(max_header_list_size),
        _TableEncoder(),
        settings if settings is not None else _HpackSettings(),
        _Budget(),
    )


class _ClientFrames:
    """Splits the client->server byte stream into frames, decodes every header block and re-encodes it for
    the sandbox without the fields it must not see (`_forwarded`).

    Re-encoding: the router's encoder (`_TableEncoder`) keeps a dynamic table of its own, as large as the
    sandbox's SETTINGS_HEADER_TABLE_SIZE allows (at most `_TABLE_SIZE`; `settings`), so it must encode every
    block the sandbox receives and no other: a block the session drops (a refused stream's) is never
    encoded (`feed`'s `admit`). The client's own encoder state is followed by `decoder`; the client's
    SETTINGS are relayed with their table size lowered to `_TABLE_SIZE`.
    """

    def __init__(
        self, max_header_list_size: int = _MAX_BUFFER, settings: _HpackSettings | None = None
    ) -> None:
        # A header list (RFC 7541 4.1 sizes) up to `--max-request-header-bytes`, as HTTP/1.1 takes a head:
        # `hpack`'s default, 64 KiB, refused gRPC calls with large metadata that the sandbox's server takes
        # (grpc-go: 16 MiB) and ended the connection with every call on it (until December 6).
        self.decoder, self.encoder, self.settings, self.budget = _hpack_side(max_header_list_size, settings)
        self._buf = b""
        self._block = b""
        self._block_stream = 0
        self._block_flags = 0
        self._block_priority = b""
        self._block_trailers = False
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

    def feed(
        self, data: bytes, admit: Callable[[int, list[tuple[str, str]]], bool] | None = None
    ) -> tuple[list[bytes], list[tuple[int, list[tuple[str, str]]]]]:
        """Consume bytes; returns (complete frames in order, decoded header blocks (stream, headers)).

        `admit` (stream, headers) decides, block by block as decoded, whether the block goes on to the
        sandbox: one it refuses is left out of the frames and never encoded, so the router's dynamic table
        stays the sandbox's. Without it all go on, and the decoded blocks are returned; with it none are
        (each is the caller's as it is decoded: kept for the whole read, a read of 1-byte references to a
        4 KB entry held ~240 MB of copies).

        Raises:
            ValueError: a header block out of order (RFC 9113 6.2, 6.10: a block is HEADERS on a stream
                then only CONTINUATIONs of that stream up to END_HEADERS), so no block is attributed to a
                stream it does not belong to; hpack errors for blocks that do not decode;
                `HeaderBudgetExceeded`.
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
            if ftype in (_HEADERS, _CONTINUATION):
                self.budget.received += length
            if ftype == _HEADERS:
                if self._in_block or stream == 0:
                    raise ValueError(f"HEADERS on stream {stream} inside a header block or on stream 0")
                self._block_trailers = self._headers_on(stream, flags)
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
                elif ftype == _SETTINGS and not stream:
                    if flags & _ACK:
                        self.settings.sandbox.acknowledged()
                    else:
                        frame = frame[:9] + self.settings.client.relayed(payload)
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
                tables = self.settings.sandbox
                self.decoder.max_allowed_table_size = tables.decoder_limit
                headers = list(self.decoder.decode(self._block, raw=True))
                self._block = b""
                decoded = [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in headers]
                if admit is None:
                    blocks.append((self._block_stream, decoded))
                elif not admit(self._block_stream, decoded):
                    continue
                # Re-encoded, not relayed: relayed unchanged, the client's `authorization` (a ServiceAccount
                # token in tokenreview mode) reached the sandbox (until December 6). The decoded tuples keep
                # the client's never-indexed marks. Trailers are filtered as HTTP/1.1's (`trailer_allowed`):
                # until December 7 a trailing `x-sandbox-namespace` or `x-sandbox-pod-ip` reached the sandbox.
                self.encoder.follow(tables)
                block = self.encoder.encode_block(_forwarded(headers, self._block_trailers))
                self.budget.spend(len(block))
                frames.append(
                    _header_frames(self._block_stream, self._block_flags, self._block_priority, block)
                )
        self._buf = buf[pos:]
        return frames, blocks

    def _headers_on(self, stream: int, flags: int) -> bool:
        """Follow the client's streams through a HEADERS frame (the frames before it, in order, are
        accounted for): a header block reaches the session only as a new stream's request, which it checks,
        or as the trailers of an open stream (True).

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
            return True
        if not stream % 2:
            raise ValueError(f"HEADERS on even-numbered stream {stream}, which a client cannot open")
        if stream <= self.highest:
            if self.over_cap is not None and stream >= self.over_cap:
                return False  # a stream refused as over the cap, never recorded: the session drops its blocks
            raise ValueError(
                f"HEADERS on stream {stream}, closed or never opened (the client opened {self.highest})"
            )
        self.highest = stream
        if flags & _END_STREAM:
            return False  # opened half-closed: nothing may follow from the client
        if self.over_cap is None and len(self.open) >= _MAX_OPEN_STREAMS:
            self.over_cap = stream
        if self.over_cap is None:
            self.open.add(stream)
        return False

    @property
    def buffered(self) -> int:
        return len(self._buf) + sum(map(len, self._held))


class _ServerFrames:
    """The sandbox->client byte stream, frame by frame: every frame but those of a header block is relayed
    as it arrives (DATA is never held), and the router may put a frame of its own between two of them
    (`at_boundary`); a header block (HEADERS or PUSH_PROMISE, and its CONTINUATIONs) is held whole, decoded
    and re-encoded, a trailer section without the fields `trailer_allowed` refuses (`_trailer_fields`).

    Every block is re-encoded, heads too, not the trailers alone: the client's decoder follows the sandbox's
    HPACK dynamic table, and a block replaced by another leaves out the entries it added, which the
    sandbox's later blocks may name. The router's encoder keeps a table of its own towards the client
    (`_TableEncoder`, sized by the client's SETTINGS_HEADER_TABLE_SIZE, `settings`). SETTINGS frames are held
    too, until whole: the sandbox's are relayed with their table size lowered to `_TABLE_SIZE`, and its ACKs
    tell when the client's own setting took effect.

    A HEADERS block is a trailer section when it follows the stream's final (non-1xx) response head
    (`_answered`), or has no pseudo-header field (a stream the record no longer holds).
    """

    def __init__(
        self, max_header_list_size: int = _MAX_BUFFER, settings: _HpackSettings | None = None
    ) -> None:
        self.decoder, self.encoder, self.settings, self.budget = _hpack_side(max_header_list_size, settings)
        self._answered: dict[int, None] = {}
        """Streams whose final response head went to the client and which the sandbox has not ended yet,
        oldest first; at most `_MAX_OPEN_STREAMS` (the client's resets are not seen here)."""
        self._header = b""
        """A frame header not yet complete (held: nothing of the frame is relayed before its type is known)."""
        self._skip = 0
        """Bytes still to relay of the frame being relayed."""
        self._frame_header = b""
        self._need = 0
        """Payload bytes still to come of the header-block frame being held (`_frame_header`)."""
        self._payload = b""
        self._block = b""
        self._block_type = 0
        self._block_stream = 0
        self._block_flags = 0
        self._block_prefix = b""
        self._in_block = False
        self.failed: Exception | None = None
        """Why the relay stopped: the sandbox's frames stopped being HTTP/2 (`feed`)."""
        self.on_stream_answered: Callable[[int], None] | None = None
        """Told of each stream's final (non-1xx) response head, as it goes to the client: lifecycle activity
        counts a stream as in use until then (`_h2c._Session.awaiting_response`)."""
        self.on_stream_end: Callable[[int], None] | None = None
        """Told of each stream the sandbox ends (END_STREAM, RST_STREAM): the session's drain waits for them.
        Told before the frame is relayed whole: what was relayed ends with it once `at_boundary`."""

    @property
    def at_boundary(self) -> bool:
        """Whether what was relayed so far ends between two frames (a held frame was relayed in none of it)."""
        return not self._skip

    def feed(self, data: bytes) -> tuple[bytes, int]:
        """Take the sandbox's next bytes: (what to relay to the client, the offset in it of its first frame
        boundary (0: at one already) or -1).

        A failure ends the relay at the frame before it (`failed`, then every later read is b""): frames out
        of order in a header block (RFC 9113 6.2, 6.10), a block over `_MAX_BUFFER` bytes (ValueError), a
        block that does not decode (hpack's errors), re-encoded blocks over budget (`HeaderBudgetExceeded`).
        """
        out: list[bytes] = []
        size = 0
        first = 0 if self.at_boundary else -1
        if self.failed is not None:
            return b"", first
        try:
            first, size = self._feed(data, out, first, size)
        except Exception as exc:
            self.failed = exc
        return b"".join(out), first

    def _feed(self, data: bytes, out: list[bytes], first: int, size: int) -> tuple[int, int]:
        pos, n = 0, len(data)
        while pos < n:
            if self._skip:
                step = min(self._skip, n - pos)
                out.append(data[pos : pos + step])
                size += step
                self._skip -= step
                pos += step
            elif self._frame_header:
                step = min(self._need, n - pos)
                self._payload += data[pos : pos + step]
                self._need -= step
                pos += step
            else:
                take = min(9 - len(self._header), n - pos)
                self._header += data[pos : pos + take]
                pos += take
                if len(self._header) < 9:
                    continue
                header, self._header = self._header, b""
                length, ftype = int.from_bytes(header[:3], "big"), header[3]
                if (ftype == _DATA and header[4] & _END_STREAM) or ftype == _RST_STREAM:
                    ended = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
                    self._answered.pop(ended, None)
                    if self.on_stream_end is not None:
                        self.on_stream_end(ended)
                if self._in_block or ftype in (_HEADERS, _PUSH_PROMISE, _CONTINUATION, _SETTINGS):
                    if len(self._block) + length > _MAX_BUFFER:
                        raise ValueError(f"a header block from the sandbox over {_MAX_BUFFER} bytes")
                    self._frame_header, self._need, self._payload = header, length, b""
                else:
                    out.append(header)
                    size += 9
                    self._skip = length
            if self._frame_header and not self._need:
                block = self._take(self._frame_header, self._payload)
                self._frame_header, self._payload = b"", b""
                out.append(block)
                size += len(block)
            if first < 0 and self.at_boundary:
                first = size
        return first, size

    def _take(self, header: bytes, payload: bytes) -> bytes:
        """One whole frame of a header block: b"" until its END_HEADERS, then the block's frames, re-encoded; or
        a SETTINGS frame, relayed (its table size lowered, `_TableSetting.relayed`)."""
        ftype, flags = header[3], header[4]
        stream = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
        if ftype == _SETTINGS and not self._in_block:
            if stream:
                raise ValueError(f"SETTINGS on stream {stream}")
            if flags & _ACK:
                self.settings.client.acknowledged()
                return header + payload
            return header + self.settings.sandbox.relayed(payload)
        self.budget.received += len(payload)  # a header-block frame's
        if ftype == _CONTINUATION:
            if not self._in_block or stream != self._block_stream:
                raise ValueError(f"CONTINUATION on stream {stream} outside a header block")
            self._block += payload
        elif self._in_block:
            raise ValueError(f"frame type {ftype} inside the header block of stream {self._block_stream}")
        else:
            self._block_type, self._block_stream, self._block_flags = ftype, stream, flags
            if ftype == _HEADERS:
                self._block = _header_fragment(flags, payload)
                start = 1 if flags & _PADDED else 0
                self._block_prefix = payload[start : start + 5] if flags & _PRIORITY else b""
            else:  # PUSH_PROMISE: [pad length] promised stream id, fragment, [padding] (RFC 9113 6.6)
                start, end = (
                    (1, len(payload) - payload[0]) if flags & _PADDED and payload else (0, len(payload))
                )
                if end < start + 4:
                    raise ValueError("PUSH_PROMISE shorter than its promised stream id and padding")
                self._block_prefix, self._block = payload[start : start + 4], payload[start + 4 : end]
        self._in_block = not flags & _END_HEADERS
        if self._in_block:
            return b""
        block, self._block = self._block, b""
        tables = self.settings.client
        self.decoder.max_allowed_table_size = tables.decoder_limit
        headers = list(self.decoder.decode(block, raw=True))
        if self._block_type == _HEADERS:
            headers = self._response_block(headers)
            if self._block_flags & _END_STREAM and self.on_stream_end is not None:
                self.on_stream_end(self._block_stream)  # a trailer section, or a trailers-only response
        self.encoder.follow(tables)
        encoded = self.encoder.encode_block(headers)
        self.budget.spend(len(encoded))
        return _header_frames(
            self._block_stream, self._block_flags, self._block_prefix, encoded, self._block_type
        )

    def _response_block(self, headers: list[Any]) -> list[Any]:
        """A sandbox HEADERS block as it goes on to the client: a trailer section filtered (`_trailer_fields`),
        a response head whole. By the stream's state, not the block's fields alone: a sandbox that put
        `:status` in its trailers got any field past the filter (until December 7)."""
        stream, answered = self._block_stream, self._answered
        if stream in answered or not any(bytes(name).startswith(b":") for name, _ in headers):
            answered.pop(stream, None)  # trailers end the stream
            return _trailer_fields(headers)
        status = next((bytes(v) for n, v in headers if bytes(n) == b":status"), b"")
        if not status.startswith(b"1") and self.on_stream_answered is not None:
            self.on_stream_answered(stream)
        if not status.startswith(b"1") and not self._block_flags & _END_STREAM:
            answered[stream] = None
            if len(answered) > _MAX_OPEN_STREAMS:
                del answered[next(iter(answered))]
        return headers


def _stream_of(frame: bytes) -> int:
    return int.from_bytes(frame[5:9], "big") & 0x7FFFFFFF


def _refused_dropped(frames: list[bytes], above: int) -> tuple[list[bytes], bytes]:
    """The client's frames of a read without those of the refused streams (odd ids above `above`, the last
    stream accepted), and the WINDOW_UPDATE(s) on stream 0 that give the client back the connection-level
    send window its dropped DATA frames took.

    A dropped DATA frame never reaches the sandbox, so the sandbox never returns its window; the router,
    which discarded it, must (RFC 9113 6.9: a receiver accounts for the flow-controlled frames it
    discards; Go's x/net/http2 does so for closed and refused streams). Its whole payload counts, padding
    included (6.9.1). No stream-level update: the stream is refused. Until December 7, after 64 KiB of
    DATA on refused streams (the initial window) every stream of the connection stalled.
    """
    kept: list[bytes] = []
    released = 0
    for frame in frames:
        stream = _stream_of(frame)
        if stream > above and stream % 2:
            if frame[3] == _DATA:
                released += int.from_bytes(frame[:3], "big")
        else:
            kept.append(frame)
    updates: list[bytes] = []
    while released:  # none for empty DATA frames: an increment of 0 is a PROTOCOL_ERROR (6.9)
        step = min(released, 0x7FFFFFFF)
        updates.append(_frame(_WINDOW_UPDATE, 0, 0, struct.pack("!I", step)))
        released -= step
    return kept, b"".join(updates)
