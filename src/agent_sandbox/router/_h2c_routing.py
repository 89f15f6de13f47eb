"""What an h2c stream's header block names (`_routing`) and what of it pins a connection (`_pin_of`).

The h2c counterpart of the HTTP/1.1 head's routing headers: a connection is pinned to the sandbox its first
stream names, and every later stream is held against that pin (`_h2c._Session`).
"""

from __future__ import annotations

from ._routing import HEADER_TIMEOUT, Route

__all__ = ["_PINNED_FIELDS", "_pin_of", "_routing"]


def _routing(headers: list[tuple[str, str]]) -> tuple[dict[bytes, bytes], set[bytes], bytes | None]:
    """A decoded block's routing headers (the first of each), the names sent twice, and its first
    `authorization`, as `parse_route` and the authorizer take them."""
    routing: dict[bytes, bytes] = {}
    dups: set[bytes] = set()
    authorization: bytes | None = None
    for name, value in headers:
        key = name.lower().encode("latin-1")
        if key == HEADER_TIMEOUT:
            # Not applied on h2c (docs/router.md): a call's deadline is gRPC's own `grpc-timeout`. So neither
            # validated nor part of the route; it reaches the sandbox as ordinary metadata (as the Go router
            # forwards and ignores it).
            continue
        if key.startswith(b"x-sandbox-"):
            if key in routing:
                dups.add(key)
            routing.setdefault(key, value.encode("latin-1"))
        elif key == b"authorization" and authorization is None:
            authorization = value.encode("latin-1")  # the first, as Go's Header.Get
    return routing, dups, authorization


_PINNED_FIELDS = ("sandbox_id", "namespace", "port", "pod_ip", "uid")
"""The `Route` fields a connection is pinned to: those that select the sandbox to dial (the credential,
`authorization`, is checked per stream on its own). Not `timeout`: it selects nothing (and is not read on h2c).
A field added to `Route` must be decided on here (tests/unit/router/test_h2c_pin.py fails until it is)."""


def _pin_of(route: Route) -> tuple[object, ...]:
    """What of `route` a later stream on the connection must repeat to be forwarded (`_PINNED_FIELDS`)."""
    return tuple(getattr(route, name) for name in _PINNED_FIELDS)
