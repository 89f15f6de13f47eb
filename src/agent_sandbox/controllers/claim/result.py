"""How a SandboxClaim pass ends (controllers spec §4.3 step 16): the `Result` it returns, or its retry.

Pool/template missing -> requeue 1 min; cold-create cache lag -> 200 ms; suppressed spec errors -> no retry;
anything else -> raise `ClaimRetry` (backoff). A claim with a TTL is requeued when it runs out.
"""

from __future__ import annotations

import logging

from agent_sandbox.kube import Result, RetryLater

from .errors import ClaimError, SandboxCreatePending, TemplateNotFound, WarmPoolNotFound

__all__ = ["EXPIRED_REQUEUE", "ClaimRetry", "pass_result"]

log = logging.getLogger("agent_sandbox.controllers.claim")

MISSING_REQUEUE = 60.0
CREATE_PENDING_REQUEUE = 0.2
EXPIRED_REQUEUE = 0.001


class ClaimRetry(RetryLater):
    """A claim error that must be retried with backoff (wraps the `ClaimError`)."""


def pass_result(
    time_left: float | None, expired: bool, error: ClaimError | None, metrics_error: Exception | None
) -> Result:
    """The pass's `Result` from the claim's time left, the error its status shows and a failed stamp.

    Raises:
        ClaimRetry: an error that is neither suppressed nor waited out with a fixed requeue.
        Exception: `metrics_error`, when nothing else calls for a retry.
    """
    requeue = max(time_left, EXPIRED_REQUEUE) if (time_left is not None and not expired) else None
    if isinstance(error, WarmPoolNotFound | TemplateNotFound):
        if metrics_error is not None:
            log.info("claim metadata write failed: %s", metrics_error)
        return Result(min(MISSING_REQUEUE, requeue) if requeue else MISSING_REQUEUE)
    if isinstance(error, SandboxCreatePending):
        return Result(min(CREATE_PENDING_REQUEUE, requeue) if requeue else CREATE_PENDING_REQUEUE)
    if error is not None and not error.suppressed:
        raise ClaimRetry(f"{error.reason}: {error}") from error
    if metrics_error is not None:
        raise metrics_error
    return Result(requeue)
