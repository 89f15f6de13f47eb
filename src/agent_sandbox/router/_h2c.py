"""Prior-knowledge h2c (HTTP/2 without TLS, e.g. gRPC) pass-through, behind `--enable-h2c`.

Upstream's router cannot carry sandboxd's gRPC process API (router spec §2.2.2); this can. A client opts
in by speaking plaintext HTTP/2 with prior knowledge to the proxy port (gRPC's default for `http://`
targets) and sending the routing headers as request metadata (`x-sandbox-id`, `x-sandbox-namespace`,
`x-sandbox-port` — e.g. 9090 for sandboxd — and optionally `x-sandbox-pod-ip`, `x-sandbox-uid`,
`authorization`).

How: the router answers the client's preface with an empty SETTINGS frame (and later drops the client's
ACK of it, which the sandbox must not see); the connection preface and frames are buffered until the first HEADERS block (with its
CONTINUATIONs) is complete; it is HPACK-decoded, the routing headers are validated, authorized and
resolved exactly as for HTTP/1.1, and the router dials the sandbox (dial-phase failures retried with
re-resolution as for HTTP/1.1, see `_Session._dial`; the sandbox's own SETTINGS, which it sends on accept and
which may be read before the tunnel is attached, are kept for it; with `--sandbox-lifecycle` the first
stream is activity and is held while its Sandbox resumes, as an HTTP/1.1 request) and replays the buffered bytes. From
then on frames are relayed unchanged, except the client's header blocks: every one is decoded (HPACK state
is per connection) and re-encoded for the sandbox without `authorization` (router spec 1.5: never
forwarded) and the connection-specific fields, by an encoder that keeps no dynamic table (`_StaticEncoder`,
docs/design/router-h2c-hpack.md). A block is either a new stream's request (checked, below) or the trailers
of a stream the client still has open (`_ClientFrames.open`); any other, and a client PUSH_PROMISE, ends the
connection with GOAWAY(PROTOCOL_ERROR). A connection is pinned to one sandbox, and a stream that names another
target (sandbox ID, namespace, port, Pod IP or UID; see `_PINNED_FIELDS`) or a credential that no longer
verifies (each stream's own: the first stream's check is never made with a later one's) is refused with
a GOAWAY naming the last
accepted stream: none of its frames, nor those of any later stream, reach the sandbox, the accepted
streams finish, and the client retries the refused ones on a new connection (gRPC does this by itself,
once per call), which is then pinned to the other sandbox. One connection per sandbox, as with HTTP/1.1
(docs/router.md: use a channel with its own connection per sandbox). Streams the server opens, DATA,
SETTINGS etc. pass through untouched; the router's own frames go between two of the sandbox's. Refusals before dialling are answered as
HTTP/2 responses; for gRPC requests as a trailers-only response with the matching `grpc-status`
(400 -> INVALID_ARGUMENT, 401 -> UNAUTHENTICATED, 403 -> PERMISSION_DENIED, 502 -> UNAVAILABLE,
504 -> DEADLINE_EXCEEDED) and the detail text as `grpc-message`.

`x-sandbox-timeout` is not applied on h2c (nor validated; it is forwarded as metadata): a stream's deadline
is gRPC's own `grpc-timeout`, which client and sandbox enforce. Ending one stream of a multiplexed connection
the router only inspects would mean answering it with a header block of the router's own in the sandbox's
HPACK context and dropping the sandbox's later frames for it, i.e. terminating HTTP/2 (docs/router.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
import time
from typing import TYPE_CHECKING, Any

import orjson

from ..api.errortext import describe_error
from ._fdlimit import EXHAUSTED_DETAIL
from ._lifecycle import MAX_HOLDS
from ._resolve import Target
from ._routing import HEADER_TIMEOUT, Route, RouteError, parse_route
from ._server import H2C_PREFACE, ClientConnection
from ._tunnel import Tunnel
from ._upstream import UpstreamConnection

if TYPE_CHECKING:
    from ._proxy import Proxy

__all__ = ["PREFACE", "H2cPassThrough"]

log = logging.getLogger("agent_sandbox.router.h2c")

PREFACE = H2C_PREFACE
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
_TABLE_SIZE_ZERO = b"\x20"
"""HPACK dynamic table size update to 0 (RFC 7541 6.3), at the start of every re-encoded block: a decoder
whose SETTINGS_HEADER_TABLE_SIZE went below its current table size expects one (nghttp2 and hpack refuse the
block otherwise), and 0 is within any setting."""
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
_GRPC_STATUS = {400: 3, 401: 16, 403: 7, 413: 8, 429: 8, 502: 14, 503: 14, 504: 4}


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


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) in a `prefix_bits` prefix, the octet's other bits from `first`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _StaticEncoder:
    """HPACK encoding without the dynamic table: a field the static table holds whole is indexed, every other
    one is a literal without indexing (RFC 7541 6.2.2; never indexed, 6.2.3, when the client marked it so),
    its name indexed when the static table has it; no Huffman coding.

    Nothing is indexed, so the sandbox's decoder keeps no state the router must follow (docs/design/
    router-h2c-hpack.md). Not `hpack.Encoder`: with a zero-size table it cost 80 us a gRPC request block, nearly
    all Huffman coding; this costs a few (a block is ~30% larger, on the pod network).
    """

    def __init__(self) -> None:
        from hpack import NeverIndexedHeaderTuple
        from hpack.table import HeaderTable

        self._never = NeverIndexedHeaderTuple
        self._fields: dict[tuple[bytes, bytes], bytes] = {}
        """(name, value) -> its indexed representation, for the static table's fields."""
        self._plain: dict[bytes, bytes] = {}
        """name -> the start of a literal without indexing naming it (by static index, else literally)."""
        self._sensitive: dict[bytes, bytes] = {}
        """name -> the same for a never-indexed literal."""
        for index, (name, value) in enumerate(HeaderTable.STATIC_TABLE, 1):
            self._fields.setdefault((name, value), _hpack_int(index, 7, 0x80))
            self._plain.setdefault(name, _hpack_int(index, 4, 0x00))
            self._sensitive.setdefault(name, _hpack_int(index, 4, 0x10))
        self._static_names = len(self._plain)

    def _literal_name(self, name: bytes, names: dict[bytes, bytes], flag: int) -> bytes:
        prefix = bytes((flag,)) + _hpack_int(len(name), 7, 0) + name
        # Metadata names repeat, so they are kept; bounded in number and length all the same: the encoder is
        # shared by every connection, any client (before its credential is checked) picks the names, and one
        # may be as long as a header list (1,024 names of 4 KB held ~8 MB for good until December 6).
        if len(name) <= 128 and len(names) < self._static_names + 1024:
            names[name] = prefix
        return prefix

    def encode(self, headers: list[Any]) -> bytes:
        """A header block: a table size update to 0, then `headers` (bytes pairs, as `hpack` decodes them)."""
        out = [_TABLE_SIZE_ZERO]
        fields, plain, sensitive, never = self._fields, self._plain, self._sensitive, self._never
        for field in headers:
            name, value = field[0], field[1]
            if type(field) is never:
                prefix = sensitive.get(name) or self._literal_name(name, sensitive, 0x10)
            else:
                indexed = fields.get((name, value))
                if indexed is not None:
                    out.append(indexed)
                    continue
                prefix = plain.get(name) or self._literal_name(name, plain, 0x00)
            size = len(value)
            out += (prefix, bytes((size,)) if size < 0x7F else _hpack_int(size, 7, 0), value)
        return b"".join(out)


