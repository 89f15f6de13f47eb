"""Authorization modes of `--authz-mode` (router spec §1.10): allow-all, tokenreview, scoped-token.

Owns: bearer-token extraction (`Authorization: Bearer <t>`, scheme case-insensitive), the scoped-token
format (mint + verify, byte-compatible with upstream's HMAC-SHA256 tokens), the TokenReview call with its
LRU verdict cache (keyed by the token's SHA-256, raw tokens never stored), and the verdicts' exact
status/detail pairs: 401 `unauthenticated`, 403 `forbidden`, 500 `tokenreview: <error>`.

An authorizer's `check(route, authorization)` returns None (allowed), raises `RouteError`, or returns
an awaitable doing either (tokenreview on a cache miss). The `Authorization` header is never forwarded
(the proxy drops it), whatever the mode.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import orjson

from ..kube import ApiClient, ApiError, KubeError
from ._routing import Route, RouteError

__all__ = [
    "SCOPED_TOKEN_CONTEXT",
    "AllowAll",
    "Authorizer",
    "ScopedToken",
    "TokenReview",
    "bearer_token",
    "mint_scoped_token",
]

SCOPED_TOKEN_CONTEXT = b"agent-sandbox/scoped-token/v1."
TOKENREVIEW_TIMEOUT = 3.0
TOKENREVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"


def _unauthenticated() -> RouteError:
    # A fresh exception per raise: re-raising one shared instance would grow its traceback forever.
    return RouteError(401, "unauthenticated")


def _forbidden() -> RouteError:
    return RouteError(403, "forbidden")


class Authorizer(Protocol):
    def check(self, route: Route, authorization: bytes | None) -> Awaitable[None] | None: ...


def bearer_token(authorization: bytes | None) -> str:
    """The token of `Bearer <token>` ("" when absent or another scheme)."""
    if not authorization:
        return ""
    scheme, _, token = authorization.decode("latin-1").strip().partition(" ")
    if scheme.lower() != "bearer":
        return ""
    return token.strip()


class AllowAll:
    """`allow-all`: every request is allowed (the default, as upstream)."""

    def check(self, route: Route, authorization: bytes | None) -> None:
        return None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    # Go's base64.RawURLEncoding: URL alphabet, no padding accepted.
    if "=" in text or not text.isascii():
        raise ValueError("padding or non-ASCII in base64url")
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def mint_scoped_token(key: bytes, namespace: str, name: str, ttl: float, *, now: float | None = None) -> str:
    """Mint `v1.<payload>.<sig>` for one sandbox, valid for `ttl` seconds (>= 1).

    Raises:
        ValueError: empty namespace or name, or a TTL under one second.
    """
    if not namespace or not name:
        raise ValueError("scoped token needs a namespace and a sandbox name")
    if ttl < 1:
        raise ValueError("scoped token TTL must be at least 1s")
    exp = int((time.time() if now is None else now) + ttl)
    payload = _b64(orjson.dumps({"ns": namespace, "name": name, "exp": exp}))
    sig = hmac.new(key, SCOPED_TOKEN_CONTEXT + payload.encode("ascii"), hashlib.sha256).digest()
    return f"v1.{payload}.{_b64(sig)}"


class ScopedToken:
    """`scoped-token`: an HMAC-signed token naming exactly one sandbox and an expiry."""

    def __init__(self, key: bytes, *, clock: Callable[[], float] = time.time) -> None:
        self._key = key
        self._clock = clock

    def claims(self, token: str) -> tuple[str, str]:
        """Verify a token; returns (namespace, name). Raises RouteError 401 when invalid or expired."""
        version, _, rest = token.partition(".")
        payload, _, sig_text = rest.partition(".")
        if version != "v1" or not payload or not sig_text or "." in sig_text:
            raise _unauthenticated()
        try:
            sig = _unb64(sig_text)
            raw = _unb64(payload)
        except (ValueError, binascii.Error):
            raise _unauthenticated() from None
        want = hmac.new(self._key, SCOPED_TOKEN_CONTEXT + payload.encode("ascii"), hashlib.sha256).digest()
        if not hmac.compare_digest(sig, want):
            raise _unauthenticated()
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise _unauthenticated() from None
        if not isinstance(data, dict):
            raise _unauthenticated()
        ns, name, exp = data.get("ns"), data.get("name"), data.get("exp")
        if (
            not isinstance(ns, str)
            or not isinstance(name, str)
            or not isinstance(exp, int)
            or isinstance(exp, bool)
        ):
            raise _unauthenticated()
        if self._clock() >= exp:
            raise _unauthenticated()
        return ns, name

    def check(self, route: Route, authorization: bytes | None) -> None:
        token = bearer_token(authorization)
        if not token:
            raise _unauthenticated()
        ns, name = self.claims(token)
        if route.pod_ip is not None or route.uid:
            raise _forbidden()
        if ns != route.namespace or name != route.sandbox_id:
            raise _forbidden()


class TokenReview:
    """`tokenreview`: ask the API server whether the bearer token authenticates (not who may reach what)."""

    def __init__(
        self,
        client: ApiClient,
        *,
        audiences: Sequence[str] = (),
        ttl: float = 30.0,
        cache_size: int = 2048,
        require_token: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._audiences = list(audiences)
        self._ttl = ttl
        self._error_ttl = max(ttl / 3, 1.0)
        self._size = cache_size
        self._require = require_token
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, bool, str]] = OrderedDict()
        """sha256(token) -> (expires, authenticated, error text or "")."""
        self.reviews = 0
        """TokenReview calls made (tests read it to see the cache work)."""

    def check(self, route: Route, authorization: bytes | None) -> Awaitable[None] | None:
        token = bearer_token(authorization)
        if not token:
            if self._require:
                raise _unauthenticated()
            return None
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._cache.get(key)
        if hit is not None:
            expires, ok, error = hit
            if self._clock() < expires:
                self._cache.move_to_end(key)
                if error:
                    raise RouteError(500, f"tokenreview (cached): {error}")
                if not ok:
                    raise _unauthenticated()
                return None
            del self._cache[key]
        return self._review(key, token)

    async def _review(self, key: str, token: str) -> None:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": self._audiences} if self._audiences else {"token": token},
        }
        self.reviews += 1
        try:
            async with asyncio.timeout(TOKENREVIEW_TIMEOUT):
                raw = await self._client.request(
                    "POST", TOKENREVIEW_PATH, body=orjson.dumps(body), content_type="application/json"
                )
            status = orjson.loads(raw).get("status") or {}
        except (KubeError, TimeoutError, orjson.JSONDecodeError, AttributeError) as exc:
            # client-go reports an API error by its Status message (e.g. "... is forbidden: User ...").
            error = (exc.message if isinstance(exc, ApiError) and exc.message else str(exc)) or type(
                exc
            ).__name__
            self._store(key, self._error_ttl, False, error)
            raise RouteError(500, f"tokenreview: {error}") from None
        ok = bool(status.get("authenticated"))
        self._store(key, self._ttl, ok, "")
        if not ok:
            raise _unauthenticated()

    def _store(self, key: str, ttl: float, ok: bool, error: str) -> None:
        self._cache[key] = (self._clock() + ttl, ok, error)
        self._cache.move_to_end(key)
        while len(self._cache) > self._size:
            self._cache.popitem(last=False)
