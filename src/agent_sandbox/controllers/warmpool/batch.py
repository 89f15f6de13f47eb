"""Slow-start batching (controllers spec §3.6): run `count` operations in batches of 1, 2, 4, 8, ...

All operations of a batch run concurrently; after a batch in which any operation failed, no further
batch starts and the caller gets (successes so far, first error). The operation index passed to `fn` is
`successes before the batch + position in the batch`, so for deletes it indexes the sorted candidates.
Cancellation propagates (in-flight operations of the batch are cancelled with the caller).

Why: a template that the API server rejects fails on the first create instead of 300 times, while a
healthy pool still reaches 128+-way parallelism within a few round trips.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["slow_start_batch"]


async def slow_start_batch(
    count: int, fn: Callable[[int], Awaitable[None]], *, initial: int = 1
) -> tuple[int, BaseException | None]:
    """Run `fn(i)` for `count` indexes with doubling batches.

    Returns:
        (number of operations that succeeded, the first error or None).
    """
    successes = 0
    remaining = count
    size = min(remaining, initial)
    while size > 0:
        results = await asyncio.gather(*(fn(successes + i) for i in range(size)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for err in errors:
            if isinstance(err, asyncio.CancelledError):
                raise err
        successes += size - len(errors)
        if errors:
            return successes, errors[0]
        remaining -= size
        size = min(2 * size, remaining)
    return successes, None
