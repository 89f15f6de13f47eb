"""Frame boundaries of the sandbox->client h2c stream, where the router may put a frame of its own; header blocks
both ways."""

from __future__ import annotations

import itertools

import hpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_sandbox.router._h2c_frames import _ClientFrames, _ServerFrames


def _frame(length: int) -> bytes:
    return length.to_bytes(3, "big") + b"\x00\x00" + b"\x00\x00\x00\x01" + b"p" * length


def test_at_start_and_after_whole_frames() -> None:
    frames = _ServerFrames()
    assert frames.at_boundary
    data = _frame(3) + _frame(0)
    assert frames.feed(data) == (data, 0)
    assert frames.at_boundary


def test_first_boundary_inside_a_read() -> None:
    frames = _ServerFrames()
    data = _frame(5) + _frame(2)
    assert frames.feed(data[:4]) == (b"", 0)  # a frame header is held until its type is known
    assert frames.at_boundary  # nothing of the frame relayed yet
    assert frames.feed(data[4:12]) == (data[:12], 0)  # before its header; the frame ends at byte 14
    assert not frames.at_boundary
    assert frames.feed(data[12:16]) == (data[12:14], 2)  # the second frame's header is held
    assert frames.feed(data[16:]) == (data[14:], 0)
    assert frames.at_boundary


def test_a_read_inside_one_long_frame_has_no_boundary() -> None:
    frames = _ServerFrames()
    data = _frame(100)
    frames.feed(data[:20])
    assert frames.feed(data[20:50]) == (data[20:50], -1)
    assert frames.feed(data[50:]) == (data[50:], len(data) - 50)


@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    cuts=st.lists(st.integers(0, 300), max_size=8),
)
def test_any_split_finds_the_same_boundaries(lengths: list[int], cuts: list[int]) -> None:
    """Frames that are no header block's are relayed unchanged, each boundary reported where the relayed
    bytes reach it (a frame header is relayed once whole)."""
    stream = b"".join(_frame(n) for n in lengths)
    ends, pos = {0}, 0
    for n in lengths:
        pos += 9 + n
        ends.add(pos)
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    frames = _ServerFrames()
    relayed = b""
    for start, end in itertools.pairwise(points):
        out, first = frames.feed(stream[start:end])
        at = len(relayed)
        relayed += out
        expected = min((e - at for e in ends if at <= e <= len(relayed)), default=-1)
        assert first == expected
    assert relayed == stream
    assert frames.at_boundary


