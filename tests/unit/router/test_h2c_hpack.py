"""The h2c pass-through's HPACK state: no amplification, table sizes that follow SETTINGS, a budget on what
re-encoding adds, and trailers told by stream state (docs/design/router-h2c-hpack.md).

Until December 7 the router's encoders indexed nothing, so a peer's 1-byte reference to a 4 KB dynamic-table
entry came out as 4 KB of literal: 66 KB in made 240 MB in one read (seconds of blocked event loop, ~460 MiB),
from a client whose credential was not checked yet, or from a sandbox.
"""

from __future__ import annotations

import hpack
import pytest

from agent_sandbox.router._h2c_frames import (
    _END_HEADERS,
    _END_STREAM,
    _HEADERS,
    _SETTINGS,
    _ClientFrames,
    _frame,
    _goaway_code,
    _ServerFrames,
)
from agent_sandbox.router._h2c_hpack import HeaderBudgetExceeded, _HpackSettings

_CONTINUATION = 0x9
_ACK = 0x1


def _parsed(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        stream = int.from_bytes(data[pos + 5 : pos + 9], "big")
        out.append((data[pos + 3], data[pos + 4], stream, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return out


def _header_blocks(data: bytes) -> list[tuple[int, bytes]]:
    """(stream, block) of every header block in `data` (no padding or priority: as the router frames them)."""
    out: list[tuple[int, bytes]] = []
    block = b""
    for ftype, flags, stream, payload in _parsed(data):
        if ftype in (_HEADERS, _CONTINUATION):
            block += payload
            if flags & _END_HEADERS:
                out.append((stream, block))
                block = b""
    return out


def _settings(table_size: int) -> bytes:
    return _frame(_SETTINGS, 0, 0, (1).to_bytes(2, "big") + table_size.to_bytes(4, "big"))


# ---------------------------------------------------------------------------------------- amplification


def _references(blocks: int) -> tuple[bytes, bytes]:
    """A block indexing a 4,000-byte field, then `blocks` blocks of 250 one-byte references to it."""
    first = hpack.Encoder().encode([(":status", "200"), ("x-big", "v" * 4000)])
    return first, bytes([0x80 | 62]) * 250


def test_a_sandbox_cannot_amplify_through_table_references() -> None:
    """The reviewer's sandbox-side repro (fewer blocks): what reaches the client is about what the sandbox
    sent, as references into the router's own table, which the client's decoder follows."""
    first, refs = _references(40)
    wire = _frame(_HEADERS, _END_HEADERS, 1, first) + b"".join(
        _frame(_HEADERS, _END_HEADERS | _END_STREAM, 1, refs) for _ in range(40)
    )
    server = _ServerFrames(1 << 20)
    out, _ = server.feed(wire)
    assert server.failed is None
    assert len(out) < 2 * len(wire)  # was 40 MB
    client = hpack.Decoder()
    client.max_header_list_size = 1 << 21
    blocks = _header_blocks(out)
    assert len(blocks) == 41
    for _, block in blocks:
        fields = client.decode(block, raw=True)
    assert [bytes(v) for _, v in fields] == [b"v" * 4000] * 250


def test_a_client_cannot_amplify_through_table_references() -> None:
    """The client-side repro (no credential needed: blocks are decoded before any is checked): what reaches
    the sandbox is about what the client sent."""
    request = [
        (":method", "GET"),
        (":path", "/"),
        (":scheme", "http"),
        (":authority", "a"),
        ("x-big", "v" * 4000),
    ]
    wire = _frame(_HEADERS, _END_HEADERS | _END_STREAM, 1, hpack.Encoder().encode(request))
    refs = bytes([0x82, 0x84, 0x86]) + bytes([0x80 | 62]) * 250
    wire += b"".join(_frame(_HEADERS, _END_HEADERS | _END_STREAM, 3 + 2 * i, refs) for i in range(40))
    frames, _ = _ClientFrames(1 << 20).feed(wire)
    assert sum(map(len, frames)) < 2 * len(wire)  # was 40 MB


def _thrash(blocks: int) -> bytes:
    """Client blocks that keep hitting the client's table and missing the router's: a 4,000-byte field the
    client indexed once, then per block a reference to it and two tiny literals without indexing (4 bytes
    each), which the router's encoder indexes, evicting the big field, which it then sends whole again."""
    encoder = hpack.Encoder()
    wire = _frame(
        _HEADERS, _END_HEADERS | _END_STREAM, 1, encoder.encode([(":method", "GET"), ("x-big", "v" * 4000)])
    )
    block = bytes([0x82, 0x80 | 62]) + b"\x00\x01a\x00\x00\x01b\x00"
    return wire + b"".join(
        _frame(_HEADERS, _END_HEADERS | _END_STREAM, 3 + 2 * i, block) for i in range(blocks)
    )


def test_re_encoding_that_outgrows_its_input_ends_the_connection() -> None:
    """Tables that differ (the router indexes what the client sent unindexed) still let a peer get ~400x
    out of a block; past the budget (32x the header bytes received plus 1 MiB) the connection ends with
    ENHANCE_YOUR_CALM, having sent at most that much (one block more)."""
    client = _ClientFrames(1 << 20)
    wire = _thrash(2000)
    sent = 0
    failed: Exception | None = None
    for at in range(0, len(wire), 1000):
        try:
            frames, _ = client.feed(wire[at : at + 1000])
        except HeaderBudgetExceeded as exc:
            failed = exc
            break
        sent += sum(map(len, frames))
    assert failed is not None
    assert _goaway_code(failed) == 0xB
    assert sent <= 32 * len(wire) + (1 << 20) + 8192


def test_a_sandbox_over_the_budget_stops_the_relay() -> None:
    server = _ServerFrames(1 << 20)
    encoder = hpack.Encoder()
    wire = _frame(_HEADERS, _END_HEADERS, 1, encoder.encode([(":status", "200"), ("x-big", "v" * 4000)]))
    block = bytes([0x88, 0x80 | 62]) + b"\x00\x01a\x00\x00\x01b\x00"
    wire += b"".join(_frame(_HEADERS, _END_HEADERS, 3 + 2 * i, block) for i in range(2000))
    out, _ = server.feed(wire)
    assert isinstance(server.failed, HeaderBudgetExceeded)
    assert _goaway_code(server.failed) == 0xB
    assert len(out) <= 32 * len(wire) + (1 << 20) + 8192


def test_repeated_large_metadata_stays_small() -> None:
    """1,000 gRPC calls with a 2 KiB metadata value (and a 2 KiB bearer token, dropped): each re-encoded
    request block is a few bytes, as the client's were, and far from the budget."""
    encoder = hpack.Encoder()
    client = _ClientFrames(1 << 20)
    call = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/pkg.Service/Method"),
        (":authority", "router"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("x-sandbox-id", "sb"),
        ("x-sandbox-namespace", "ns"),
        ("x-sandbox-port", "9090"),
        ("authorization", "Bearer " + "t" * 2048),
        ("x-meta", "m" * 2048),
    ]
    sizes = []
    for i in range(1000):
        frames, _ = client.feed(_frame(_HEADERS, _END_HEADERS | _END_STREAM, 1 + 2 * i, encoder.encode(call)))
        sizes.append(sum(map(len, frames)))
    assert sizes[0] > 2048
    assert max(sizes[1:]) < 40
    assert client.budget.sent < 2 * client.budget.received + 4096


def test_a_header_list_over_the_cap_is_enhance_your_calm() -> None:
    client = _ClientFrames(16384)
    first = hpack.Encoder().encode([(":method", "GET"), ("x-big", "v" * 4000)])
    with pytest.raises(hpack.OversizedHeaderListError) as failed:
        client.feed(
            _frame(_HEADERS, _END_HEADERS | _END_STREAM, 1, first)
            + _frame(_HEADERS, _END_HEADERS | _END_STREAM, 3, bytes([0x80 | 62]) * 5)
        )
    assert _goaway_code(failed.value) == 0xB


def test_a_settings_frame_of_a_wrong_length_is_frame_size_error() -> None:
    """RFC 9113 6.5: a SETTINGS payload not a multiple of 6 is FRAME_SIZE_ERROR (review: was PROTOCOL_ERROR)."""
    client = _ClientFrames(16384)
    with pytest.raises(ValueError, match="not a multiple of 6") as failed:
        client.feed(_frame(_SETTINGS, 0, 0, bytes(7)))
    assert _goaway_code(failed.value) == 0x6
    assert _goaway_code(ValueError("any other broken frame")) == 0x1


# ------------------------------------------------------------------------------------------- table sizes


def test_the_clients_table_size_bounds_the_encoder_towards_it() -> None:
    """The client's SETTINGS_HEADER_TABLE_SIZE, as it passes the router: lowered at once (the next sandbox
    block starts with a size update to it), raised once the sandbox acknowledged it; relayed at most 4096."""
    tables = _HpackSettings()
    client, server = _ClientFrames(settings=tables), _ServerFrames(settings=tables)
    sandbox = hpack.Encoder()
    head = [(":status", "200"), ("x-m", "v" * 100)]

    def relayed(stream: int) -> bytes:
        out, _ = server.feed(_frame(_HEADERS, _END_HEADERS, stream, sandbox.encode(head)))
        assert server.failed is None
        return _header_blocks(out)[0][1]

    frames, _ = client.feed(_frame(_SETTINGS, 0, 0, b"") + _settings(0))
    assert frames[-1][9:] == (1).to_bytes(2, "big") + (0).to_bytes(4, "big")
    decoder = hpack.Decoder()
    block = relayed(1)
    assert block[:1] == b"\x20"  # size update to 0 first
    decoder.decode(block)
    sandbox.header_table_size = 0  # as it acknowledges both, in order
    server.feed(_frame(_SETTINGS, _ACK, 0, b"") * 2)
    decoder.max_allowed_table_size = 0  # the client's decoder, its setting acknowledged
    for stream in (3, 5):
        block = relayed(stream)
        assert [(bytes(k), bytes(v)) for k, v in decoder.decode(block, raw=True)] == [
            (b":status", b"200"),
            (b"x-m", b"v" * 100),
        ]
        assert not decoder.header_table.dynamic_entries
    frames, _ = client.feed(_settings(1 << 16))
    assert frames[-1][11:] == (4096).to_bytes(4, "big")  # what the router's decoder takes
    block = relayed(7)
    assert block[:1] != b"\x3f"  # not before the sandbox acknowledged it
    decoder.decode(block)
    sandbox.header_table_size = 4096
    server.feed(_frame(_SETTINGS, _ACK, 0, b""))
    decoder.max_allowed_table_size = 4096
    block = relayed(9)
    assert block[:3] == b"\x3f\xe1\x1f"  # size update to 4096
    decoder.decode(block)
    block = relayed(11)
    assert len(block) < 5  # indexed now
    decoder.decode(block)


def test_the_sandboxs_table_size_bounds_the_encoder_towards_it() -> None:
    """The sandbox's SETTINGS, relayed to the client at most 4096, make the router's next client block start
    with the size update; the client's own encoder is held to the relayed size."""
    tables = _HpackSettings()
    client, server = _ClientFrames(settings=tables), _ServerFrames(settings=tables)
    out, _ = server.feed(_settings(0) + _settings(1 << 20))
    assert [p[2:] for *_, p in _parsed(out)] == [(0).to_bytes(4, "big"), (4096).to_bytes(4, "big")]
    encoder = hpack.Encoder()
    request = [(":method", "GET"), (":path", "/"), ("x-m", "v" * 100)]
    frames, _ = client.feed(_frame(_HEADERS, _END_HEADERS | _END_STREAM, 1, encoder.encode(request)))
    block = _header_blocks(b"".join(frames))[0][1]
    assert block[:1] == b"\x20"
    decoder = hpack.Decoder()
    decoder.max_allowed_table_size = 0
    assert [(bytes(k), bytes(v)) for k, v in decoder.decode(block, raw=True)] == [
        (k.encode(), v.encode()) for k, v in request
    ]
    # The client's encoder may use no more than the router relayed: 4096, not 1 MiB.
    big = hpack.Encoder()
    big.header_table_size = 8192
    with pytest.raises(hpack.InvalidTableSizeError):
        client.feed(_frame(_HEADERS, _END_HEADERS | _END_STREAM, 3, big.encode(request)))


def test_a_refused_streams_block_is_never_encoded() -> None:
    """A block the session drops (a stream refused for naming another sandbox) never reaches the router's
    encoder, so the sandbox's decoder stays in step for the blocks after it (trailers of accepted streams)."""
    encoder = hpack.Encoder()
    client = _ClientFrames()
    sandbox = hpack.Decoder()
    wire = b""
    for stream, value in ((1, "a"), (3, "refused"), (5, "a")):
        wire += _frame(
            _HEADERS, _END_HEADERS, stream, encoder.encode([(":method", "POST"), ("x-v", value * 50)])
        )
    wire += _frame(_HEADERS, _END_HEADERS | _END_STREAM, 1, encoder.encode([("grpc-x", "refused" * 50)]))
    frames, blocks = client.feed(wire, lambda stream, headers: stream != 3)
    assert blocks == []
    decoded = [
        (stream, [(bytes(k), bytes(v)) for k, v in sandbox.decode(block, raw=True)])
        for stream, block in _header_blocks(b"".join(frames))
    ]
    assert decoded == [
        (1, [(b":method", b"POST"), (b"x-v", b"a" * 50)]),
        (5, [(b":method", b"POST"), (b"x-v", b"a" * 50)]),
        (1, [(b"grpc-x", b"refused" * 50)]),
    ]


# ---------------------------------------------------------------------------------------------- trailers


def test_sandbox_trailers_with_a_status_are_still_filtered() -> None:
    """A block after the stream's final response head is its trailer section, `:status` or not: until
    December 7 a pseudo-header field made it a head, and every field got past the trailer filter."""
    encoder = hpack.Encoder()
    wire = (
        _frame(_HEADERS, _END_HEADERS, 1, encoder.encode([(":status", "103"), ("link", "</a>")]))
        + _frame(
            _HEADERS, _END_HEADERS, 1, encoder.encode([(":status", "200"), ("x-sandbox-pod-ip", "head")])
        )
        + _frame(
            _HEADERS,
            _END_HEADERS | _END_STREAM,
            1,
            encoder.encode([(":status", "200"), ("x-sandbox-namespace", "evil"), ("grpc-status", "0")]),
        )
    )
    server = _ServerFrames()
    out, _ = server.feed(wire)
    assert server.failed is None
    decoder = hpack.Decoder()
    assert [
        [(bytes(k), bytes(v)) for k, v in decoder.decode(b, raw=True)] for _, b in _header_blocks(out)
    ] == [
        [(b":status", b"103"), (b"link", b"</a>")],
        [(b":status", b"200"), (b"x-sandbox-pod-ip", b"head")],  # a head keeps its fields
        [(b"grpc-status", b"0")],
    ]
