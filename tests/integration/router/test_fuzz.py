"""Property-based fuzzing of the router's hand-written HTTP server and its routing checks, on a real router.

The table tests (`test_malformed.py`) pin exact answers for known hostile inputs; this file generates
requests (methods, targets, routing headers, framing headers, bodies) and raw byte streams, and checks
what must hold for any of them:

* an answer arrives within a bound (or, for bytes that are not a request, the connection closes): no hang;
* no 500 ever, and every answer the router makes itself is `{"detail": "..."}` JSON;
* what reaches the sandbox is what was sent (method, raw target, body) and no hop-by-hop or credential
  header leaks through;
* the router still serves afterwards.

Every generated Pod IP is the test backend's own loopback address, a dead loopback address or one the router
must refuse before dialling, so nothing is sent off this machine. A request without one would be resolved by
the DNS form; the fixture replaces that lookup with a dial error it counts (this machine's resolver is on a
private address, which tests must not reach; see conftest).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from agent_sandbox.router import Router
from agent_sandbox.router._resolve import DialError, Target
from agent_sandbox.router._routing import Route
from tests.helpers import fuzz_settings

from .conftest import Backend, RawResponse, exchange, fresh_ip, still_serving

pytestmark = pytest.mark.integration

FUZZ = fuzz_settings("ROUTER_FUZZ_EXAMPLES", 150)


# A second loopback address with nothing listening: a valid target whose dial fails (502 path).
DEAD_IP = fresh_ip()


def _router_made(answer: RawResponse) -> bool:
    # every answer of the sandbox stand-in (aiohttp), its own 400s included, names its server; the router's don't
    return "aiohttp" not in answer.headers.get("server", "")


def _json(body: bytes) -> dict[str, object]:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def check_router_answer(answer: RawResponse, sent: bytes, *, head: bool = False) -> None:
    """No 500, and an error the router made itself is its JSON shape (only announced, for HEAD)."""
    assert answer.status != 500, (sent[:300], answer)
    if answer.status >= 400 and _router_made(answer):
        assert answer.headers.get("content-type") == "application/json", (sent[:300], answer)
        if head:
            return
        detail = _json(answer.body).get("detail")
        assert isinstance(detail, str), (sent[:300], answer)
        assert detail, (sent[:300], answer)


@pytest.fixture
async def fuzz_router(start_router: Callable[..., Awaitable[Router]]) -> Router:
    router = await start_router(
        "--read-header-timeout=1s",
        "--upstream-max-retries=0",
        "--response-header-timeout=3s",
        "--max-request-header-bytes=16384",
        "--max-request-body-bytes=65536",
    )
    assert router.proxy is not None

    async def no_dns(route: Route) -> Target:
        raise DialError(f"no DNS in tests ({route.sandbox_id}.{route.namespace})")

    router.proxy.resolver._resolve_dns = no_dns  # type: ignore[method-assign]
    return router


# ----------------------------------------------------------------------------------------------- strategies

# Header values are bytes on the wire; HTTP allows latin-1 text, so generate latin-1 including controls.
LATIN1 = st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=12)
TOKENS = st.sampled_from(["", " ", "sb", "a-b", "Sb", "a.b", "a" * 64, "-a", "a-", "x y", "é", "0", "sb\t"])
PORTS = st.sampled_from(["", "0", "1", "65535", "65536", "-1", "+80", " 80", "8e1", "0x50", "٨٠", "80.0"])
TIMEOUTS = st.sampled_from(["", "1", "0", "-1", "nan", "inf", "1e309", "0.5", "abc", "2.5e-1"])
# Refused before any dial, or malformed: never a reason to leave this machine.
REFUSED_IPS = [
    "169.254.169.254",
    "::ffff:169.254.169.254",
    "0.0.0.0",
    "::",
    "224.0.0.1",
    "ff02::1",
    "fe80::1",
    "fe80::1%lo",
    "[::1]",
    "127.0.0.1:80",
    "localhost",
    "1.2.3",
    "",
    "127.1",
    "0177.0.0.1",
]
METHODS = st.sampled_from(
    [
        "GET",
        "POST",
        "PUT",
        "DELETE",
        "PATCH",
        "HEAD",
        "OPTIONS",
        "TRACE",
        "CONNECT",
        "get",
        "G\x00T",
        "PRI",
        "X" * 40,
    ]
)
SEGMENTS = st.sampled_from(
    [
        "",
        ".",
        "..",
        "a",
        "%2F",
        "%2e%2E",
        "%00",
        "%",
        "%zz",
        "é",
        "~",
        "a b",
        "?",
        "?q=1&q=2",
        "#f",
        ";p",
        "//",
        "\\",
    ]
)
TARGETS = st.one_of(
    st.lists(SEGMENTS, max_size=5).map(lambda s: "/" + "/".join(s)),
    st.sampled_from(
        ["*", "http://evil.example/x", "//evil.example", "", "/healthz", "/healthz?x", "/HEALTHZ"]
    ),
    LATIN1.map(lambda s: "/" + s),
)
FRAMING = st.sampled_from(
    ["length", "none", "chunked", "chunked-bad", "length-short", "both", "length-twice"]
)
EXTRA_HEADERS = st.lists(
    st.one_of(
        st.sampled_from(
            [
                ("Connection", "close"),
                ("Connection", "keep-alive, X-Drop"),
                ("X-Drop", "hop"),
                ("Connection", "Upgrade"),
                ("Upgrade", "websocket"),
                ("Upgrade", "h2c"),
                ("HTTP2-Settings", "AAMAAABkAAQAAP__"),
                ("Expect", "100-continue"),
                ("Proxy-Authorization", "Basic eDp4"),
                ("Authorization", "Bearer secret-token"),
                ("Keep-Alive", "timeout=5"),
                ("TE", "trailers"),
                ("Trailer", "X-T"),
                ("Host", "other.example"),
                ("X-Forwarded-For", "1.2.3.4"),
                ("Origin", "http://evil.example"),
                ("Content-Type", "application/json"),
            ]
        ),
        st.tuples(st.text("abcxyzXYZ-_:", min_size=0, max_size=8), LATIN1),
    ),
    max_size=4,
)


MUTATIONS = (
    "method",
    "target",
    "id",
    "id-twice",
    "namespace",
    "port",
    "ip",
    "no-ip",
    "timeout",
    "extra",
    "framing",
)


@st.composite
def requests(draw: st.DrawFn, backend: Backend) -> tuple[bytes, str, bool]:
    """(wire bytes, method, whether the body is shorter than announced): a request that reaches the
    backend, with up to three parts of it mutated."""
    mutate = draw(st.sets(st.sampled_from(MUTATIONS), max_size=3))
    method = draw(METHODS) if "method" in mutate else draw(st.sampled_from(["GET", "POST", "PUT", "DELETE"]))
    target = (
        draw(TARGETS)
        if "target" in mutate
        else "/" + "/".join(draw(st.lists(st.sampled_from(["a", "b", "x.txt", "?q=1"]), max_size=3)))
    )
    headers: list[tuple[str, str]] = [("Host", "router.test")]
    headers.append(("X-Sandbox-ID", draw(TOKENS) if "id" in mutate else "sb"))
    if "id-twice" in mutate:
        headers.append(("X-Sandbox-ID", draw(TOKENS)))
    if "namespace" in mutate:
        headers.append(("X-Sandbox-Namespace", draw(TOKENS)))
    headers.append(("X-Sandbox-Port", draw(PORTS) if "port" in mutate else str(backend.port)))
    if "no-ip" not in mutate:
        ip = draw(st.sampled_from([DEAD_IP, *REFUSED_IPS])) if "ip" in mutate else backend.ip
        headers.append(("X-Sandbox-Pod-IP", ip))
    if "timeout" in mutate:
        headers.append(("X-Sandbox-Timeout", draw(TIMEOUTS)))
    if "extra" in mutate:
        headers += draw(EXTRA_HEADERS)
    body = draw(st.binary(max_size=200))
    framing = draw(FRAMING) if "framing" in mutate else "length"
    tail = body
    if framing == "length":
        headers.append(("Content-Length", str(len(body))))
    elif framing == "length-short":
        headers.append(("Content-Length", str(len(body) + 5)))
    elif framing == "length-twice":
        headers += [("Content-Length", str(len(body))), ("Content-Length", str(len(body) + 1))]
    elif framing == "both":
        headers += [("Content-Length", str(len(body))), ("Transfer-Encoding", "chunked")]
    elif framing.startswith("chunked"):
        headers.append(("Transfer-Encoding", "chunked"))
        size = f"{len(body):x}" if framing == "chunked" else draw(st.sampled_from(["zz", "-1", "f" * 18, ""]))
        tail = (f"{size}\r\n".encode() + body + b"\r\n0\r\n\r\n") if body else b"0\r\n\r\n"
    elif framing == "none":
        tail = b""
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode() + tail, method, framing == "length-short"


# -------------------------------------------------------------------------------------------------- tests


@FUZZ
@given(data=st.data())
async def test_generated_requests(fuzz_router: Router, backend: Backend, data: st.DataObject) -> None:
    wire, method, short = data.draw(requests(backend))
    port = fuzz_router.http_port or 0
    # A body shorter than announced is waited for like a slow upload (no body read timeout, as Go's server
    # with ReadTimeout 0), so that client ends its side as one that gave up would. Any other request is
    # answered on an open connection: like Go's server, the router takes a half-close as the client leaving.
    answer = await exchange(port, wire, head=method == "HEAD", half_close=short)
    event(
        f"status {answer.status} {_json(answer.body).get('detail', '')}"
        + (" from the sandbox" if backend.seen else "")
    )
    if answer.status:
        check_router_answer(answer, wire, head=method == "HEAD")
    # nothing hop-by-hop or credential-bearing reaches a sandbox
    dropped = {"authorization", "proxy-authorization", "keep-alive", "te"}
    if b"Connection: keep-alive, X-Drop\r\n" in wire:
        dropped.add("x-drop")
    if b"Connection: Upgrade\r\n" not in wire:
        dropped.add("upgrade")  # an upgrade request is relayed as one (router spec 1.8)
    for seen in backend.seen:
        names = {k.lower() for k, _ in seen.get("headers", [])}
        assert not names & dropped, (wire[:300], seen)
    backend.seen.clear()
    await still_serving(fuzz_router)


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
    target=st.lists(SEGMENTS.filter(lambda s: "#" not in s and " " not in s and "\\" not in s), max_size=5),
    body=st.binary(max_size=2000),
    chunked=st.booleans(),
)
async def test_what_reaches_the_sandbox_is_what_was_sent(
    fuzz_router: Router, backend: Backend, method: str, target: list[str], body: bytes, chunked: bool
) -> None:
    path = "/" + "/".join(target)
    headers = {**backend.headers(), "X-Drop": "x", "Connection": "X-Drop", "Authorization": "Bearer t"}
    lines = [f"{method} {path} HTTP/1.1", "Host: router.test", *(f"{k}: {v}" for k, v in headers.items())]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        tail = (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
    else:
        lines.append(f"Content-Length: {len(body)}")
        tail = body
    wire = ("\r\n".join(lines) + "\r\n\r\n").encode() + tail
    answer = await exchange(fuzz_router.http_port or 0, wire)
    if not path.isascii():
        # request-targets are ASCII (RFC 9112 section 3.2); docs/router.md, choices where routers differ
        assert (answer.status, _json(answer.body)) == (400, {"detail": "Malformed HTTP request."}), answer
        return
    assert answer.status == 200, (wire[:300], answer)
    seen = _json(answer.body)
    assert seen["method"] == method
    assert seen["raw_path"] == path, (path, seen["raw_path"])
    assert seen["body_len"] == len(body)
    names = {str(k).lower() for k, _ in seen["headers"]}  # type: ignore[attr-defined]
    assert not names & {"authorization", "x-drop"}, names
    backend.seen.clear()


# Raw streams: request-shaped prefixes with mangled tails, and plain noise. The sender ends its side, so an
# incomplete request must end in a 4xx or a close, never a wait for more.
PREFIXES = st.sampled_from(
    [
        b"",
        b"GET / HTTP/1.1\r\n",
        b"GET / HTTP/1.1\r\nHost: r\r\nX-Sandbox-ID: sb\r\n",
        b"POST /x HTTP/1.1\r\nHost: r\r\nContent-Length: 3\r\n\r\n",
        b"GET / HTTP/1.0\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"\x16\x03\x01",
    ]
)


@FUZZ
@given(prefix=PREFIXES, noise=st.binary(max_size=300))
async def test_raw_bytes(fuzz_router: Router, prefix: bytes, noise: bytes) -> None:
    wire = prefix + noise
    answer = await exchange(fuzz_router.http_port or 0, wire, half_close=True)
    event(f"status {answer.status}")
    if answer.status:
        assert answer.status < 500 or answer.status in (502, 503, 504), (wire, answer)
        check_router_answer(answer, wire)
    else:
        assert answer.closed, wire
    await still_serving(fuzz_router)
