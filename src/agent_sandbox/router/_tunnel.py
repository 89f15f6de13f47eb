"""Upgraded connections (WebSocket, h2c, ...): raw bytes both ways after `101`, with limits.

Owns: piping bytes between the client and the sandbox once the sandbox answered `101 Switching
Protocols` (router spec §1.8: the proxy timeout does not apply), flow control both ways, and the limits
upstream's Go router lacks (operations spec §11 "no limits for upgraded connections"), with the legacy
Python router's defaults and close codes:

| limit | close code | reason |
|---|---|---|
| no byte either way for `--websocket-idle-timeout` | 1001 | `idle timeout exceeded` |
| open longer than `--websocket-max-lifetime` | 1001 | `max lifetime exceeded` |
| a sandbox->client message over `--websocket-max-message-bytes` | 1009 | `message too big` |
| still open at the end of the shutdown drain (`going_away`) | 1001 | `router shutting down` |

The message-size check reads only WebSocket frame headers of the sandbox->client stream (payload bytes
are never copied or unmasked); the client->sandbox stream's headers are followed too, for its frame
boundaries alone. For a WebSocket the router sends a close frame to each end whose stream stands at a
frame boundary (a close frame written inside a frame's payload would be read as payload: the end would
see garbage, then a cut); an end left mid-frame is just closed, as other upgraded protocols are. The same
scanners tell which bytes are data frames, the only WebSocket traffic that counts as lifecycle activity
(`last_traffic`). The per-client connection cap is checked before the upgrade is forwarded (`TunnelLimits.admit`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import struct
import time
from collections.abc import Callable, Sequence

from ._server import ClientConnection
from ._upstream import UpstreamConnection

__all__ = ["FrameScanner", "Tunnel", "TunnelLimits", "close_frame"]

_SWEEP = 1.0
_U16 = struct.Struct("!H").unpack_from
_U64 = struct.Struct("!Q").unpack_from
_NO_LIMIT = 1 << 64
"""Above any frame length (63 bits), so the client->sandbox scanner never reports a message too big."""


def close_frame(code: int, reason: str, *, masked: bool) -> bytes:
    """A WebSocket close frame (RFC 6455 §5.5.1); clients must mask, servers must not."""
    payload = struct.pack("!H", code) + reason.encode()[:123]
    if not masked:
        return bytes((0x88, len(payload))) + payload
    key = os.urandom(4)
    body = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return bytes((0x88, 0x80 | len(payload))) + key + body


class FrameScanner:
    """Follows WebSocket frame boundaries in one direction and measures data messages."""

    __slots__ = ("_data", "_header", "_limit", "_message", "_skip", "moved_data", "saw_close")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._skip = 0
        """Payload bytes of the current frame still to pass."""
        self._header = b""
        """A frame header split across reads."""
        self._message = 0
        self._data = False
        """The current frame is a data frame (text, binary, continuation), not a control frame."""
        self.moved_data = False
        """Bytes of a data frame were scanned since the reader last cleared it (lifecycle activity: pings and
        pongs are not use, `Tunnel.last_traffic`)."""
        self.saw_close = False
        """A close frame's header was scanned (`Tunnel.going_away` waits for each end's)."""

    @property
    def partial_header(self) -> int:
        """Bytes of a frame header that began in what was scanned but is not complete yet."""
        return len(self._header)

    @property
    def in_payload(self) -> bool:
        """What was scanned ends inside a frame's payload (not between two frames or inside a header)."""
        return self._skip > 0

    def feed(self, data: bytes) -> int | None:
        """Scan `data`; None if fine, else the offset of the frame that exceeds the limit (negative when its
        header began in earlier reads: minus the `partial_header` bytes seen before `data`)."""
        # The state is worked on in locals and headers read in place from `data` (only one split across
        # reads is joined first): until December 7 each frame cost a slice, a join and a dozen attribute
        # reads and writes, and a client sending tiny frames was scanned at ~11 MiB/s (review rev12).
        pos, n = 0, len(data)
        skip, header, message, limit = self._skip, self._header, self._message, self._limit
        is_data, moved = self._data, self.moved_data
        over: int | None = None
        while True:
            if skip:
                left = n - pos
                if is_data and left:
                    moved = True
                if skip >= left:
                    skip -= left
                    break
                pos += skip
                skip = 0
            if pos >= n:
                break
            held = len(header)
            buf, at = (header + data[pos : pos + 14], 0) if held else (data, pos)
            avail = len(buf) - at
            if avail < 2:
                header = bytes(buf[at:])
                break
            b1 = buf[at + 1]
            length = b1 & 0x7F
            need = 2 + (2 if length == 126 else 8 if length == 127 else 0) + (4 if b1 & 0x80 else 0)
            if avail < need:
                header = bytes(buf[at:])
                break
            if length == 126:
                length = _U16(buf, at + 2)[0]
            elif length == 127:
                length = _U64(buf, at + 2)[0]
            b0 = buf[at]
            opcode = b0 & 0x0F
            is_data = opcode < 8
            if is_data:  # data or continuation frame: part of a message
                moved = True
                if opcode != 0:
                    message = 0
                message += length
                if message > limit:
                    over = pos - held
                    break
                if b0 & 0x80:
                    message = 0
            elif opcode == 8:
                self.saw_close = True
            pos += need - held
            header = b""
            skip = length
        self._skip, self._header, self._message = skip, header, message
        self._data, self.moved_data = is_data, moved
        return over


