"""The reconcile contract: `Request` in, `Result` (or an exception) out.

Owns the vocabulary every controller shares (controller-runtime `pkg/reconcile`, controllers spec §0.5):

* `Request` carries identity only (namespace, name) - never the event or the object. Reconciliation is
  level-based: a deleted object is noticed by reading state (NotFound), not by inspecting an event.
* `Result.requeue_after` > 0 asks for another pass after that delay, with the item's backoff reset.
* Raising an exception means "retry with backoff": the `Result` is ignored and the key is re-added
  through the rate limiter (5 ms doubling to 1000 s, plus an overall 10 qps / 100 burst bucket).
* Raising `RetryLater` (or a subclass) is the *expected* way to say "not now": retried with backoff,
  counted as a reconcile error, never as a panic. `KubeError`, `TimeoutError` and `ConnectionError`
  are expected too; anything else (a KeyError, a TypeError) also counts as a panic, our analogue of a
  recovered Go panic (`controller_runtime_reconcile_panics_total`).
* Raising `TerminalError` (or an exception wrapped in it) logs and counts the failure but never retries.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from .errors import KubeError

__all__ = [
    "EXPECTED_ERRORS",
    "Reconciler",
    "ReconcilerFunc",
    "Request",
    "Result",
    "RetryLater",
    "TerminalError",
    "Waiting",
]


@dataclass(frozen=True, slots=True, order=True)
class Request:
    """Identity of the object to reconcile; `namespace` is "" for cluster-scoped kinds."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True, slots=True)
class Result:
    """Outcome of a successful reconcile; `requeue_after` seconds > 0 schedules another pass."""

    requeue_after: float | None = None


class RetryLater(Exception):
    """An expected reconcile outcome: "the world is not ready yet, try again with backoff".

    The base of every controller's "retry later" errors (a missing template, a foreign object in the way,
    a pass that ended with API failures). The runtime retries it like any exception but never counts it
    as a panic.
    """


class Waiting(RetryLater):
    """A wait on another object's progress that is part of normal operation, retried like `RetryLater`.

    For a state that resolves by itself and that an operator should not be paged for (a deleted
    predecessor's Pod still terminating under a reused name): the runtime logs it at info and counts the
    pass as `result="requeue"`, not as a reconcile error. Whatever the controller reports on the object
    (conditions) is unchanged.
    """


class TerminalError(Exception):
    """A failure that retrying cannot fix: logged and counted, never requeued.

    Wrap another exception with `raise TerminalError(exc) from exc`, or raise it directly with a message.
    """


EXPECTED_ERRORS: tuple[type[BaseException], ...] = (RetryLater, KubeError, TimeoutError, ConnectionError)
"""Failures that are part of normal operation; any other exception also counts as a panic."""


class Reconciler(Protocol):
    """Drives the object named by `request` toward its desired state.

    Contract (controller-runtime `reconcile.Reconciler`, in our terms): return `Result()` when done;
    `Result(requeue_after=s)` to look again in `s` seconds (backoff is reset); raise to retry with
    per-item exponential backoff (any `Result` is then ignored); raise `TerminalError` to give up on
    this version of the object without retrying. The same key is never reconciled concurrently.
    """

    async def reconcile(self, request: Request) -> Result: ...


class ReconcilerFunc:
    """Adapter turning an `async def fn(request) -> Result` into a `Reconciler`."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[Request], Awaitable[Result]]) -> None:
        self._fn = fn

    async def reconcile(self, request: Request) -> Result:
        return await self._fn(request)
