"""The router's file descriptors: the open-files limit, and what happens when they run out.

Owns: raising the soft `RLIMIT_NOFILE` to the hard limit at start-up (Go's runtime does the same since
1.19, so upstream's router gets the hard limit too; the usual soft default of 1,024 is about 500 proxied
connections), which errors mean "out of descriptors" (`RESOURCE_ERRNOS`), and the report when they do:
a rate-limited warning plus `sandbox_router_fd_exhaustion_total{side}` (ours).

Why a reserve on accept: under uvloop, libuv handles EMFILE on `accept` itself by accepting and closing
the connection at once (its "reserve fd" trick): the client sees a reset, Python is never told, and the
metrics and `/healthz` listeners are reset the same way. Descriptors are allocated lowest-free-first, so
an accepted socket whose number is within `reserve` of the limit proves that at least `limit - reserve`
are open: such a connection is answered 503 with `Retry-After` and closed (`ClientConnection`), keeping
the last descriptors for the dials and listeners already being served.

Does not own: the replies themselves (`_server`, `_proxy`, `_h2c`).
"""

from __future__ import annotations

import errno
import logging
import time

from ._metrics import RouterMetrics

__all__ = ["RESOURCE_ERRNOS", "FdReport", "open_files_limit", "raise_open_files_limit"]

log = logging.getLogger("agent_sandbox.router.fd")

RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""A socket call failed because this process or host ran out of something, not because of the peer."""

EXHAUSTED_DETAIL = "The router is out of open files (file descriptors); retry shortly."
_WARN_EVERY = 10.0


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft open-files limit to the hard one (as Go's runtime does); returns (soft, hard) after.

    A platform without `resource`, or a refusal, leaves the limit as it was.
    """
    try:
        import resource
    except ImportError:  # not POSIX
        return (0, 0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError) as exc:
            log.debug("open files limit left at %d (hard %d): %s", soft, hard, exc)
            return (soft, hard)
        log.debug("open files limit raised from %d to %d", soft, hard)
        return (hard, hard)
    log.debug("open files limit %d (hard %d)", soft, hard)
    return (soft, hard)


def open_files_limit() -> int:
    """The current soft open-files limit (0 when unknown or unlimited)."""
    try:
        import resource
    except ImportError:
        return 0
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 0 if soft == resource.RLIM_INFINITY else int(soft)


class FdReport:
    """Counts and (at most every 10 s) logs descriptor exhaustion; also the accept-side reserve check."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics
        self._last_warning = -_WARN_EVERY
        self._suppressed = 0

    @staticmethod
    def reserve(limit: int) -> int:
        """Descriptors kept free for dials and listeners under the open-files `limit`: accepted sockets
        numbered `limit - reserve` or above are refused with a 503."""
        return max(16, min(256, limit // 64))

    def near_limit(self, fd: int) -> bool:
        """`fd` (the lowest free descriptor when it was allocated) is within the reserve of the limit (one
        `getrlimit` call: the limit may change while the router runs)."""
        limit = open_files_limit()
        return limit > 0 and fd >= limit - self.reserve(limit)

    def exhausted(self, side: str, error: BaseException | None = None) -> None:
        """Record one exhaustion on `side` ("accept" or "dial")."""
        self.metrics.fd_exhausted(side)
        now = time.monotonic()
        if now - self._last_warning < _WARN_EVERY:
            self._suppressed += 1
            return
        suppressed, self._suppressed = self._suppressed, 0
        self._last_warning = now
        log.warning(
            "router is out of file descriptors (%s); raise its open-files limit or spread the load",
            side,
            extra={
                "side": side,
                "limit": open_files_limit(),
                "error": str(error) if error is not None else "",
                "suppressed": suppressed,
            },
        )