class TunnelLimits:
    """Limits shared by every upgraded connection of the router."""

    def __init__(
        self,
        *,
        idle_timeout: float = 3600.0,
        max_lifetime: float = 86400.0,
        max_per_client: int = 64,
        max_message_bytes: int = 16 << 20,
        trusted_proxies: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network] = (),
    ) -> None:
        self.idle_timeout = idle_timeout
        self.max_lifetime = max_lifetime
        self.max_per_client = max_per_client
        self.max_message_bytes = max_message_bytes
        self.trusted_proxies = tuple(trusted_proxies)
        self.per_client: dict[str, int] = {}

    def client_key(self, peer: str, forwarded_for: bytes | None) -> str:
        """The TCP peer, or behind a trusted proxy the right-most untrusted `X-Forwarded-For` hop."""
        if not self.trusted_proxies or not forwarded_for or not self._trusted(peer):
            return peer
        for hop in reversed(forwarded_for.decode("latin-1").split(",")):
            hop = hop.strip()
            if hop and not self._trusted(hop):
                return hop
        return peer

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.trusted_proxies)

    def admit(self, key: str) -> bool:
        """Reserve one upgraded connection for `key`; False when the per-client cap is reached."""
        count = self.per_client.get(key, 0)
        if self.max_per_client and count >= self.max_per_client:
            return False
        self.per_client[key] = count + 1
        return True

    def release(self, key: str) -> None:
        count = self.per_client.get(key, 0) - 1
        if count > 0:
            self.per_client[key] = count
        else:
            self.per_client.pop(key, None)