@functools.cache
def _encoder() -> _StaticEncoder:
    """The one encoder (it has no state: any connection may use it)."""
    return _StaticEncoder()


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


def _routing(headers: list[tuple[str, str]]) -> tuple[dict[bytes, bytes], set[bytes], bytes | None]:
    routing: dict[bytes, bytes] = {}
    dups: set[bytes] = set()
    authorization: bytes | None = None
    for name, value in headers:
        key = name.lower().encode("latin-1")
        if key == HEADER_TIMEOUT:
            # Not applied on h2c (docs/router.md): a call's deadline is gRPC's own `grpc-timeout`. So neither
            # validated nor part of the route; it reaches the sandbox as ordinary metadata (as the Go router
            # forwards and ignores it).
            continue
        if key.startswith(b"x-sandbox-"):
            if key in routing:
                dups.add(key)
            routing.setdefault(key, value.encode("latin-1"))
        elif key == b"authorization" and authorization is None:
            authorization = value.encode("latin-1")  # the first, as Go's Header.Get
    return routing, dups, authorization


class _OutOfDescriptors(RouteError):
    """The dial failed for want of descriptors (503 with `Retry-After`, as the HTTP/1.1 path answers)."""


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


_PINNED_FIELDS = ("sandbox_id", "namespace", "port", "pod_ip", "uid")
"""The `Route` fields a connection is pinned to: those that select the sandbox to dial (the credential,
`authorization`, is checked per stream on its own). Not `timeout`: it selects nothing (and is not read on h2c).
A field added to `Route` must be decided on here (tests/unit/router/test_h2c_pin.py fails until it is)."""


