"""WebSocket frame scanning (message-size limit) and the per-client upgrade accounting."""

from __future__ import annotations

import ipaddress
import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_sandbox.router._tunnel import FrameScanner, Tunnel, TunnelLimits, close_frame

pytestmark = pytest.mark.unit


def frame(payload_len: int, *, opcode: int = 2, fin: bool = True, masked: bool = False) -> bytes:
    head = bytes([(0x80 if fin else 0) | opcode])
    mask = 0x80 if masked else 0
    if payload_len < 126:
        head += bytes([mask | payload_len])
    elif payload_len < 1 << 16:
        head += bytes([mask | 126]) + struct.pack("!H", payload_len)
    else:
        head += bytes([mask | 127]) + struct.pack("!Q", payload_len)
    return head + (b"mask" if masked else b"") + b"x" * payload_len


@pytest.mark.parametrize("size", [0, 5, 125, 126, 65535, 65536, 100_000])
def test_frames_under_the_limit_pass(size: int) -> None:
    assert FrameScanner(100_000).feed(frame(size)) is None


def test_oversized_frame_is_found_at_its_start() -> None:
    data = frame(10) + frame(200)
    assert FrameScanner(100).feed(data) == len(frame(10))


def test_fragmented_message_counts_all_fragments() -> None:
    scanner = FrameScanner(100)
    first = frame(60, opcode=1, fin=False)
    ping = frame(4, opcode=9)  # control frames interleave and do not count
    second = frame(60, opcode=0, fin=True)
    assert scanner.feed(first + ping) is None
    assert scanner.feed(second) == 0
    # A new message starts from zero.
    scanner = FrameScanner(100)
    assert scanner.feed(frame(60, opcode=1) + frame(60, opcode=1)) is None


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 9, 11])
def test_headers_split_across_reads(cut: int) -> None:
    data = frame(10) + frame(70_000) + frame(3)
    scanner = FrameScanner(80_000)
    assert scanner.feed(data[: len(frame(10)) + cut]) is None
    assert scanner.feed(data[len(frame(10)) + cut :]) is None
    small = FrameScanner(50_000)
    assert small.feed(data[: len(frame(10)) + cut]) in (None, len(frame(10)))


def test_byte_by_byte() -> None:
    data = frame(300) + frame(5)
    scanner = FrameScanner(1000)
    assert all(scanner.feed(bytes([b])) is None for b in data)


def test_only_data_frames_are_use() -> None:
    """Lifecycle activity (`Tunnel.last_traffic`): pings and pongs are heartbeats, not use; any byte of a
    data frame is, its payload's continuation in a later read too."""
    scanner = FrameScanner(1 << 20)
    for heartbeat in (frame(4, opcode=0x9), frame(4, opcode=0xA, masked=True)):
        scanner.feed(heartbeat)
        assert not scanner.moved_data
    text = frame(100, opcode=1)
    scanner.feed(text[:50])
    assert scanner.moved_data
    scanner.moved_data = False
    scanner.feed(text[50:])
    assert scanner.moved_data  # the rest of its payload
    scanner.moved_data = False
    scanner.feed(frame(0, opcode=0x9) + frame(3, opcode=0, masked=True))  # a ping, then a continuation
    assert scanner.moved_data


def test_close_frames() -> None:
    server = close_frame(1009, "message too big", masked=False)
    assert server[:2] == bytes([0x88, 17])
    assert server[2:4] == struct.pack("!H", 1009)
    client = close_frame(1001, "idle timeout exceeded", masked=True)
    assert client[0] == 0x88
    assert client[1] == 0x80 | 23
    key, body = client[2:6], client[6:]
    assert (
        bytes(b ^ key[i % 4] for i, b in enumerate(body))
        == struct.pack("!H", 1001) + b"idle timeout exceeded"
    )


def test_per_client_limit() -> None:
    limits = TunnelLimits(max_per_client=2)
    assert limits.admit("a")
    assert limits.admit("a")
    assert not limits.admit("a")
    assert limits.admit("b")
    limits.release("a")
    assert limits.admit("a")
    assert TunnelLimits(max_per_client=0).admit("x")  # 0 disables


def test_client_key_behind_trusted_proxies() -> None:
    limits = TunnelLimits(trusted_proxies=[ipaddress.ip_network("10.0.0.0/8")])
    assert limits.client_key("192.0.2.1", b"1.1.1.1") == "192.0.2.1"  # untrusted peer: its own address
    assert limits.client_key("10.0.0.5", b"203.0.113.9, 10.1.1.1") == "203.0.113.9"
    assert limits.client_key("10.0.0.5", None) == "10.0.0.5"
    assert limits.client_key("10.0.0.5", b"10.2.2.2") == "10.0.0.5"


@given(
    data=st.binary(max_size=300),
    cuts=st.lists(st.integers(0, 300), max_size=6),
    limit=st.integers(0, 200),
)
def test_any_bytes_any_split(data: bytes, cuts: list[int], limit: int) -> None:
    """What a sandbox sends after the upgrade is untrusted: any bytes, read in any pieces, are scanned
    without an error, and the oversized frame is found exactly where scanning it whole finds it (an offset
    before the current read when its header began in an earlier one)."""
    whole = FrameScanner(limit).feed(data)
    scanner = FrameScanner(limit)
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    found = None
    for start, end in itertools.pairwise(points):
        cut = scanner.feed(data[start:end])
        if cut is not None:
            found = start + cut
            break
    assert found == whole


@given(st.data())
def test_boundary_state_after_any_split(data: st.DataObject) -> None:
    """`in_payload` and `partial_header` say exactly whether what was scanned ends between two frames, as
    `Tunnel._end` needs to place a close frame (masked frames as a client sends them)."""
    sizes = data.draw(st.lists(st.sampled_from([0, 3, 125, 126, 300, 65536]), min_size=1, max_size=4))
    frames = [frame(n, masked=data.draw(st.booleans())) for n in sizes]
    stream = b"".join(frames)
    boundaries = set(itertools.accumulate(len(f) for f in frames)) | {0}
    end = data.draw(st.integers(0, len(stream)))
    cut = data.draw(st.integers(0, end))
    scanner = FrameScanner(1 << 64)
    assert scanner.feed(stream[:cut]) is None
    assert scanner.feed(stream[cut:end]) is None
    assert (not scanner.in_payload and not scanner.partial_header) == (end in boundaries)


class _End:
    """One end of a tunnel as the tunnel sees it: what was written to it, and whether it was closed."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False
        self.transport = None

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


def test_nothing_is_relayed_after_a_limit_sent_its_close_frames() -> None:
    """A sandbox message over the limit ends the tunnel with 1009 each way; bytes either end sends in the same
    loop turn (read before the close) are dropped, not written after the close frame (review rev12 D)."""
    client, sandbox = _End(), _End()
    tunnel = Tunnel(
        client,  # type: ignore[arg-type]
        sandbox,  # type: ignore[arg-type]
        client_tail=b"",
        upstream_tail=b"",
        limits=TunnelLimits(max_message_bytes=10),
        websocket=True,
    )
    tunnel._from_upstream(frame(11))
    assert client.written == [close_frame(1009, "message too big", masked=False)]
    assert len(sandbox.written) == 1  # the masked close frame
    tunnel.to_upstream(frame(3, masked=True))
    tunnel._from_upstream(frame(3))
    assert len(client.written) == 1
    assert len(sandbox.written) == 1
