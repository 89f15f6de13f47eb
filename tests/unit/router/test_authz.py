"""Authorization modes (router spec §1.10): bearer parsing, scoped tokens, the TokenReview verdict cache."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
from typing import Any

import pytest

from agent_sandbox.kube import ServerError
from agent_sandbox.router._authz import AllowAll, ScopedToken, TokenReview, bearer_token, mint_scoped_token
from agent_sandbox.router._routing import Route, RouteError

pytestmark = pytest.mark.unit

KEY = b"k" * 32
NOW = 1_700_000_000.0
ROUTE = Route("sb", "team", 8888)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (b"Bearer abc", "abc"),
        (b"bearer abc", "abc"),
        (b"BEARER  abc ", "abc"),
        (b"Basic abc", ""),
        (b"Bearer", ""),
        (None, ""),
        (b"", ""),
    ],
)
def test_bearer_token(header: bytes | None, token: str) -> None:
    assert bearer_token(header) == token


def test_allow_all() -> None:
    assert AllowAll().check(ROUTE, None) is None


def test_minted_token_layout_is_upstreams() -> None:
    token = mint_scoped_token(KEY, "team", "sb", 60, now=NOW)
    version, payload, sig = token.split(".")
    assert version == "v1"
    assert json.loads(base64.urlsafe_b64decode(payload + "==")) == {
        "ns": "team",
        "name": "sb",
        "exp": int(NOW) + 60,
    }
    want = hmac.new(KEY, b"agent-sandbox/scoped-token/v1." + payload.encode(), hashlib.sha256).digest()
    assert sig == b64(want)
    assert "=" not in token


@pytest.mark.parametrize(("ns", "name", "ttl"), [("", "sb", 60), ("team", "", 60), ("team", "sb", 0.5)])
def test_mint_refuses(ns: str, name: str, ttl: float) -> None:
    with pytest.raises(ValueError, match="scoped token"):
        mint_scoped_token(KEY, ns, name, ttl)


def scoped(now: float = NOW) -> ScopedToken:
    return ScopedToken(KEY, clock=lambda: now)


def verdict(authorizer: Any, route: Route, header: bytes | None) -> tuple[int, str] | None:
    try:
        result = authorizer.check(route, header)
    except RouteError as exc:
        return exc.status, exc.detail
    assert result is None
    return None


def test_scoped_token_allows_its_sandbox() -> None:
    token = mint_scoped_token(KEY, "team", "sb", 60, now=NOW)
    assert verdict(scoped(), ROUTE, f"Bearer {token}".encode()) is None


def forged(payload: dict[str, Any] | bytes, key: bytes = KEY, version: str = "v1") -> str:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    p = b64(raw)
    sig = hmac.new(key, b"agent-sandbox/scoped-token/v1." + p.encode(), hashlib.sha256).digest()
    return f"{version}.{p}.{b64(sig)}"


@pytest.mark.parametrize(
    "token",
    [
        "",
        "garbage",
        forged({"ns": "team", "name": "sb", "exp": int(NOW) + 60}, version="v2"),
        forged({"ns": "team", "name": "sb", "exp": int(NOW) + 60}, key=b"x" * 32),  # wrong key
        forged({"ns": "team", "name": "sb", "exp": int(NOW)}),  # now >= exp
        forged({"ns": "team", "name": "sb", "exp": int(NOW) - 1}),  # expired
        forged(b"{not json"),
        forged(b'["ns"]'),
        forged({"ns": "team", "name": "sb", "exp": "soon"}),
        forged({"ns": "team", "name": "sb", "exp": True}),
        forged({"ns": "team", "name": "sb", "exp": int(NOW) + 60}) + "=",
        "v1.!!!.???",
    ],
)
def test_scoped_token_unauthenticated(token: str) -> None:
    assert verdict(scoped(), ROUTE, f"Bearer {token}".encode() if token else None) == (401, "unauthenticated")


def test_scoped_token_tampered_payload() -> None:
    token = mint_scoped_token(KEY, "team", "sb", 60, now=NOW)
    _, _, sig = token.split(".")
    other = b64(json.dumps({"ns": "team", "name": "other", "exp": int(NOW) + 60}).encode())
    assert verdict(scoped(), ROUTE, f"Bearer v1.{other}.{sig}".encode()) == (401, "unauthenticated")


@pytest.mark.parametrize(
    "route",
    [
        Route("other", "team", 8888),
        Route("sb", "elsewhere", 8888),
        Route("sb", "team", 8888, pod_ip=ipaddress.ip_address("10.0.0.1")),
        Route("sb", "team", 8888, uid="u-1"),
    ],
)
def test_scoped_token_forbidden(route: Route) -> None:
    token = mint_scoped_token(KEY, "team", "sb", 60, now=NOW)
    assert verdict(scoped(), route, f"Bearer {token}".encode()) == (403, "forbidden")


class FakeApi:
    """Answers TokenReviews from a table (pure logic: the cache and the verdict mapping)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.bodies: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> bytes:
        assert (method, path) == ("POST", "/apis/authentication.k8s.io/v1/tokenreviews")
        body = json.loads(kwargs["body"])
        self.bodies.append(body)
        answer = self.answers[body["spec"]["token"]]
        if isinstance(answer, Exception):
            raise answer
        return json.dumps({"status": {"authenticated": answer}}).encode()