def _raw(ftype: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + stream.to_bytes(4, "big") + payload


HEADERS, CONTINUATION, DATA, RST_STREAM, PUSH_PROMISE = 0x1, 0x9, 0x0, 0x3, 0x5
END_HEADERS = 0x4


def _block(**headers: str) -> bytes:
    return bytes(hpack.Encoder().encode(list(headers.items())))


def test_a_split_header_block_is_held_until_it_can_be_checked() -> None:
    block = _block(x_sandbox_id="beta")
    first, rest = _raw(HEADERS, 0, 3, block[:2]), _raw(CONTINUATION, END_HEADERS, 3, block[2:])
    client = _ClientFrames()
    assert client.feed(first) == ([], [])  # nothing of the block leaves before all of it is seen
    assert client.buffered == len(first)
    frames, blocks = client.feed(rest)
    assert blocks == [(3, [("x_sandbox_id", "beta")])]
    # What leaves is the block re-encoded by the router, in one HEADERS frame (`test_re_encoding`).
    assert len(frames) == 1
    assert frames[0][3:9] == bytes((HEADERS, END_HEADERS)) + (3).to_bytes(4, "big")
    assert [(str(k), str(v)) for k, v in hpack.Decoder().decode(frames[0][9:])] == [("x_sandbox_id", "beta")]


@pytest.mark.parametrize(
    "frames",
    [
        [_raw(CONTINUATION, END_HEADERS, 1, b"")],  # continues nothing
        [_raw(HEADERS, 0, 1, b""), _raw(CONTINUATION, END_HEADERS, 3, b"")],  # another stream's
        [_raw(HEADERS, 0, 1, b""), _raw(DATA, 0, 1, b"x")],  # another frame inside a block
        [_raw(HEADERS, 0, 1, b""), _raw(HEADERS, END_HEADERS, 3, b"")],  # a block inside a block
        [_raw(HEADERS, END_HEADERS, 0, b"")],  # on the connection's stream
    ],
)
def test_header_blocks_out_of_order_are_refused(frames: list[bytes]) -> None:
    with pytest.raises(ValueError, match=r"HEADERS|CONTINUATION|inside"):
        _ClientFrames().feed(b"".join(frames))


_REQUEST = _block(x_sandbox_id="alpha")


def _h(stream: int, end_stream: bool = False) -> bytes:
    return _raw(HEADERS, END_HEADERS | (0x1 if end_stream else 0), stream, _REQUEST)


@pytest.mark.parametrize(
    "frames",
    [
        [_h(1), _h(5), _h(3)],  # never opened, below the highest opened
        [_h(1), _raw(DATA, 0x1, 1, b"x"), _h(1, end_stream=True)],  # after the client's END_STREAM (DATA)
        [_h(1, end_stream=True), _h(1, end_stream=True)],  # after END_STREAM on the request
        [_h(1), _h(1, end_stream=True), _h(1, end_stream=True)],  # after the trailers
        [_h(1), _raw(RST_STREAM, 0, 1, b"\x00\x00\x00\x08"), _h(1, end_stream=True)],  # after RST_STREAM
        [_h(1), _h(1)],  # a second block that does not end the stream
        [_h(1), _h(4)],  # an even-numbered stream
        [_h(2)],
        [_h(1), _raw(PUSH_PROMISE, END_HEADERS, 1, b"\x00\x00\x00\x02" + _REQUEST)],  # clients never push
    ],
    ids=[
        "never-opened",
        "data-ended",
        "request-ended",
        "trailers-ended",
        "reset",
        "second-block",
        "even",
        "even-first",
        "push",
    ],
)
@pytest.mark.parametrize("one_read", [True, False])
def test_stream_states(frames: list[bytes], one_read: bool) -> None:
    """A header block only opens a new stream (id above every one the client opened) or ends an open one
    (trailers); anything else used to reach the sandbox as "trailers", unchecked."""
    client = _ClientFrames()
    reads = [b"".join(frames)] if one_read else frames
    for data in reads[:-1]:
        client.feed(data)  # fine so far
    with pytest.raises(ValueError, match=r"stream"):
        client.feed(reads[-1])


def test_trailers_of_open_streams_pass() -> None:
    client = _ClientFrames()
    data = [_h(1), _h(3), _raw(DATA, 0, 1, b"x"), _h(1, end_stream=True), _h(5, end_stream=True), _h(3, True)]
    _, blocks = client.feed(b"".join(data))
    assert [s for s, _ in blocks] == [1, 3, 1, 5, 3]
    assert client.open == set()
    assert client.highest == 5


def test_the_open_stream_record_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond `_MAX_OPEN_STREAMS` a stream is not recorded (the session refuses it and every later one); its
    trailers, sent before the client read the GOAWAY, pass the splitter (the session drops them)."""
    from agent_sandbox.router import _h2c_frames

    monkeypatch.setattr(_h2c_frames, "_MAX_OPEN_STREAMS", 2)
    client = _ClientFrames()
    _, blocks = client.feed(b"".join([_h(1), _h(3), _h(5), _h(7), _h(5, True), _h(9, True), _h(1, True)]))
    assert [s for s, _ in blocks] == [1, 3, 5, 7, 5, 9, 1]
    assert client.over_cap == 5
    assert client.open == {3}
    with pytest.raises(ValueError, match="stream 3"):
        client.feed(_h(3))


def test_the_first_authorization_header_counts() -> None:
    """As upstream's `Header.Get` and the HTTP/1.1 path."""
    from agent_sandbox.router._h2c_routing import _routing

    assert _routing([("authorization", "Bearer a"), ("authorization", "Bearer b")])[2] == b"Bearer a"


# ------------------------------------------------------------------------------------------- re-encoding

END_STREAM, PADDED, PRIORITY = 0x1, 0x8, 0x20


def _parsed(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        stream = int.from_bytes(data[pos + 5 : pos + 9], "big")
        out.append((data[pos + 3], data[pos + 4], stream, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    assert pos == len(data)
    return out


def test_re_encoding_leaves_out_credentials_and_connection_specific_fields() -> None:
    """Router spec 1.5: `Authorization` is consumed by authz, never forwarded; h2c relayed it to the sandbox."""
    from agent_sandbox.router._h2c_frames import _forwarded

    headers = [
        (b":method", b"POST"),
        (b"authorization", b"Bearer t"),
        (b"Authorization", b"Bearer u"),
        (b"proxy-authorization", b"Basic x"),
        (b"connection", b"keep-alive, x-hop"),
        (b"x-hop", b"1"),
        (b"keep-alive", b"5"),
        (b"transfer-encoding", b"chunked"),
        (b"upgrade", b"h2c"),
        (b"te", b"trailers"),
        (b"te", b"gzip"),
        (b"x-keep", b"authorization"),
    ]
    assert _forwarded(headers) == [(b":method", b"POST"), (b"te", b"trailers"), (b"x-keep", b"authorization")]


def _client_headers(flags: int, fields: bytes, block: bytes, split: bool, stream: int) -> bytes:
    """The client's HEADERS on `stream` (padded by 3 and/or with priority `fields` as `flags` say), continued
    when `split`."""
    cut = 30 if split else len(block)
    pad = b"\x03" if flags & PADDED else b""
    head = pad + (fields if flags & PRIORITY else b"") + block[:cut] + b"\x00" * len(pad) * 3
    if not split:
        return _raw(HEADERS, flags | END_HEADERS, stream, head)
    return _raw(HEADERS, flags, stream, head) + _raw(CONTINUATION, END_HEADERS, stream, block[cut:])


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("priority", [False, True])
@pytest.mark.parametrize("end_stream", [False, True])
@pytest.mark.parametrize("size", [10, 16384, 40000])
def test_re_encoded_blocks_are_re_framed(padded: bool, priority: bool, end_stream: bool, size: int) -> None:
    """HEADERS flags of the client's frame carried over (END_STREAM, PRIORITY and its fields), padding
    dropped, a block over 16384 bytes split into CONTINUATIONs, END_HEADERS on the last frame only; the
    sandbox's decoder, following the router's dynamic table, decodes every one."""
    encoder = hpack.Encoder()
    headers = [("x-sandbox-id", "a"), ("authorization", "Bearer t"), ("x-big", "z" * size)]
    flags = (END_STREAM if end_stream else 0) | (PADDED if padded else 0) | (PRIORITY if priority else 0)
    fields = (5).to_bytes(4, "big") + b"\x07"
    client = _ClientFrames()
    sandbox = hpack.Decoder()
    # The second time the client's encoder refers to its dynamic table (for what fits in it). On a new
    # stream: a second request block on stream 1 is a protocol error (`test_stream_states`).
    for stream, split in ((1, True), (3, False)):
        frames, blocks = client.feed(_client_headers(flags, fields, encoder.encode(headers), split, stream))
        assert blocks == [(stream, headers)]
        out = _parsed(b"".join(frames))
        assert all(len(p) <= 16384 for *_, p in out)
        assert [t for t, *_ in out] == [HEADERS] + [CONTINUATION] * (len(out) - 1)
        assert [f & END_HEADERS for _, f, _, _ in out] == [0] * (len(out) - 1) + [END_HEADERS]
        assert out[0][1] & ~END_HEADERS == (END_STREAM if end_stream else 0) | (PRIORITY if priority else 0)
        assert {s for _, _, s, _ in out} == {stream}
        first = out[0][3]
        if priority:
            assert first[:5] == fields
            first = first[5:]
        forwarded = [(str(k), str(v)) for k, v in sandbox.decode(first + b"".join(p for *_, p in out[1:]))]
        assert forwarded == [("x-sandbox-id", "a"), ("x-big", "z" * size)]


_names = st.one_of(
    st.sampled_from(
        [b":method", b":path", b"content-type", b"te", b"accept-encoding", b"x-a", b"www-authenticate"]
    ),
    st.binary(min_size=1, max_size=200),
)


@given(
    fields=st.lists(
        st.tuples(
            _names,
            st.one_of(
                st.sampled_from([b"", b"GET", b"POST", b"gzip, deflate", b"/"]), st.binary(max_size=300)
            ),
            st.booleans(),
        ),
        max_size=12,
    ),
    sizes=st.lists(st.sampled_from([0, 100, 256, 4096]), max_size=4),
)
def test_the_table_encoder_round_trips(fields: list[tuple[bytes, bytes, bool]], sizes: list[int]) -> None:
    """Whatever the fields (static-table hits, long names and values, never-indexed marks) and table sizes
    the peer allows, the router's encoder produces blocks that a decoder held to the size decodes to the same
    fields and marks (the second time mostly from its dynamic table), its table the encoder's."""
    from agent_sandbox.router._h2c_hpack import _TableEncoder

    headers = [
        hpack.NeverIndexedHeaderTuple(n, v) if never else hpack.HeaderTuple(n, v) for n, v, never in fields
    ]
    encoder, decoder = _TableEncoder(), hpack.Decoder()
    for size in [*sizes, 4096]:
        encoder.limit(size)
        decoder.max_allowed_table_size = size
        for _ in range(2):
            decoded = list(decoder.decode(encoder.encode_block(headers), raw=True))
            assert [(bytes(k), bytes(v)) for k, v in decoded] == [(n, v) for n, v, _ in fields]
            assert [isinstance(h, hpack.NeverIndexedHeaderTuple) for h in decoded] == [n for *_, n in fields]
            assert list(decoder.header_table.dynamic_entries) == list(encoder.header_table.dynamic_entries)
            assert decoder.header_table_size <= size


def test_repeated_fields_are_re_encoded_as_references() -> None:
    """A field the client repeats (a 2 KiB metadata value on every gRPC call) reaches the sandbox as a table
    reference again, a few bytes, not as 2 KiB of literal per call; credentials are never indexed."""
    from agent_sandbox.router._h2c_hpack import _TableEncoder

    encoder = _TableEncoder()
    call = [
        hpack.HeaderTuple(b":method", b"POST"),
        hpack.HeaderTuple(b":path", b"/pkg.Svc/Call"),
        hpack.HeaderTuple(b"x-token", b"t" * 2048),
        hpack.HeaderTuple(b"proxy-authorization", b"Basic abc"),
    ]
    first = encoder.encode_block(call)
    assert len(first) > 2048
    assert len(encoder.encode_block(call)) < 20
    assert [bytes(n) for n, _ in encoder.header_table.dynamic_entries] == [b"x-token", b":path"]


# --------------------------------------------------------------------------------------------- trailers

# What HTTP/1.1 keeps out of relayed trailers (`_request.trailer_allowed`), in a trailer section.
_KEPT_OUT = [
    (b"x-sandbox-namespace", b"other"),
    (b"x-sandbox-pod-ip", b"10.0.0.9"),
    (b"X-Sandbox-ID", b"beta"),
    (b"authorization", b"Bearer t"),
    (b"connection", b"close"),
    (b"host", b"elsewhere"),
    (b"x-forwarded-for", b"1.2.3.4"),
]


def _fields(block: bytes, decoder: hpack.Decoder) -> list[tuple[bytes, bytes]]:
    return [(bytes(k), bytes(v)) for k, v in decoder.decode(block, raw=True)]


def _blocks(data: bytes, decoder: hpack.Decoder) -> list[tuple[int, int, int, list[tuple[bytes, bytes]]]]:
    """(type, first frame's flags, stream, fields) of every header block in `data`, as a client decodes them."""
    out: list[tuple[int, int, int, list[tuple[bytes, bytes]]]] = []
    block, first = b"", (0, 0, 0)
    for ftype, flags, stream, payload in _parsed(data):
        if ftype == HEADERS:
            assert not flags & (PADDED | PRIORITY)
            block, first = payload, (ftype, flags, stream)
        elif ftype == PUSH_PROMISE:
            block, first = payload[4:], (ftype, flags, stream)
        elif ftype == CONTINUATION:
            block += payload
        else:
            continue
        if flags & END_HEADERS:
            out.append((*first, _fields(block, decoder)))
    return out


def test_client_trailers_are_relayed_without_what_http11_keeps_out() -> None:
    """A trailer section of an open stream reaches the sandbox without routing, credential and hop-by-hop
    fields, as on HTTP/1.1; until December 7 only `authorization` and the connection-specific fields were
    dropped (a trailing `x-sandbox-namespace` reached the sandbox). The request's own block is unchanged."""
    encoder = hpack.Encoder()
    request = [(b":method", b"POST"), (b":path", b"/x"), (b"x-sandbox-id", b"alpha"), (b"x-keep", b"1")]
    client = _ClientFrames()
    frames, blocks = client.feed(
        _raw(HEADERS, END_HEADERS, 1, encoder.encode(request))
        + _raw(HEADERS, END_HEADERS | END_STREAM, 1, encoder.encode([*_KEPT_OUT, (b"grpc-x", b"2")]))
    )
    decoder = hpack.Decoder()
    relayed = _blocks(b"".join(frames), decoder)
    assert [fields for *_, fields in relayed] == [request, [(b"grpc-x", b"2")]]
    assert len(blocks) == 2  # the session still sees the trailer section whole (it routes nothing on it)


def test_sandbox_blocks_are_re_encoded_and_its_trailers_filtered() -> None:
    """The sandbox's response heads reach the client unchanged in content, its trailer sections (no
    pseudo-header) without what HTTP/1.1 keeps out; the sandbox's encoder indexes (its later blocks name
    entries its earlier ones added, the filtered ones too) and the client's decoder still decodes every block
    the router re-encoded."""
    encoder = hpack.Encoder()  # indexes every field it may: later blocks are mostly table references
    head = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"x-sandbox-pod-ip", b"kept")]
    trailers = [(b"grpc-status", b"0"), *_KEPT_OUT, (b"x-trailer", b"t")]
    wire = b""
    for stream in (1, 3):
        head_block = encoder.encode(head)
        block = encoder.encode(trailers)  # in the order they are sent, as the table changes
        wire += (
            _raw(HEADERS, END_HEADERS, stream, head_block)
            + _raw(DATA, 0, stream, b"\x00\x00\x00\x00\x01z")
            # split over a CONTINUATION
            + _raw(HEADERS, END_STREAM, stream, block[:5])
            + _raw(CONTINUATION, END_HEADERS, stream, block[5:])
        )
    server = _ServerFrames()
    relayed = b""
    for i in range(0, len(wire), 7):  # any read size
        out, _ = server.feed(wire[i : i + 7])
        relayed += out
    assert server.failed is None
    decoder = hpack.Decoder()
    blocks = _blocks(relayed, decoder)
    kept = [(b"grpc-status", b"0"), (b"x-trailer", b"t")]
    assert blocks == [
        (HEADERS, END_HEADERS, 1, head),
        (HEADERS, END_STREAM | END_HEADERS, 1, kept),  # one frame now
        (HEADERS, END_HEADERS, 3, head),
        (HEADERS, END_STREAM | END_HEADERS, 3, kept),
    ]
    assert [f[3] for f in _parsed(relayed) if f[0] == DATA] == [b"\x00\x00\x00\x00\x01z"] * 2


def test_a_trailers_only_response_is_a_head() -> None:
    """A gRPC error is a single block with `:status` and END_STREAM: a head, relayed whole."""
    fields = [(b":status", b"200"), (b"grpc-status", b"7"), (b"x-sandbox-id", b"alpha")]
    out, _ = _ServerFrames().feed(_raw(HEADERS, END_HEADERS | END_STREAM, 1, hpack.Encoder().encode(fields)))
    assert _blocks(out, hpack.Decoder()) == [(HEADERS, END_HEADERS | END_STREAM, 1, fields)]


def test_a_push_promise_is_re_encoded_in_the_sandboxs_hpack_context() -> None:
    encoder = hpack.Encoder()
    promised = [(b":method", b"GET"), (b":path", b"/pushed"), (b"x-a", b"1")]
    head = [(b":status", b"200"), (b"x-a", b"1")]
    block = encoder.encode(promised)
    wire = (
        _raw(PUSH_PROMISE, PADDED, 1, b"\x02" + (2).to_bytes(4, "big") + block[:3] + b"\x00\x00")
        + _raw(CONTINUATION, END_HEADERS, 1, block[3:])
        + _raw(HEADERS, END_HEADERS, 2, encoder.encode(head))
    )
    out, _ = _ServerFrames().feed(wire)
    parsed = _parsed(out)
    assert (parsed[0][0], parsed[0][1], parsed[0][3][:4]) == (
        PUSH_PROMISE,
        END_HEADERS,
        (2).to_bytes(4, "big"),
    )
    assert _blocks(out, hpack.Decoder()) == [
        (PUSH_PROMISE, END_HEADERS, 1, promised),
        (HEADERS, END_HEADERS, 2, head),
    ]


@pytest.mark.parametrize(
    "wire",
    [
        _raw(HEADERS, 0, 1, b"\x82") + _raw(DATA, 0, 1, b"x"),  # a frame inside a header block
        _raw(CONTINUATION, END_HEADERS, 1, b"\x82"),  # a CONTINUATION with no block
        _raw(HEADERS, 0, 1, b"\x82") + _raw(CONTINUATION, END_HEADERS, 3, b"\x82"),  # another stream's
        _raw(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff"),  # no HPACK
    ],
    ids=["interleaved", "orphan-continuation", "continuation-on-another-stream", "undecodable"],
)
def test_broken_sandbox_blocks_stop_the_relay_after_what_came_before(wire: bytes) -> None:
    data = _raw(DATA, 0, 1, b"before")
    server = _ServerFrames()
    out, _ = server.feed(data + wire)
    assert out == data
    assert server.failed is not None
    assert server.feed(_raw(DATA, 0, 1, b"after")) == (b"", 0)