def _pin_of(route: Route) -> tuple[object, ...]:
    """What of `route` a later stream on the connection must repeat to be forwarded (`_PINNED_FIELDS`)."""
    return tuple(getattr(route, name) for name in _PINNED_FIELDS)


def _stream_of(frame: bytes) -> int:
    return int.from_bytes(frame[5:9], "big") & 0x7FFFFFFF


class _Session:
    """One h2c connection from preface to close."""

    def __init__(self, proxy: Proxy, conn: ClientConnection) -> None:
        self.proxy = proxy
        self.conn = conn
        self.frames = _ClientFrames(conn.limits.max_header_bytes)
        self.pending: list[bytes] = []
        self.route: Route | None = None
        #: The first request is a HEAD: a refusal of it carries no body (RFC 9113 §8.1.1).
        self.first_is_head = False
        self.authorization: bytes | None = None
        """The first stream's credential, which the connection's own check verifies (never a later one's)."""
        self.upstream_write: Any = None
        self.last_stream = 0
        self.refused_above: int | None = None
        """Set once a stream named another sandbox: client streams above it are never forwarded."""
        self._to_client = _FrameBoundary()
        self._inject = b""
        self._opening: tuple[int, bool] | None = None
        """The first stream and whether it is gRPC, until the sandbox's first bytes showed it speaks HTTP/2."""
        self._head = b""
        self._refused = False

    def feed(self, data: bytes) -> None:
        try:
            frames, blocks = self.frames.feed(data)
        except Exception as exc:  # hpack errors, malformed frames
            log.info("h2c: malformed client frames: %s", describe_error(exc))
            # The GOAWAY names the last stream forwarded, if any was: one naming 0 tells the client none was
            # processed (RFC 9113 6.8), and gRPC retries such calls by itself, so a call the sandbox had run
            # could run again (until December 6). A block that does not decode is a COMPRESSION_ERROR (4.3).
            import hpack

            forwarded = self.last_stream if self.upstream_write is not None else 0
            self._goaway(forwarded, 0x9 if isinstance(exc, hpack.HPACKError) else 0x1)
            return
        opened: tuple[int, bool] | None = None
        over_cap = self.frames.over_cap
        for stream, headers in blocks:
            if self.refused_above is not None:
                # Above: sent before the client read the GOAWAY; it retries it elsewhere. At or below: a
                # header block (trailers) of an accepted stream the client still has open (`self.frames`
                # ended the connection for any other), forwarded (the router's re-encoded blocks leave no
                # HPACK state in the sandbox that the refused ones could have changed).
                continue
            if over_cap is not None and stream >= over_cap:
                self._refuse_from(stream)  # more open streams than the router records (`_MAX_OPEN_STREAMS`)
            elif self.route is None:
                self.last_stream = stream
                opened = self._first_request(stream, headers)
                if opened is None:
                    return
            elif stream <= self.last_stream:
                # Trailers of an accepted stream the client still has open: they carry no routing headers.
                # Only those: `self.frames` ends the connection for a block on a stream the client ended or
                # never opened (taken for trailers by its id alone, it reached the sandbox unchecked until
                # December 6).
                continue
            elif self._same_target(headers):
                self.last_stream = max(self.last_stream, stream)
            else:
                self._refuse_from(stream)
        if self.refused_above is not None:
            above = self.refused_above
            frames = [f for f in frames if not (_stream_of(f) > above and _stream_of(f) % 2)]
        if self.upstream_write is not None:
            for frame in frames:
                self.upstream_write(frame)
            return
        self.pending.extend(frames)
        if self.route is None and self.frames.buffered + sum(map(len, self.pending)) > _MAX_BUFFER:
            self._goaway()
        elif opened is not None and self.route is not None:
            # The first stream's own credential (`self.authorization`, which `_same_target` never replaces):
            # the later streams of the read were checked with theirs and never stand in for it.
            stream, grpc = opened
            if self.conn.transport is not None:
                self.conn.transport.pause_reading()
            asyncio.get_running_loop().create_task(
                self._connect(stream, grpc, self.route, self.authorization)
            )

    def _refuse_from(self, stream: int) -> None:
        """Refuse `stream` (it names another sandbox, or a credential that needs an API call) and every
        later one, unprocessed, while the streams already accepted carry on.

        GOAWAY names the last accepted stream, so the client retries the others on a new connection (gRPC
        does so transparently), which the router pins to their sandbox. Every block of a read is checked
        before any frame of it is forwarded: streams naming different sandboxes often arrive in one read
        (concurrent calls on a new connection), and none of a refused stream's frames reaches the sandbox.
        """
        self.refused_above = self.last_stream
        log.info("h2c: stream %d names another target or credential; GOAWAY(%d)", stream, self.last_stream)
        self.to_client_frame(_frame(_GOAWAY, 0, 0, struct.pack("!II", self.last_stream, 0)))

    def to_client_frame(self, frame: bytes) -> None:
        """Write a frame of the router's own to the client, between two of the sandbox's frames."""
        self._inject += frame
        if self._to_client.at_boundary:
            self.conn.write(self._inject)
            self._inject = b""

    def to_client(self, data: bytes) -> None:
        """Relay sandbox bytes to the client (the tunnel's client writer)."""
        if self._opening is not None or self._refused:
            data = self._speaks_http2(data)
            if not data:
                return
        cut = self._to_client.feed(data)
        if self._inject and cut >= 0:
            data, self._inject = data[:cut] + self._inject + data[cut:], b""
        self.conn.write(data)

    def _speaks_http2(self, data: bytes) -> bytes:
        """The sandbox's first bytes, once it is known to speak HTTP/2; else b"" (held, or refused).

        Its first frame must be SETTINGS (RFC 9113 section 3.4). A port that speaks only HTTP/1.1 answers
        the preface with a 400 instead; relayed, the client would read it as frames and fail with nothing
        to go on ("Empty reply"), so the first stream gets a 502 (a gRPC UNAVAILABLE) naming the port.
        """
        if self._refused:
            return b""
        head = self._head + data
        if len(head) < 4:  # a frame's length and type
            self._head = head
            return b""
        assert self._opening is not None
        assert self.route is not None
        (stream, grpc), self._opening, self._head = self._opening, None, b""
        if head[3] == _SETTINGS:
            return head
        first_line = head.split(b"\r\n", 1)[0][:60].decode("latin-1")
        route = self.route
        log.info("h2c: sandbox %s/%s port %d answered %r, not HTTP/2", route.namespace, route.sandbox_id,
                 route.port, first_line)  # fmt: skip
        detail = (
            f"The backend sandbox {route.sandbox_id} does not speak HTTP/2 (h2c) on port {route.port}: "
            f"it answered {first_line!r}"
        )
        self._refused = True
        self._refuse(stream, grpc, RouteError(502, detail))
        return b""

    def _first_request(self, stream: int, headers: list[tuple[str, str]]) -> tuple[int, bool] | None:
        """Pin the connection to the sandbox the first request names (and keep its credential): (stream, is
        gRPC), or None after refusing it (invalid routing headers)."""
        routing, dups, authorization = _routing(headers)
        grpc = any(k == "content-type" and v.startswith("application/grpc") for k, v in headers)
        self.first_is_head = (":method", "HEAD") in headers
        try:
            route = parse_route(routing, dups, allow_loopback=self.proxy.settings.allow_loopback)
        except RouteError as exc:
            self._refuse(stream, grpc, exc)
            return None
        self.route = route
        self.authorization = authorization
        return stream, grpc

    async def _connect(self, stream: int, grpc: bool, route: Route, authorization: bytes | None) -> None:
        proxy = self.proxy
        try:
            pending = proxy.authorizer.check(route, authorization)
            if pending is not None:
                await pending
        except RouteError as exc:
            proxy.metrics.authz_decision(route.namespace, False)
            self._refuse(stream, grpc, exc)
            return
        suspending = False
        try:
            if proxy.lifecycle is not None:
                # as HTTP/1.1: refused before it is activity
                proxy.resolver.refuse_named_elsewhere(route, held=False)
                # Ours (docs/lifecycle.md), as for HTTP/1.1: activity, written before the first stream when due.
                urgent = proxy.lifecycle.record(route.namespace, route.sandbox_id)
                if urgent is not None:
                    suspending = await urgent
            upstream = await self._dial(route, suspending)
        except RouteError as exc:
            proxy.metrics.authz_decision(route.namespace, True)
            self._refuse(stream, grpc, exc)
            return
        proxy.metrics.authz_decision(route.namespace, True)  # once resolved: its namespace is named
        if self.conn.closed:
            upstream.close()
            return
        replay = b"".join(self.pending)
        self.pending.clear()
        self._opening = (stream, grpc)
        early, upstream.early = bytes(upstream.early or b""), None
        start = time.perf_counter()  # not the loop clock: uvloop's has whole-ms resolution
        tunnel = Tunnel(
            self.conn,
            upstream,
            client_tail=replay,
            upstream_tail=early,
            limits=proxy.tunnel_limits,
            websocket=False,
        )
        self.upstream_write = tunnel.to_upstream
        proxy.tunnels.add(tunnel)
        if proxy.lifecycle is not None:
            proxy.lifecycle.watch(route.namespace, route.sandbox_id, tunnel)
        try:
            # Client bytes keep coming through `feed` (frames inspected); server bytes are relayed as is.
            await tunnel.run(client_reader=self.feed, client_writer=self.to_client)
        finally:
            proxy.tunnels.discard(tunnel)
            if proxy.lifecycle is not None:
                proxy.lifecycle.unwatch(route.namespace, route.sandbox_id, tunnel)
            if not self._refused:
                proxy.metrics.observe_request("PRI", 200, route.namespace, time.perf_counter() - start)

    async def _dial(self, route: Route, suspending: bool = False) -> UpstreamConnection:
        """Resolve and dial the sandbox, retrying dial-phase failures as the HTTP/1.1 path does.

        A refused connection, a sandbox the cache has no Ready pod for yet, or a connection the sandbox
        closed before the router relayed a byte (a runtime shutting down) is retried with
        re-resolution and backoff (`--upstream-max-retries`, `--upstream-retry-*-delay`): nothing has
        reached the sandbox, so a just-Ready or just-resumed sandbox is reached instead of failing. With
        `--sandbox-lifecycle`, such a failure (or `suspending`: the activity write found the Sandbox just
        suspended) first holds the connection while a Sandbox that resumes on request resumes.

        Raises:
            RouteError: 403 from the resolver, 503 when the Sandbox cannot be resumed, or 502 once the
                retries are spent or a dial timed out.
        """
        proxy = self.proxy
        settings = proxy.settings
        lifecycle = proxy.lifecycle
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.proxy_timeout
        delay = settings.retry_initial
        retries = holds = 0
        resumed = False  # as `Proxy._forward`: once held, a Pod IP the route carries predates the resume
        if lifecycle is not None and (suspending or lifecycle.seen_suspended(route)):
            proxy.resolver.refuse_named_elsewhere(route)  # as `Proxy._forward`: 403 first, resuming nothing
            holds += 1  # as `Proxy._forward`: not to the pod a suspend is taking away
            resumed = await lifecycle.hold(route, deadline, lifecycle.current_pod(route), leaving=True)
        while True:
            retryable = True
            target: Target | None = None
            try:
                target = proxy.resolver.resolve_fast(route, resumed=resumed)
                if target is None:
                    async with asyncio.timeout_at(deadline):
                        target = await proxy.resolver.resolve(route, resumed=resumed)
                proxy.metrics.admit_namespace(route.namespace)  # resolved: a sandbox of that namespace
                upstream = await proxy.pool.dial(
                    target.host,
                    target.port,
                    deadline=min(deadline, loop.time() + settings.response_header_timeout),
                    server_speaks_first=True,
                )
                if not upstream.closed:
                    return upstream
                error = f"{target.host}:{target.port} closed the connection before any byte was relayed"
            except TimeoutError:
                retryable, error = False, "timed out"
            except OSError as exc:
                if proxy.out_of_descriptors(route.namespace, exc):
                    # As HTTP/1.1: at once, no retries.
                    raise _OutOfDescriptors(503, EXHAUSTED_DETAIL) from exc
                error = str(exc)
            if lifecycle is not None and holds < MAX_HOLDS and loop.time() < deadline:
                holds += 1
                if await lifecycle.hold(route, deadline, target.entry if target is not None else None):
                    retries, delay, resumed = 0, settings.retry_initial, True
                    continue
            if not retryable or retries >= settings.max_retries or loop.time() + delay >= deadline:
                log.info(
                    "upstream dial failed",
                    extra={
                        "sandbox_id": route.sandbox_id,
                        "sandbox_namespace": route.namespace,
                        "error": error,
                    },
                )
                proxy.metrics.upstream_error(route.namespace, "dial")
                raise RouteError(502, f"Could not connect to the backend sandbox: {route.sandbox_id}")
            retries += 1
            proxy.metrics.upstream_retry(route.namespace)
            await asyncio.sleep(delay)
            delay = min(delay * 2, settings.retry_max)

    def _same_target(self, headers: list[tuple[str, str]]) -> bool:
        routing, dups, authorization = _routing(headers)
        try:
            route = parse_route(routing, dups, allow_loopback=self.proxy.settings.allow_loopback)
        except RouteError:
            return False
        if self.route is None or _pin_of(route) != _pin_of(self.route):
            # Another sandbox (or the same one named another way: by Pod IP or UID, which the resolver checks
            # against the sandbox, so the first stream's check does not vouch for it).
            return False
        if self.upstream_write is None and authorization == self.authorization:
            # The connection's own check (of the first stream's credential, `self.authorization`) is still
            # running: streams with that credential wait with it (their frames are held until it passes;
            # refused, nothing of them is forwarded). Refused here, the concurrent calls of a new gRPC
            # channel would each reconnect while a TokenReview is pending.
            return True
        # Every later stream is authorized, also with the credential the connection started with: a token
        # expires, a TokenReview verdict's cache ends, and a pinned connection lives for hours (a shortcut
        # for an unchanged header kept expired and revoked tokens working on it until December 6).
        try:
            pending = self.proxy.authorizer.check(route, authorization)
        except RouteError:
            return False
        if pending is not None:
            if asyncio.iscoroutine(pending):
                pending.close()
            return False  # a credential that needs an API call (new, or its cached verdict ended)
        # `self.authorization` stays the first stream's: replaced here, the connection's own check, started
        # after every block of the read, ran with this stream's credential, so a first stream without a
        # valid one was let through by a later stream's (until December 6).
        return True

    def _refuse(self, stream: int, grpc: bool, error: RouteError) -> None:
        import hpack

        self.proxy.metrics.observe_request(
            "PRI", error.status, self.route.namespace if self.route else "", 0.0
        )
        encoder = hpack.Encoder()
        if grpc:
            headers = [
                (":status", "200"),
                ("content-type", "application/grpc"),
                ("grpc-status", str(_GRPC_STATUS.get(error.status, 2))),
                ("grpc-message", error.detail),
            ]
            out = _frame(_HEADERS, _END_HEADERS | _END_STREAM, stream, encoder.encode(headers))
        else:
            body = orjson.dumps({"detail": error.detail})
            headers = [
                (":status", str(error.status)),
                ("content-type", "application/json"),
                ("content-length", str(len(body))),
            ]
            if isinstance(error, _OutOfDescriptors):
                headers.append(("retry-after", "1"))
            if self.first_is_head:
                # the length is announced, no DATA follows: HTTP/2 clients failed on the body (until December 6)
                out = _frame(_HEADERS, _END_HEADERS | _END_STREAM, stream, encoder.encode(headers))
            else:
                out = _frame(_HEADERS, _END_HEADERS, stream, encoder.encode(headers)) + _frame(
                    0x0, _END_STREAM, stream, body
                )
        out += _frame(_GOAWAY, 0, 0, struct.pack("!II", stream, 0))
        self.conn.write(out)
        self.conn.close()

    def _goaway(self, last_stream: int = 0, code: int = 0x1) -> None:
        """End the connection (default: PROTOCOL_ERROR, nothing processed); the GOAWAY is sent only
        between two of the sandbox's frames, so never into the middle of one."""
        if self._to_client.at_boundary:
            self.conn.write(self._inject + _frame(_GOAWAY, 0, 0, struct.pack("!II", last_stream, code)))
        self.conn.close()


class H2cPassThrough:
    """Takes over proxy-port connections that open with the HTTP/2 preface."""

    def __init__(self, proxy: Proxy) -> None:
        import hpack  # noqa: F401 - fail at start-up, not on the first h2c connection

        self.proxy = proxy

    def take_over(self, conn: ClientConnection, data: bytes) -> None:
        if not data.startswith(PREFACE):
            conn.fail(400, "Malformed HTTP request.")
            return
        session = _Session(self.proxy, conn)
        conn.tunnel = session.feed
        # Clients wait for the server's preface (a SETTINGS frame) before sending requests; the router
        # sends an empty one (all defaults) and the sandbox's own SETTINGS follow once connected.
        conn.write(_frame(_SETTINGS, 0, 0, b""))
        conn.on_lost = lambda: None
        session.pending.append(PREFACE)
        rest = data[len(PREFACE) :]
        if rest:
            session.feed(rest)
