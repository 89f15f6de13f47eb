"""SandboxWarmPool writes (controllers spec §3.3-§3.6): one API call per member action.

Owns the expectation bookkeeping that must surround each write (§3.6):

* a deletion of a pool-owned member is recorded (`expect_deletion`) *before* the call, because the
  delete event can arrive before the response, and rolled back (`deletion_observed`) at once when the
  call fails or finds nothing to delete;
* creates run under an expectation raised by the caller (`try_expect_creations`); creates that were
  refused are lowered here so the pool is not blocked until the 5 min expiry, creates whose answer was lost
  only after `AMBIGUOUS_CREATE_HOLD` (they may have applied: `create_members`).

Deletes carry uid + resourceVersion preconditions taken from the cache: a member that changed since
(typically: just adopted by a claim, which re-parents it) is never deleted on a stale view; the 409 is
treated like NotFound (nothing deleted, expectation rolled back, no error) and the update event that
changed it re-enqueues the pool.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import Protocol

from agent_sandbox.api.errortext import describe_error
from agent_sandbox.kube import (
    SANDBOX,
    Conflict,
    Expectations,
    IndexedReader,
    NotFound,
    Object,
    StatusWriter,
    Writer,
    may_have_applied,
)
from agent_sandbox.kube.errors import is_namespace_terminating

from .batch import slow_start_batch
from .decide import DeleteMember, PatchMember

__all__ = [
    "AMBIGUOUS_CREATE_HOLD",
    "PoolClient",
    "create_members",
    "delete_excess",
    "delete_members",
    "patch_members",
]

log = logging.getLogger("agent_sandbox.controllers.warmpool")

AMBIGUOUS_CREATE_HOLD = 30.0
"""Seconds a create whose answer was lost keeps its expectation up (room for an API server restart and the
informer's relist), unless the member shows up sooner."""


class PoolClient(IndexedReader, Writer, StatusWriter, Protocol):
    """Cache reads (incl. indexes) + API writes: the manager's `CachedClient`, or a `FakeClient`."""


async def _delete_one(
    client: Writer, exp: Expectations, key: str, namespace: str, d: DeleteMember
) -> BaseException | None:
    if d.owned:
        exp.expect_deletion(key, d.uid)
    try:
        await client.delete(
            SANDBOX,
            d.name,
            namespace=namespace,
            uid=d.uid or None,
            resource_version=d.resource_version or None,
        )
    except (NotFound, Conflict) as exc:
        # Nothing was deleted by this call: no delete event of ours will lower the expectation.
        if d.owned:
            exp.deletion_observed(key, d.uid)
        if isinstance(exc, Conflict):
            log.info("member %s/%s changed since cached; not deleting it on a stale view", namespace, d.name)
        return None
    except Exception as exc:
        if d.owned:
            exp.deletion_observed(key, d.uid)
        log.error("deleting %s member %s/%s failed: %s", d.reason, namespace, d.name, describe_error(exc))
        return exc
    log.info("deleted %s member %s/%s", d.reason, namespace, d.name)
    return None


async def delete_members(
    client: Writer, exp: Expectations, key: str, namespace: str, deletes: Sequence[DeleteMember]
) -> list[BaseException]:
    """Clean-up deletes (stale, stuck): all concurrently; returns the failures."""
    results = await asyncio.gather(*(_delete_one(client, exp, key, namespace, d) for d in deletes))
    return [r for r in results if r is not None]


async def patch_members(
    client: Writer, namespace: str, patches: Sequence[PatchMember]
) -> list[BaseException]:
    """Merge patches (launch-type label, orphan adoption): all concurrently; returns the failures."""

    async def one(u: PatchMember) -> BaseException | None:
        try:
            await client.patch(SANDBOX, u.name, u.patch, namespace=namespace)
        except Exception as exc:
            log.error("%s patch of %s/%s failed: %s", u.reason, namespace, u.name, describe_error(exc))
            return exc
        return None

    results = await asyncio.gather(*(one(u) for u in patches))
    return [r for r in results if r is not None]


async def create_members(
    client: Writer, exp: Expectations, key: str, namespace: str, body: Object, count: int
) -> tuple[int, BaseException | None]:
    """Create `count` copies of `body` with slow-start batching under an already-raised expectation.

    Returns (creates that succeeded, the first failure); a refusal because the namespace is being
    deleted is no failure (None): the pool goes with its namespace, a retry would only be refused again.

    The same body dict is sent every time (the client only serialises it); the API server assigns each
    copy its name from `generateName`. Creates that were refused are lowered at once. A create whose answer
    was lost (timeout, dropped connection, 5xx: `may_have_applied`) may have made a member the cache has
    not shown yet, and with generateName a retry cannot find out by name: its expectation stays up for
    `AMBIGUOUS_CREATE_HOLD` seconds, so the pool creates again only if the member did not appear by then
    (else an API server restart mid-create leaves a surplus member that is deleted again).
    """
    ambiguous = 0

    async def one(_: int) -> None:
        nonlocal ambiguous
        try:
            await client.create(SANDBOX, body, namespace=namespace)
        except Exception as exc:
            ambiguous += may_have_applied(exc)
            raise

    successes, error = await slow_start_batch(count, one)
    if count > successes:
        exp.lower_creations(key, count - successes - ambiguous)  # refused creates produce no event
    raised = exp.current_record(key) if ambiguous else None
    if raised is not None:  # None: everything pending was observed already (the lost creates had applied)
        asyncio.get_running_loop().call_later(
            AMBIGUOUS_CREATE_HOLD, functools.partial(exp.lower_creations, key, ambiguous, raised=raised)
        )
    if is_namespace_terminating(error):
        # As a ReplicaSet: the namespace is being deleted, the pool with it; nothing to retry or report.
        log.debug("not creating members for pool %s after %d/%d: %s", key, successes, count, error)
        return successes, None
    if error is not None:
        log.error("creating pool members in %s failed after %d/%d: %s", key, successes, count, error)
    else:
        log.info("created %d members for pool %s", successes, key)
    return successes, error


async def delete_excess(
    client: Writer, exp: Expectations, key: str, namespace: str, candidates: Sequence[DeleteMember]
) -> BaseException | None:
    """Excess deletes in slow-start batches over the ordered candidates; returns the first failure."""

    async def one(i: int) -> None:
        err = await _delete_one(client, exp, key, namespace, candidates[i])
        if err is not None:
            raise err

    _, error = await slow_start_batch(len(candidates), one)
    return error
