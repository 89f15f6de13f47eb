"""Malformed and hostile requests: exact status and JSON body, never a crash, 5xx or hang.

Raw bytes over a socket to a real router, so nothing a client library would fix up gets fixed up. The
router must keep serving afterwards (checked at the end of each case).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent_sandbox.router import Router, mint_scoped_token

from .conftest import Backend, raw_request, request_bytes, scrape

pytestmark = pytest.mark.integration

SECRET = b"s" * 40


def h(**extra: str) -> str:
    """Header lines (CRLF-terminated) with X-Sandbox-ID: sb unless overridden."""
    headers = {"X-Sandbox-ID": "sb", **{k.replace("_", "-"): v for k, v in extra.items()}}
    return "".join(f"{k}: {v}\r\n" for k, v in headers.items())


def req(head: str, extra: str = "", body: bytes = b"") -> bytes:
    return f"{head}\r\nHost: r\r\n{extra}\r\n".encode("latin-1") + body


ERRORS = {
    "required": "X-Sandbox-ID header is required.",
    "id": "Invalid sandbox ID format.",
    "ns": "Invalid namespace format.",
    "port": "Invalid port format.",
    "ip": "Invalid target IP address.",
    "timeout": "Invalid timeout format.",
    "malformed": "Malformed HTTP request.",
}

CASES: list[tuple[str, bytes, int, str]] = [
    ("no sandbox id", req("GET / HTTP/1.1"), 400, ERRORS["required"]),
    ("empty sandbox id", req("GET / HTTP/1.1", "X-Sandbox-ID: \r\n"), 400, ERRORS["required"]),
    ("uppercase id", req("GET / HTTP/1.1", h(X_Sandbox_ID="Sandbox")), 400, ERRORS["id"]),
    ("id with dots", req("GET / HTTP/1.1", h(X_Sandbox_ID="a.b")), 400, ERRORS["id"]),
    ("64-char id", req("GET / HTTP/1.1", h(X_Sandbox_ID="a" * 64)), 400, ERRORS["id"]),
    ("bad namespace", req("GET / HTTP/1.1", h(X_Sandbox_Namespace="kube_system")), 400, ERRORS["ns"]),
    ("port zero", req("GET / HTTP/1.1", h(X_Sandbox_Port="0")), 400, ERRORS["port"]),
    ("port too big", req("GET / HTTP/1.1", h(X_Sandbox_Port="70000")), 400, ERRORS["port"]),
    ("port not a number", req("GET / HTTP/1.1", h(X_Sandbox_Port="http")), 400, ERRORS["port"]),
    ("ip not an ip", req("GET / HTTP/1.1", h(X_Sandbox_Pod_IP="sandbox.local")), 400, ERRORS["ip"]),
    ("ip with port", req("GET / HTTP/1.1", h(X_Sandbox_Pod_IP="10.0.0.1:80")), 400, ERRORS["ip"]),
    ("metadata ip", req("GET / HTTP/1.1", h(X_Sandbox_Pod_IP="169.254.169.254")), 400, ERRORS["ip"]),
    (
        "mapped metadata ip",
        req("GET / HTTP/1.1", h(X_Sandbox_Pod_IP="::ffff:169.254.169.254")),
        400,
        ERRORS["ip"],
    ),
    ("ipv6 loopback", req("GET / HTTP/1.1", h(X_Sandbox_Pod_IP="::1")), 400, ERRORS["ip"]),
    ("ipv4 loopback", req("GET / HTTP/1.1", h(X_Sandbox_Pod_IP="127.0.0.1")), 400, ERRORS["ip"]),
    ("link-local v6", req("GET / HTTP/1.1", h(X_Sandbox_Pod_IP="fe80::1")), 400, ERRORS["ip"]),
    ("unspecified", req("GET / HTTP/1.1", h(X_Sandbox_Pod_IP="0.0.0.0")), 400, ERRORS["ip"]),
    ("multicast", req("GET / HTTP/1.1", h(X_Sandbox_Pod_IP="239.0.0.1")), 400, ERRORS["ip"]),
    ("timeout text", req("GET / HTTP/1.1", h(X_Sandbox_Timeout="soon")), 400, ERRORS["timeout"]),
    ("timeout negative", req("GET / HTTP/1.1", h(X_Sandbox_Timeout="-3")), 400, ERRORS["timeout"]),
    ("timeout nan", req("GET / HTTP/1.1", h(X_Sandbox_Timeout="NaN")), 400, ERRORS["timeout"]),
    (
        "duplicate id",
        req("GET / HTTP/1.1", "X-Sandbox-ID: a\r\nX-Sandbox-ID: b\r\n"),
        400,
        "Duplicate X-Sandbox-ID header.",
    ),
    (
        "bare CR in a header (CRLF injection)",
        req("GET / HTTP/1.1", "X-Sandbox-ID: sb\rInjected: 1\r\n"),
        400,
        ERRORS["malformed"],
    ),
    (
        "bare LF in a header",
        b"GET / HTTP/1.1\r\nHost: r\r\nX-Sandbox-ID: sb\nX-Evil: 1\r\n\r\n",
        400,
        ERRORS["malformed"],
    ),
    (
        "CRLF in the request target",
        b"GET /a\r\nX-Injected: 1 HTTP/1.1\r\nHost: r\r\n\r\n",
        400,
        ERRORS["malformed"],
    ),
    ("header without colon", req("GET / HTTP/1.1", h() + "NoColonHere\r\n"), 400, ERRORS["malformed"]),
    ("obs-fold continuation", req("GET / HTTP/1.1", h() + "X-A: 1\r\n folded\r\n"), 400, ERRORS["malformed"]),
    (
        "content-length and chunked (smuggling)",
        req("POST / HTTP/1.1", h(Content_Length="4", Transfer_Encoding="chunked"), b"0\r\n\r\n"),
        400,
        ERRORS["malformed"],
    ),
    (
        "two content-lengths",
        req("POST / HTTP/1.1", h() + "Content-Length: 1\r\nContent-Length: 2\r\n", b"ab"),
        400,
        ERRORS["malformed"],
    ),
    ("bad version", req("GET / HTTP/9.9", h()), 400, ERRORS["malformed"]),
    # as Go's server (until December 6 these were proxied)
    ("no Host in HTTP/1.1", f"GET / HTTP/1.1\r\n{h()}\r\n".encode(), 400, ERRORS["malformed"]),
    ("two Hosts", req("GET / HTTP/1.1", h() + "Host: other\r\n"), 400, ERRORS["malformed"]),
    (
        "a coding before chunked",
        req("POST / HTTP/1.1", h(Transfer_Encoding="gzip") + "Transfer-Encoding: chunked\r\n", b"0\r\n\r\n"),
        501,
        "Unsupported transfer encoding.",
    ),
    (
        "a length past 10^18",
        req("POST / HTTP/1.1", h(Content_Length="18446744073709551615"), b"x"),
        400,
        ERRORS["malformed"],
    ),
    (
        "not http at all",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 40,
        400,
        ERRORS["malformed"],
    ),
    ("asterisk target", req("OPTIONS * HTTP/1.1", h()), 400, "Invalid request target."),
    ("CONNECT tunnel", req("CONNECT 10.0.0.1:443 HTTP/1.1", h()), 405, "Method not allowed."),
    (
        "oversize headers",
        req("GET / HTTP/1.1", h(X_Big="x" * 20000)),
        431,
        "Request header fields too large.",
    ),
    (
        "oversize body by length",
        req("POST / HTTP/1.1", h(Content_Length="5000"), b"x" * 10),
        413,
        "Request body too large.",
    ),
]


@pytest.fixture
async def hardened(start_router: Callable[..., Awaitable[Router]]) -> Router:
    return await start_router(
        "--max-request-header-bytes=8192", "--max-request-body-bytes=1024", loopback=False
    )


@pytest.mark.parametrize(("name", "data", "status", "detail"), CASES, ids=[c[0] for c in CASES])
async def test_malformed(hardened: Router, name: str, data: bytes, status: int, detail: str) -> None:
    resp = await raw_request(hardened.http_port or 0, data)
    assert resp.status == status, (name, resp)
    assert resp.headers["content-type"] == "application/json"
    assert json.loads(resp.body) == {"detail": detail}
    # Still serving.
    ok = await raw_request(hardened.http_port or 0, request_bytes("GET", "/healthz", {}))
    assert ok.status == 200


def _bearer(key: bytes, namespace: str, name: str, ttl: int, *, age: float = 0) -> Callable[[], str]:
    """An Authorization value minted when the test runs: minted at collection, a 600 s token had expired by
    the time a 20-minute suite reached the test."""
    return lambda: "Bearer " + mint_scoped_token(key, namespace, name, ttl, now=time.time() - age)


@pytest.fixture
async def scoped(start_router: Callable[..., Awaitable[Router]], tmp_path: Path) -> Router:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    return await start_router("--authz-mode=scoped-token", f"--authz-scoped-token-secret-file={secret}")


@pytest.mark.parametrize(
    ("name", "auth", "extra", "status", "detail"),
    [
        ("no token", None, {}, 401, "unauthenticated"),
        ("unknown scheme", "Basic c2I6c2I=", {}, 401, "unauthenticated"),
        ("garbage token", "Bearer not.a.token", {}, 401, "unauthenticated"),
        (
            "expired",
            _bearer(SECRET, "default", "sb", 1, age=60),
            {},
            401,
            "unauthenticated",
        ),
        (
            "wrong key",
            _bearer(b"o" * 40, "default", "sb", 600),
            {},
            401,
            "unauthenticated",
        ),
        (
            "other sandbox",
            _bearer(SECRET, "default", "other", 600),
            {},
            403,
            "forbidden",
        ),
        ("other namespace", _bearer(SECRET, "team", "sb", 600), {}, 403, "forbidden"),
        (
            "pod ip with scoped token",
            _bearer(SECRET, "default", "sb", 600),
            {"X-Sandbox-Pod-IP": "10.0.0.1"},
            403,
            "forbidden",
        ),
        (
            "uid with scoped token",
            _bearer(SECRET, "default", "sb", 600),
            {"X-Sandbox-UID": "u"},
            403,
            "forbidden",
        ),
    ],
)
async def test_scoped_token_refusals(
    scoped: Router,
    name: str,
    auth: str | Callable[[], str] | None,
    extra: dict[str, str],
    status: int,
    detail: str,
) -> None:
    headers = {"X-Sandbox-ID": "sb", **extra}
    if auth:
        headers["Authorization"] = auth() if callable(auth) else auth
    resp = await raw_request(scoped.http_port or 0, request_bytes("GET", "/", headers))
    assert (resp.status, json.loads(resp.body)) == (status, {"detail": detail}), name


@pytest.mark.parametrize(
    ("first", "second", "status", "detail"),
    [
        ("Bearer garbage", _bearer(SECRET, "default", "sb", 600), 401, "unauthenticated"),
        (_bearer(SECRET, "default", "other", 600), _bearer(SECRET, "default", "sb", 600), 403, "forbidden"),
    ],
)
async def test_the_first_of_two_authorization_headers_counts(
    scoped: Router,
    first: str | Callable[[], str],
    second: Callable[[], str],
    status: int,
    detail: str,
) -> None:
    """As upstream's `Header.Get`: the first value is the credential (the router took the last, so a
    valid token after a refused one got through)."""
    assert scoped.proxy is not None
    scoped.proxy.settings.max_retries = 0

    # What got through would be resolved by name: not here.
    async def no_dns(route: object, **_: object) -> object:
        from agent_sandbox.router._resolve import DialError

        raise DialError("no DNS in tests")

    scoped.proxy.resolver.resolve = no_dns  # type: ignore[method-assign,assignment]
    head = request_bytes(
        "GET", "/", {"X-Sandbox-ID": "sb", "Authorization": first() if callable(first) else first}
    )
    raw = head[:-2] + f"Authorization: {second()}\r\n\r\n".encode()
    resp = await raw_request(scoped.http_port or 0, raw)
    assert (resp.status, json.loads(resp.body)) == (status, {"detail": detail})


async def test_scoped_token_reaches_its_sandbox(
    start_router: Callable[..., Awaitable[Router]], backend: Backend, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    router = await start_router("--authz-mode=scoped-token", f"--authz-scoped-token-secret-file={secret}")
    # Scoped tokens forbid X-Sandbox-Pod-IP, so the request must resolve by name: without the cache that
    # is the DNS form, which tests must not use. Validation order is checked instead: a valid token gets
    # past authorization and fails only at resolution (dial error -> 502), never 401/403.
    token = mint_scoped_token(SECRET, "default", "sb", 600)
    headers = {"X-Sandbox-ID": "sb", "Authorization": f"Bearer {token}"}
    assert router.proxy is not None
    router.proxy.settings.max_retries = 0

    async def no_dns(route: object, **_: object) -> object:
        from agent_sandbox.router._resolve import DialError

        raise DialError("no DNS in tests")

    router.proxy.resolver.resolve = no_dns  # type: ignore[method-assign,assignment]
    resp = await raw_request(router.http_port or 0, request_bytes("GET", "/", headers))
    assert resp.status == 502
    assert not backend.seen


async def test_slowloris_is_cut_off(start_router: Callable[..., Awaitable[Router]]) -> None:
    router = await start_router("--read-header-timeout=1s")
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
    start = time.monotonic()
    data = b"GET / HTTP/1.1\r\nHost: r\r\nX-Sandbox-ID: sb\r\n" + b"X-Pad: " + b"a" * 200
    reading = asyncio.create_task(reader.read())
    async with asyncio.timeout(10):
        for byte in data:
            if reading.done():
                break
            writer.write(bytes([byte]))
            await asyncio.sleep(0.02)
        received = await reading
    writer.close()
    assert time.monotonic() - start < 3
    assert received.startswith(b"HTTP/1.1 408 ")
    assert received.endswith(b'{"detail":"Timed out reading the request headers."}')


async def test_the_header_clock_runs_from_the_accept(start_router: Callable[..., Awaitable[Router]]) -> None:
    """A new connection's first byte does not restart the header timeout (it did: 408 after 5.5 s with
    --read-header-timeout=3s for a client that waited 2.5 s and then trickled)."""
    router = await start_router("--read-header-timeout=1s")
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
    start = time.monotonic()
    await asyncio.sleep(0.7)
    reading = asyncio.create_task(reader.read())
    async with asyncio.timeout(10):
        for byte in b"GET / HTTP/1.1\r\nHost: r\r\nX-Pad: " + b"a" * 100:
            if reading.done():
                break
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)
        received = await reading
    writer.close()
    assert received.startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - start < 1.5


async def test_idle_keep_alive_connections_are_closed(start_router: Callable[..., Awaitable[Router]]) -> None:
    router = await start_router("--idle-timeout=500ms")
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
    writer.write(request_bytes("GET", "/healthz", {}))
    async with asyncio.timeout(5):
        await reader.readuntil(b'{"status":"ok"}')
        assert await reader.read() == b""  # closed by the router after the idle timeout
    writer.close()


async def test_concurrency_limit(start_router: Callable[..., Awaitable[Router]], backend: Backend) -> None:
    router = await start_router("--max-concurrent-requests=2")
    slow = [
        asyncio.create_task(
            raw_request(router.http_port or 0, request_bytes("GET", "/sleep/1", backend.headers()))
        )
        for _ in range(2)
    ]
    await asyncio.sleep(0.3)
    resp = await raw_request(router.http_port or 0, request_bytes("GET", "/x", backend.headers()))
    assert (resp.status, json.loads(resp.body)) == (503, {"detail": "Too many concurrent requests."})
    assert resp.headers["retry-after"] == "1"
    assert [r.status for r in await asyncio.gather(*slow)] == [200, 200]


async def test_chunked_body_over_the_cap(
    start_router: Callable[..., Awaitable[Router]], backend: Backend
) -> None:
    router = await start_router("--max-request-body-bytes=100")
    headers = backend.headers(**{"Transfer-Encoding": "chunked"})
    body = b"".join(b"40\r\n" + b"x" * 64 + b"\r\n" for _ in range(4)) + b"0\r\n\r\n"
    resp = await raw_request(router.http_port or 0, request_bytes("POST", "/upload", headers, body))
    assert (resp.status, json.loads(resp.body)) == (413, {"detail": "Request body too large."})
    assert resp.closed


async def test_a_refusal_in_the_heads_packet_is_counted_and_logged(
    start_router: Callable[..., Awaitable[Router]], backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """A chunked body over the cap that arrives with the head: the 413 was sent, but the request was missing
    from the metrics and the access log (its handler was cancelled before it ran)."""
    caplog.set_level(logging.INFO, logger="sandbox-router.access")
    router = await start_router("--max-request-body-bytes=100")
    headers = backend.headers(**{"Transfer-Encoding": "chunked"})
    body = b"".join(b"40\r\n" + b"x" * 64 + b"\r\n" for _ in range(4)) + b"0\r\n\r\n"
    for _ in range(2):
        resp = await raw_request(router.http_port or 0, request_bytes("POST", "/upload", headers, body))
        assert resp.status == 413
    await asyncio.sleep(0.2)
    text = await scrape(router)
    assert 'sandbox_router_requests_total{code="413",method="POST",sandbox_namespace="-"} 2.0' in text
    assert [r.__dict__["status"] for r in caplog.records if r.name == "sandbox-router.access"] == [413, 413]


async def test_whitespace_around_header_values_is_not_part_of_them(router: Router, backend: Backend) -> None:
    """RFC 9110 §5.5, as Go's textproto. Until December 6 `Content-Length: 41 ` was read as no length: the head
    went to the sandbox without its body, which the sandbox waited for until the router gave up (504 after
    30 s); a padded `X-Sandbox-Port` was refused as invalid."""
    body = b'{"command":"echo hi","timeout_seconds":5}'
    headers = backend.headers()
    lines = [f"{k}: {v}" for k, v in headers.items() if k != "X-Sandbox-Port"]
    padded = [f"X-Sandbox-Port: {backend.port} \t", f"Content-Length: {len(body)} \t"]
    head = "\r\n".join(["POST /upload HTTP/1.1", "Host: router.test", *lines, *padded, "", ""])
    answer = await raw_request(router.http_port or 0, head.encode() + body, within=5)
    assert answer.status == 200, answer
    assert json.loads(answer.body)["received"] == len(body)