async def review(tr: TokenReview, header: bytes | None, route: Route = ROUTE) -> tuple[int, str] | None:
    try:
        pending = tr.check(route, header)
        if pending is not None:
            await pending
    except RouteError as exc:
        return exc.status, exc.detail
    return None


async def test_tokenreview_verdicts_and_cache() -> None:
    now = [0.0]
    api = FakeApi({"good": True, "bad": False, "boom": ServerError(500, "InternalError", "etcd down")})
    tr = TokenReview(api, audiences=["sandbox-router"], ttl=30, clock=lambda: now[0])  # type: ignore[arg-type]
    assert await review(tr, b"Bearer good") is None
    assert api.bodies[0]["spec"] == {"token": "good", "audiences": ["sandbox-router"]}
    assert await review(tr, b"Bearer bad") == (401, "unauthenticated")
    assert await review(tr, b"Bearer boom") == (500, "tokenreview: etcd down")
    assert tr.reviews == 3
    # Cached: no new calls, errors marked as cached.
    assert await review(tr, b"Bearer good") is None
    assert await review(tr, b"Bearer bad") == (401, "unauthenticated")
    assert await review(tr, b"Bearer boom") == (500, "tokenreview (cached): etcd down")
    assert tr.reviews == 3
    # Errors expire after max(ttl/3, 1s), verdicts after ttl.
    now[0] = 11.0
    await review(tr, b"Bearer boom")
    await review(tr, b"Bearer good")
    assert tr.reviews == 4
    now[0] = 31.0
    await review(tr, b"Bearer good")
    assert tr.reviews == 5


async def test_tokenreview_no_token() -> None:
    api = FakeApi({})
    assert await review(TokenReview(api), None) is None  # type: ignore[arg-type]
    assert await review(TokenReview(api, require_token=True), None) == (401, "unauthenticated")  # type: ignore[arg-type]
    assert await review(TokenReview(api, require_token=True), b"Basic xyz") == (401, "unauthenticated")  # type: ignore[arg-type]


async def test_tokenreview_cache_is_bounded_and_keyed_by_hash() -> None:
    api = FakeApi({f"t{i}": True for i in range(5)})
    tr = TokenReview(api, cache_size=2)  # type: ignore[arg-type]
    for i in range(5):
        await review(tr, f"Bearer t{i}".encode())
    assert len(tr._cache) == 2
    assert all("t" not in key[:0] and len(key) == 64 for key in tr._cache)  # hex sha256, never the token
    await review(tr, b"Bearer t0")  # evicted -> asked again
    assert tr.reviews == 6
