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
re-resolution as for HTTP/1.1, see `_h2c_dial.dial_sandbox`; the sandbox's own SETTINGS, which it sends on accept and
which may be read before the tunnel is attached, are kept for it; with `--sandbox-lifecycle` the first
stream is activity and is held while its Sandbox resumes, as an HTTP/1.1 request; each stream is in use until
its response head, then while bytes move, `awaiting_response`) and replays the buffered bytes. From
then on frames are relayed unchanged, except header blocks: every one is decoded (HPACK state is per
connection) and re-encoded by an encoder with a dynamic table of its own (`_TableEncoder`, sized by the
receiver's SETTINGS; re-encoded bytes budgeted, docs/design/router-h2c-hpack.md), the client's for the sandbox without `authorization` (router spec 1.5: never
forwarded) and the connection-specific fields, and trailers both ways without the fields HTTP/1.1 keeps out
of relayed trailers (`_request.trailer_allowed`: routing, credentials, hop-by-hop; the sandbox's blocks are
re-encoded too, `_ServerFrames`). A client block is either a new stream's request (checked, below) or the trailers
of a stream the client still has open (`_ClientFrames.open`); any other, and a client PUSH_PROMISE, ends the
connection with GOAWAY(PROTOCOL_ERROR). A connection is pinned to one sandbox, and a stream that names another
target (sandbox ID, namespace, port, Pod IP or UID; see `_PINNED_FIELDS`) or a credential that no longer
verifies (each stream's own: the first stream's check is never made with a later one's) is refused with
a GOAWAY naming the last
accepted stream: none of its frames, nor those of any later stream, reach the sandbox, the accepted
streams finish, and the client retries the refused ones on a new connection (gRPC does this by itself,
once per call), which is then pinned to the other sandbox. One connection per sandbox, as with HTTP/1.1
(docs/router.md: use a channel with its own connection per sandbox); the DATA of refused streams is dropped and
its connection-level window given back to the client (`_refused_dropped`). DATA, SETTINGS etc.
pass through untouched (a server PUSH_PROMISE's block re-encoded as it is); the router's own frames go between two of the sandbox's. Refusals before dialling are answered as
HTTP/2 responses; for gRPC requests as a trailers-only response with the matching `grpc-status`
(400 -> INVALID_ARGUMENT, 401 -> UNAUTHENTICATED, 403 -> PERMISSION_DENIED, 502 -> UNAVAILABLE,
504 -> DEADLINE_EXCEEDED) and the detail text as `grpc-message`.

On SIGTERM a connection drains as an HTTP/1.1 request does (`_Session.drain`): GOAWAY(NO_ERROR) naming the last
accepted stream, later streams refused (RST_STREAM(REFUSED_STREAM), never forwarded), closed once the
accepted streams have ended or at the drain's deadline (docs/router.md).

`x-sandbox-timeout` is not applied on h2c (nor validated; it is forwarded as metadata): a stream's deadline
is gRPC's own `grpc-timeout`, which client and sandbox enforce. Ending one stream of a multiplexed connection
the router only inspects would mean answering it with a header block of the router's own in the sandbox's
HPACK context and dropping the sandbox's later frames for it, i.e. terminating HTTP/2 (docs/router.md).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from typing import TYPE_CHECKING, Any

import orjson

from ..api.errortext import describe_error
from ._h2c_dial import _OutOfDescriptors, dial_sandbox
from ._h2c_frames import (
    _END_HEADERS,
    _END_STREAM,
    _GOAWAY,
    _HEADERS,
    _MAX_BUFFER,
    _RST_STREAM,
    _SETTINGS,
    _ClientFrames,
    _frame,
    _goaway_code,
    _refused_dropped,
    _ServerFrames,
    _stream_of,
)
from ._h2c_hpack import _HpackSettings
from ._h2c_routing import _pin_of, _routing
from ._routing import Route, RouteError, parse_route
from ._server import H2C_PREFACE, ClientConnection
from ._tunnel import Tunnel
from ._upstream import MAX_RESPONSE_HEAD_BYTES

if TYPE_CHECKING:
    from ._proxy import Proxy

__all__ = ["PREFACE", "H2cPassThrough"]

log = logging.getLogger("agent_sandbox.router.h2c")

PREFACE = H2C_PREFACE
_NO_ERROR, _REFUSED_STREAM = 0x0, 0x7
_MAX_LIVE = 10_000
"""Accepted streams the drain waits for at most (`_Session.live`): the sandbox's SETTINGS_MAX_CONCURRENT_STREAMS
keeps a client below it, but the record must be bounded whatever the sandbox says (past it the oldest is
forgotten, and cut if still running when the connection closes)."""
_GRPC_STATUS = {400: 3, 401: 16, 403: 7, 413: 8, 429: 8, 502: 14, 503: 14, 504: 4}


def _is_grpc(headers: list[tuple[str, str]]) -> bool:
    return any(k == "content-type" and v.startswith("application/grpc") for k, v in headers)


class _Session:
    """One h2c connection from preface to close."""

    def __init__(self, proxy: Proxy, conn: ClientConnection) -> None:
        self.proxy = proxy
        self.conn = conn
        tables = _HpackSettings()
        self.frames = _ClientFrames(conn.limits.max_header_bytes, tables)
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
        # A response head or trailer section up to what HTTP/1.1 takes from a sandbox.
        self._to_client = _ServerFrames(MAX_RESPONSE_HEAD_BYTES, tables)
        self._inject = b""
        self._opening: tuple[int, bool] | None = None
        """The first stream and whether it is gRPC, until the sandbox's first bytes showed it speaks HTTP/2."""
        self._head = b""
        self._refused = False
        self._opened: tuple[int, bool] | None = None
        """The first stream and whether it is gRPC, once its block was admitted (`_admit`), until connecting."""
        self._closing = False
        self.live: dict[int, str] = {}
        """Streams accepted (forwarded, or held while connecting) that neither the sandbox ended nor either
        side reset: the drain closes the connection once there are none (`drain`). Each with its use for
        lifecycle activity (`awaiting_response`): "awaiting" its response head, "grpc" (a call, in use until
        it ends), or "answered"."""
        self._draining = False
        self._refused_to = 0
        """The highest stream refused with RST_STREAM while draining (each is refused once)."""
        self._tunnel: Tunnel | None = None
        self._to_client.on_stream_end = self._ended
        self._to_client.on_stream_answered = self._answered

    def feed(self, data: bytes) -> None:
        self._opened = None
        try:
            frames, _ = self.frames.feed(data, self._admit)
        except Exception as exc:  # hpack errors, malformed frames, header budget
            log.info("h2c: malformed client frames: %s", describe_error(exc))
            # The GOAWAY names the last stream forwarded, if any was: one naming 0 tells the client none was
            # processed (RFC 9113 6.8), and gRPC retries such calls by itself, so a call the sandbox had run
            # could run again (until December 6). A block that does not decode is a COMPRESSION_ERROR (4.3).
            forwarded = self.last_stream if self.upstream_write is not None else 0
            self._goaway(forwarded, _goaway_code(exc))
            return
        if self._closing:
            return  # the first request was refused (`_first_request`)
        opened = self._opened
        if self.refused_above is not None:
            frames, window = _refused_dropped(frames, self.refused_above)
            if window:
                # The dropped DATA's share of the connection window, which the sandbox never sees to return.
                self.to_client_frame(window)
        for frame in frames:
            if frame[3] == _RST_STREAM:
                self.live.pop(_stream_of(frame), None)
        if self.upstream_write is not None:
            for frame in frames:
                self.upstream_write(frame)
            if self._draining:
                self._end_if_done()
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

    def _admit(self, stream: int, headers: list[tuple[str, str]]) -> bool:
        """Whether a client header block, just decoded, goes on to the sandbox; decided block by block before
        it is encoded (`_ClientFrames.feed`), as the router's dynamic table must see only the blocks the
        sandbox does (a refused stream's block encoded and then dropped desynchronised the two)."""
        if self._closing:
            return False
        if self.refused_above is not None:
            # Above: sent before the client read the GOAWAY; it retries it elsewhere. At or below: a header
            # block (trailers) of an accepted stream the client still has open (`self.frames` ended the
            # connection for any other), forwarded.
            if stream > self.refused_above and self._draining and stream > self._refused_to:
                # Said outright too (GOAWAY alone leaves it to the client to see the stream was above):
                # REFUSED_STREAM, unprocessed, which clients retry (RFC 9113 8.7).
                self._refused_to = stream
                self.to_client_frame(_frame(_RST_STREAM, 0, stream, struct.pack("!I", _REFUSED_STREAM)))
            return stream <= self.refused_above
        over_cap = self.frames.over_cap
        if over_cap is not None and stream >= over_cap:
            self._refuse_from(stream)  # more open streams than the router records (`_MAX_OPEN_STREAMS`)
            return False
        if self.route is None:
            self.last_stream = stream
            self._opened = self._first_request(stream, headers)
            if self._opened is None:
                self._closing = True
                return False
            self._accepted(stream, headers)
            return True
        if stream <= self.last_stream:
            # Trailers of an accepted stream the client still has open: they carry no routing headers. Only
            # those: `self.frames` ends the connection for a block on a stream the client ended or never
            # opened (taken for trailers by its id alone, it reached the sandbox unchecked until December 6).
            return True
        if self._same_target(headers):
            self.last_stream = max(self.last_stream, stream)
            self._accepted(stream, headers)
            return True
        self._refuse_from(stream)
        return False

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

    def _accepted(self, stream: int, headers: list[tuple[str, str]]) -> None:
        # In use whatever moves (lifecycle activity, `awaiting_response`) until its response head; a gRPC call
        # until it ends: a streaming call silent between its messages is a command still running (sandboxd's
        # Start / Connect streams), not a tab left open.
        self.live[stream] = "grpc" if _is_grpc(headers) else "awaiting"
        if len(self.live) > _MAX_LIVE:
            del self.live[next(iter(self.live))]

    def _ended(self, stream: int) -> None:
        """The sandbox ended or reset `stream` (`_ServerFrames.on_stream_end`)."""
        self.live.pop(stream, None)

    def _answered(self, stream: int) -> None:
        """The sandbox's response head for `stream` went to the client (`_ServerFrames.on_stream_answered`)."""
        if self.live.get(stream) == "awaiting":
            self.live[stream] = "answered"

    @property
    def awaiting_response(self) -> bool:
        """Lifecycle activity (`_lifecycle_activity.Traffic`): a stream is in use from its HEADERS until its
        response head whatever moves - a slow unary call sends nothing meanwhile. Until December 7 only bytes
        counted, and the Sandbox was suspended under the call (UNAVAILABLE). After its head a stream is use
        only while bytes move (`last_traffic`), as an HTTP/1.1 response is - except a gRPC call, in use until
        it ends: a streaming call silent between its messages is a command still running (sandboxd's process
        streams), where an EventSource held open in silence is a tab left open. An idle channel is not use."""
        return any(use != "answered" for use in self.live.values())

    @property
    def last_traffic(self) -> float:
        """When bytes last moved on the connection (`Tunnel.last_traffic`)."""
        return self._tunnel.last_traffic if self._tunnel is not None else 0.0

    def drain(self) -> None:
        """Shutdown (`ClientConnection.on_drain`; RFC 9113 6.8): GOAWAY(NO_ERROR) naming the last stream
        accepted, so the client opens no more here and knows that every later one was not processed (each
        also gets RST_STREAM(REFUSED_STREAM), and none reaches the sandbox); the accepted ones run on, and
        the connection closes when the last has ended, or when the drain's deadline cuts every connection.
        Until December 7 the drain closed h2c connections at once: each rollout of the router failed every
        gRPC call in flight (sandboxd's commands.stream/run) with UNAVAILABLE, after it had started."""
        if self._draining or self.conn.closed:
            return
        self._draining = True
        if self.route is None:
            self._goaway(0, _NO_ERROR)  # no stream accepted yet: nothing was processed
            return
        if self.refused_above is None:
            self.refused_above = self.last_stream
        log.info("h2c: draining, GOAWAY(%d) with %d stream(s) open", self.refused_above, len(self.live))
        self.to_client_frame(_frame(_GOAWAY, 0, 0, struct.pack("!II", self.refused_above, _NO_ERROR)))
        self._end_if_done()

    def _end_if_done(self) -> None:
        """While draining: close once no accepted stream runs and what was relayed ends between two frames."""
        if not self.live and self._to_client.at_boundary and not self._inject and not self.conn.closed:
            # Half-closed, input read a while: a plain close with the client's last WINDOW_UPDATE unread
            # would answer it with a reset, which can discard the response's end from the client's buffer.
            self.conn.linger_close()

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
        if self._to_client.failed is not None:
            return  # the connection is closing
        data, cut = self._to_client.feed(data)
        if self._inject and cut >= 0:
            data, self._inject = data[:cut] + self._inject + data[cut:], b""
        self.conn.write(data)
        if self._draining and self._to_client.failed is None:
            self._end_if_done()
        if (exc := self._to_client.failed) is not None:
            # Relayed up to the frame before (`_ServerFrames.feed`); a block that does not decode is a
            # COMPRESSION_ERROR (RFC 9113 4.3). The streams forwarded may have run: the GOAWAY names the last.
            log.info("h2c: malformed frames from the sandbox: %s", describe_error(exc))
            self._goaway(self.last_stream, _goaway_code(exc))

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
        grpc = _is_grpc(headers)
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
            upstream = await dial_sandbox(proxy, route, suspending)
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
        self._tunnel = tunnel
        proxy.tunnels.add(tunnel)
        if proxy.lifecycle is not None:
            proxy.lifecycle.watch(route.namespace, route.sandbox_id, self)
        try:
            # Client bytes keep coming through `feed` (frames inspected); server bytes are relayed as is.
            await tunnel.run(client_reader=self.feed, client_writer=self.to_client)
        finally:
            proxy.tunnels.discard(tunnel)
            if proxy.lifecycle is not None:
                proxy.lifecycle.unwatch(route.namespace, route.sandbox_id, self)
            if not self._refused:
                proxy.metrics.observe_request("PRI", 200, route.namespace, time.perf_counter() - start)

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
        conn.on_drain = session.drain
        session.pending.append(PREFACE)
        rest = data[len(PREFACE) :]
        if rest:
            session.feed(rest)
