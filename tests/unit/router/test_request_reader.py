"""What the router's request reader makes of client bytes, however TCP splits them: trailer fields kept
apart from the head, HTTP/0.9 request lines and unmeetable `Expect`s refused at once.

The reader is fed bytes directly (no socket): what it hands on (`_received`) and what it refuses
(`_refuse`) are recorded. The integration tests in tests/integration/router/test_request_framing.py send
the same bytes to a real router.
"""

from __future__ import annotations

import pytest

from agent_sandbox.router._request import Request
from agent_sandbox.router._request_reader import RequestReader
from agent_sandbox.router._server import ConnectionLimits

pytestmark = pytest.mark.unit


class _Reader(RequestReader):
    def __init__(self) -> None:
        super().__init__(ConnectionLimits(max_header_bytes=16384))
        self.received: list[Request] = []
        self.refused: list[tuple[int, str]] = []

    def _received(self, req: Request) -> None:
        self.received.append(req)

    def _refuse(self, status: int, detail: str) -> None:
        self.refused.append((status, detail))


def feed(*reads: bytes) -> _Reader:
    reader = _Reader()
    for data in reads:
        reader._feed(data)
    return reader


HEAD = (
    b"PUT /v1/files/t HTTP/1.1\r\nHost: client.example\r\nTransfer-Encoding: chunked\r\n"
    b"X-Sandbox-ID: sb\r\nTrailer: X-Checksum, X-Sandbox-Namespace\r\n\r\n"
)
BODY = b"5\r\nhello\r\n"
TRAILERS = (
    b"0\r\nX-Sandbox-Namespace: other\r\nX-Sandbox-Pod-IP: 10.0.0.9\r\nHost: evil.example\r\n"
    b"Authorization: Bearer t\r\nConnection: close\r\nX-Checksum: abc123\r\n\r\n"
)


@pytest.mark.parametrize(
    "reads",
    [(HEAD + BODY + TRAILERS,), (HEAD, BODY + TRAILERS), (HEAD + BODY, TRAILERS)],
    ids=["one read", "trailers in a later read", "trailers alone"],
)
def test_trailer_fields_are_never_head_fields(reads: tuple[bytes, ...]) -> None:
    """Until December 7 trailers read with the head became headers: routing, the Pod-IP check (a second one
    was a duplicate: 400), X-Forwarded-Host, the credential and the length all changed with TCP's split."""
    reader = feed(*reads)
    assert reader.refused == []
    [req] = reader.received
    assert req.routing == {b"x-sandbox-id": b"sb"}
    assert req.duplicates == set()
    assert (req.host, req.host_lines, req.authorization) == (b"client.example", 1, None)
    assert (req.content_length, req.chunked, req.connection_tokens) == (None, True, ())
    assert [lname for lname, _, _ in req.headers] == [
        b"host",
        b"transfer-encoding",
        b"x-sandbox-id",
        b"trailer",
    ]
    assert req.trailers == [(b"X-Checksum", b"abc123")]  # the router-owned and framing fields are dropped
    assert req.body is not None
    assert req.body.done
    assert req.body.take_buffered() == b"hello"


def test_trailer_section_is_bounded() -> None:
    reader = feed(HEAD + BODY + b"0\r\n" + b"X-Pad: " + b"p" * 20000 + b"\r\n\r\n")
    assert reader.refused == [(431, "Request header fields too large.")]


@pytest.mark.parametrize(
    "reads",
    [
        (b"GET /x\r\n",),
        (b"GET /x", b"\r\n"),
        (b"GET /x\n",),
        (b"GET http://a:80/x\r\n",),
        (b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b\r\n",),  # a previous request on the connection
    ],
    ids=["one read", "split", "bare LF", "absolute form", "after a request"],
)
def test_a_request_line_without_version_is_refused_at_once(reads: tuple[bytes, ...]) -> None:
    """As Go. Until December 7 llhttp read on for headers and the client got a 408 after 10 s."""
    reader = feed(*reads)
    assert reader.refused == [(400, "Malformed HTTP request.")]


@pytest.mark.parametrize(
    "reads",
    [
        (b"GET /x HTTP/1.1\r\n",),
        (b"GET /x HTTP/1", b".1\r\n"),
        (b"GET /x HTTP/1.1\r\nHost: a b c\r\n",),  # httptools reports a field only when the next starts
        (b"GET /x HTTP/1.1\r\nHost: a\r\n", b"X-A: b c\r\n"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1", b"\r\n"),
        (b"GET /x HTTP/1.1\r\nX-Big: a", b" b" * 5000, b"\r\n"),  # its start is not kept: not judged
        (b"GET /x HTTP/1.1\r\nX-Big: " + b"v " * 5000, b"\r\n"),
    ],
)
def test_an_unfinished_head_is_not_taken_for_http09(reads: tuple[bytes, ...]) -> None:
    reader = feed(*reads)
    assert reader.refused == []


@pytest.mark.parametrize(
    ("expect", "continues", "refused"),
    [
        (b"100-continue", True, []),
        (b"100-Continue", True, []),
        (b"100-continue, x", True, []),  # Go's hasToken
        (b"", False, []),
        (b"200-ok", False, [(417, "Unsupported Expect header: only 100-continue is supported.")]),
    ],
)
def test_expect(expect: bytes, continues: bool, refused: list[tuple[int, str]]) -> None:
    """Go answers 417 to an expectation other than 100-continue; until December 7 the router dropped it and
    forwarded the request, and the client waited a minute for the sandbox's 408."""
    reader = feed(
        b"POST /upload HTTP/1.1\r\nHost: r\r\nContent-Length: 10\r\nExpect: " + expect + b"\r\n\r\n"
    )
    assert reader.refused == refused
    assert [r.expect_continue for r in reader.received] == ([] if refused else [continues])


def test_the_first_expect_counts() -> None:
    reader = feed(
        b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: 1\r\nExpect: 100-continue\r\nExpect: x\r\n\r\n"
    )
    assert reader.refused == []
    assert reader.received[0].expect_continue


def test_no_100_continue_to_an_http10_client() -> None:
    reader = feed(b"POST / HTTP/1.0\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n")
    assert [r.expect_continue for r in reader.received] == [False]


def test_a_trailer_field_that_never_ends_is_bounded() -> None:
    """httptools buffers a field until it ends: without a count of the bytes after the last payload byte, a
    trailer that never ends grew the router's memory for as long as the client sent."""
    reader = _Reader()
    reader._feed(HEAD + BODY + b"0\r\nX-Pad: ")
    for _ in range(40):
        reader._feed(b"p" * 4096)
        if reader.refused:
            break
    assert reader.refused == [(431, "Request header fields too large.")]


@pytest.mark.parametrize("size", [100_000, 250_000])
def test_a_large_read_of_chunk_payload_is_not_taken_for_an_unending_trailer(size: int) -> None:
    """The count of bytes since the last payload byte checks the reads before this one only: a read carries
    up to 256 KiB, mostly payload, and counted whole before parsing, one past `--max-request-header-bytes` +
    64 KiB (16 KiB here, as a router run with a small head cap) was refused 431 mid-upload."""
    reader = feed(HEAD, b"%x\r\n" % size + b"x" * size + b"\r\n", b"0\r\n\r\n")
    assert reader.refused == []
    [req] = reader.received
    assert req.body is not None
    assert req.body.done
    assert len(req.body.take_buffered()) == size