class Tunnel:
    """One upgraded connection; `await run()` until either side closes or a limit ends it."""

    def __init__(
        self,
        conn: ClientConnection,
        upstream: UpstreamConnection,
        *,
        client_tail: bytes,
        upstream_tail: bytes,
        limits: TunnelLimits,
        websocket: bool,
    ) -> None:
        self.conn = conn
        self.upstream = upstream
        self.limits = limits
        self.websocket = websocket
        self.bytes_to_client = 0
        self.close_reason = ""
        self._client_tail = client_tail
        self._upstream_tail = upstream_tail
        self._scanner = FrameScanner(limits.max_message_bytes) if websocket else None
        self._client_frames = FrameScanner(_NO_LIMIT) if websocket else None
        """Follows the client->sandbox frames only so that a close frame sent to the sandbox (masked, as a
        client's) lands between two of them (`_end`)."""
        self._held = b""
        self._last = time.monotonic()
        """Any byte either way: `--websocket-idle-timeout` counts from it (a ping keeps a connection open)."""
        self._last_use = self._last
        """What lifecycle activity counts (`last_traffic`): for a WebSocket, data frames only."""
        self._started = self._last
        self._done: asyncio.Future[None] | None = None
        self._awaiting_close: set[str] = set()
        """The ends ("client", "sandbox") `going_away` sent a close frame and awaits the close of."""
        self._ended = False
        """A limit ended the connection (`_end`): what either end still sends in the same loop turn is
        dropped, not relayed after the close frame it got (review rev12 D)."""
        self._timer: asyncio.TimerHandle | None = None
        self._write_client: Callable[[bytes], None] = conn.write

    async def run(
        self,
        client_reader: Callable[[bytes], None] | None = None,
        client_writer: Callable[[bytes], None] | None = None,
    ) -> None:
        """Relay until either side closes or a limit ends the connection.

        Args:
            client_reader: receives client bytes instead of the plain relay (it forwards what it
                accepts with `to_upstream`); used by h2c to inspect frames.
            client_writer: writes sandbox bytes to the client instead of the plain relay; used by h2c
                to put the router's own frames between the sandbox's.
        """
        if client_writer is not None:
            self._write_client = client_writer
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        conn, upstream = self.conn, self.upstream
        conn.tunnel = client_reader or self.to_upstream
        conn.on_lost = self._lost
        conn.on_write_pause = self._client_write_pause
        upstream.tunnel = self._from_upstream
        upstream.on_lost = lambda _exc: self._lost()
        upstream.on_write_pause = self._upstream_write_pause
        if upstream.closed:
            self._lost()
        else:
            if self._client_tail:
                self.to_upstream(self._client_tail)
            if self._upstream_tail:
                self._from_upstream(self._upstream_tail)
            if conn.transport is not None and not conn.closed:
                conn.transport.resume_reading()
            self._timer = loop.call_later(_SWEEP, self._check_limits)
        try:
            await self._done
        finally:
            if self._timer is not None:
                self._timer.cancel()
            conn.close()
            upstream.close()

    @property
    def awaiting_response(self) -> bool:
        """Lifecycle activity (`_lifecycle_activity.Traffic`): past its `101`, a tunnel awaits no response."""
        return False

    @property
    def last_traffic(self) -> float:
        """When bytes that count as use last moved either way (`time.monotonic()`): any byte, except on a
        WebSocket, where only data frames count - ping/pong heartbeats (aiohttp's `heartbeat`, browsers'
        and most servers' keepalives, every few seconds) would keep a tab left open overnight from ever
        letting its Sandbox idle (docs/lifecycle.md; until December 7 they did). The idle limit
        (`--websocket-idle-timeout`) still counts every byte."""
        return self._last_use

    def to_upstream(self, data: bytes) -> None:
        if self._ended:
            return
        self._last = now = time.monotonic()
        frames = self._client_frames
        if self._awaiting_close:
            self._closing_input("client", frames, data)
            return
        if frames is None:
            self._last_use = now
        else:
            frames.feed(data)
            if frames.moved_data:
                frames.moved_data = False
                self._last_use = now
        self.upstream.write(data)

    def _from_upstream(self, data: bytes) -> None:
        if self._ended:
            return
        self._last = now = time.monotonic()
        scanner = self._scanner
        if self._awaiting_close:
            self._closing_input("sandbox", scanner, data)
            return
        if scanner is None:
            self._last_use = now
        else:
            # A frame header split across reads is held back until it is whole, so that the frame which
            # breaks the limit never reaches the client in part (its close frame follows a whole frame).
            held, self._held = self._held, b""
            cut = scanner.feed(data)
            if scanner.moved_data:
                scanner.moved_data = False
                self._last_use = now
            data = held + data
            if cut is not None:
                self._forward(data[: len(held) + cut])
                # What reached the client ends right before the oversized frame's header: a boundary.
                self._end(1009, "message too big", client_between_frames=True)
                return
            if scanner.partial_header:
                data, self._held = data[: -scanner.partial_header], data[-scanner.partial_header :]
        self._forward(data)

    def _forward(self, data: bytes) -> None:
        if data:
            self.bytes_to_client += len(data)
            self._write_client(data)

    def _client_write_pause(self, paused: bool) -> None:
        transport = self.upstream.transport
        if transport is not None and not self.upstream.closed:
            (transport.pause_reading if paused else transport.resume_reading)()

    def _upstream_write_pause(self, paused: bool) -> None:
        transport = self.conn.transport
        if transport is not None and not self.conn.closed:
            (transport.pause_reading if paused else transport.resume_reading)()

    def _check_limits(self) -> None:
        self._timer = None
        now = time.monotonic()
        limits = self.limits
        if limits.idle_timeout and now - self._last >= limits.idle_timeout:
            self._end(1001, "idle timeout exceeded")
            return
        if limits.max_lifetime and now - self._started >= limits.max_lifetime:
            self._end(1001, "max lifetime exceeded")
            return
        self._timer = asyncio.get_running_loop().call_later(_SWEEP, self._check_limits)

    @property
    def ended(self) -> asyncio.Future[None] | None:
        """Done once the connection ended (None before `run`)."""
        return self._done

    def going_away(self) -> None:
        """The shutdown drain's deadline: 1001 to each end of a WebSocket that stands at a frame boundary,
        then their closing handshake (RFC 6455 7.1.1): nothing more is relayed, and each end that got the
        close frame is closed once its own close frame arrives (or it closes), the other at once; the drain
        bounds the wait, then closes what is left (`close_now`). Browsers report a close whose connection
        went before their answer as not clean (`wasClean=false`), aiohttp sometimes as 1006 (its answer met
        a closed transport): until December 7 both ends were closed right after the frames (and until then
        aborted with none). Other upgraded connections are closed at once (flushed: `Connection.abort`
        leaves a closed one to its flush)."""
        sent = self._end(1001, "router shutting down", handshake=True)
        if "client" not in sent:
            self.conn.close()
        if "sandbox" not in sent:
            self.upstream.close()
        self._awaiting_close = sent
        if not sent:
            self._lost()

    def close_now(self) -> None:
        """The drain's wait for the closing handshakes is over: close both ends (flushed)."""
        self.conn.close()
        self.upstream.close()
        self._lost()

    def _closing_input(self, end: str, frames: FrameScanner | None, data: bytes) -> None:
        """Bytes from `end` after `going_away`: dropped (a close frame went the other way already); its
        close frame closes it, and the connection ends once every end that got one has answered."""
        if end not in self._awaiting_close or frames is None:
            return
        frames.feed(data)
        if frames.saw_close:
            (self.conn if end == "client" else self.upstream).close()
            self._awaiting_close.discard(end)
            if not self._awaiting_close:
                self._lost()

    def _end(
        self,
        code: int,
        reason: str,
        *,
        client_between_frames: bool | None = None,
        handshake: bool = False,
    ) -> set[str]:
        """End with a close frame to each end whose stream is between two frames (`client_between_frames`:
        known by the caller; else from the sandbox->client scanner, whose held partial header was never
        sent). A close frame cannot follow a frame cut half-way: the end would take it for payload. The
        frame's rest could be awaited, but a sandbox (untrusted) controls when that comes, and the limits
        and the drain's deadline are meant to end the connection then; so that end is only closed. Returns the
        ends sent a close frame; `handshake`: the caller awaits their answers (`going_away`), else the
        connection ends now."""
        if self._awaiting_close:  # a limit while `going_away` awaits the handshake: close frames went already
            self._lost()
            return set()
        self.close_reason = reason
        sent: set[str] = set()
        if self.websocket:
            to_client, to_sandbox = self._scanner, self._client_frames
            if client_between_frames is None:
                client_between_frames = to_client is None or not to_client.in_payload
            if client_between_frames:
                self.conn.write(close_frame(code, reason, masked=False))
                sent.add("client")
            # Client bytes are relayed as they come, a partial header too: between frames only without one.
            if to_sandbox is None or not (to_sandbox.in_payload or to_sandbox.partial_header):
                self.upstream.write(close_frame(code, reason, masked=True))
                sent.add("sandbox")
        if not handshake:
            self._ended = True
            self._lost()
        return sent

    def _lost(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)
