"""When the router sends a request again after its upstream connection failed (`_exchange.may_resend`), and the
pool's check that an idle connection was not closed under it (`UpstreamPool.take`).

The rule is Go's net/http Transport's (transport.go `shouldRetryRequest`, request.go `isReplayable`), which
upstream's router runs by: until December 7 any request up to 64 KiB on a pooled connection was sent again, so
a POST /execute whose runtime died running the command ran it twice once the runtime was restarted.
"""

from __future__ import annotations

import asyncio
import itertools
import socket

import pytest

from agent_sandbox.router._exchange import may_resend
from agent_sandbox.router._upstream import UpstreamPool

_IDEMPOTENT = ("GET", "HEAD", "OPTIONS", "TRACE")
_OTHERS = ("POST", "PUT", "PATCH", "DELETE", "CONNECT", "PROPFIND")


def _rule(
    method: str, key: bool, reused: bool, written: bool, whole: bool, reason: str, head_seen: bool
) -> bool:
    """Go's rule, stated independently: the oracle for the whole matrix."""
    if not reused or head_seen or not whole:
        return False
    if not written:
        return True
    return (method in _IDEMPOTENT or key) and reason == "eof"


@pytest.mark.parametrize("method", _IDEMPOTENT + _OTHERS)
def test_matrix_matches_gos_transport(method: str) -> None:
    for key, reused, written, whole, reason, head_seen in itertools.product(
        (False, True), (False, True), (False, True), (False, True), ("eof", "other"), (False, True)
    ):
        got = may_resend(
            method=method,
            idempotency_key=key,
            reused=reused,
            written=written,
            whole_in_hand=whole,
            reason=reason,
            head_seen=head_seen,
        )
        assert got == _rule(method, key, reused, written, whole, reason, head_seen), (
            method,
            key,
            reused,
            written,
            whole,
            reason,
            head_seen,
        )


def _sent(method: str, *, key: bool = False, reused: bool = True, reason: str = "eof") -> bool:
    return may_resend(
        method=method,
        idempotency_key=key,
        reused=reused,
        written=True,
        whole_in_hand=True,
        reason=reason,
        head_seen=False,
    )


@pytest.mark.parametrize("method", _OTHERS)
def test_a_written_request_that_may_not_run_twice_is_never_resent(method: str) -> None:
    """The crash case: the runtime read the POST and died before answering (EOF on a pooled connection)."""
    assert not _sent(method)


@pytest.mark.parametrize("method", _OTHERS)
def test_an_idempotency_key_makes_a_request_resendable(method: str) -> None:
    assert _sent(method, key=True)


@pytest.mark.parametrize("method", _IDEMPOTENT)
def test_an_idempotent_request_is_resent_after_a_stale_keep_alive(method: str) -> None:
    assert _sent(method)
    assert not _sent(method, reused=False)  # a fresh connection: the sandbox hung up on this request
    assert not _sent(method, reason="other")  # a malformed answer is no idle close


def test_nothing_written_is_resent_whatever_the_method() -> None:
    for method in ("POST", "GET"):
        assert may_resend(
            method=method,
            idempotency_key=False,
            reused=True,
            written=False,
            whole_in_hand=True,
            reason="other",
            head_seen=False,
        )
        # ... unless the body is no longer in hand (streamed): Go's outgoingLength() != 0 without GetBody
        assert not may_resend(
            method=method,
            idempotency_key=False,
            reused=True,
            written=False,
            whole_in_hand=False,
            reason="eof",
            head_seen=False,
        )


async def test_take_skips_an_idle_connection_closed_but_not_yet_read() -> None:
    """The sandbox's keep-alive close arrived and the loop has not run since: the pool does not hand the
    connection out (a POST sent on it would meet the close and get a 502)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    host, port = listener.getsockname()
    pool = UpstreamPool()
    try:
        loop = asyncio.get_running_loop()
        first = await pool.dial(host, port, deadline=loop.time() + 5)
        second = await pool.dial(host, port, deadline=loop.time() + 5)
        peer_first, _ = listener.accept()
        peer_second, _ = listener.accept()
        pool.put(second)
        pool.put(first)  # LIFO: taken first
        # Closed now; over loopback the FIN is in the router's receive queue when close() returns, and no
        # loop iteration runs before take().
        peer_first.close()
        taken = pool.take((host, port))
        assert taken is second
        assert first.closed
        # An open idle connection with nothing pending is handed out.
        pool.put(second)
        assert pool.take((host, port)) is second
        # One the sandbox wrote to out of turn is not.
        pool.put(second)
        peer_second.sendall(b"HTTP/1.1 200 OK\r\n")
        assert pool.take((host, port)) is None
        peer_second.close()
    finally:
        pool.close_all()
        listener.close()
