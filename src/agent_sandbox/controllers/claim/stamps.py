"""The claim's first-ready stamp (`claim-first-ready-at`, §4.13): sent in the pass, or off the worker.

In the controller process (`detach`) the stamp runs off the worker: the worker is free after the status
write, so under a slow API server a worker serves a claim in two round trips instead of three
(docs/performance.md). One stamp per claim is in flight at a time; a failure re-enqueues the claim with
backoff, and that pass backfills exactly as a failed synchronous stamp would. A graceful stop sends the
stamps still held before the Lease is released (`flush_held`); a stamp that fails then, or whose retry pass
never ran (the queue shuts down first), is lost and counted (`unwritten`), so the manager's stop warning
names it. What the stamp says is decided by `decide.decide_first_ready`; this only sends it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from agent_sandbox.api.errortext import describe_error
from agent_sandbox.kube import SANDBOX_CLAIM, Client, KubeError, Request

from ..claim_pressure import ClaimPressure
from . import execute as ex
from .decide import ClaimMetadataPatch
from .store import Freshest, Store

__all__ = ["FirstReadyStamps"]

log = logging.getLogger("agent_sandbox.controllers.claim")


class FirstReadyStamps:
    """The claim reconciler's first-ready stamps: sent at once, or, once detached, from background tasks."""

    def __init__(self) -> None:
        self._retry: Callable[[Request], None] | None = None
        self.in_flight: dict[str, asyncio.Task[None]] = {}  # claim UID -> its detached metadata patch
        # Claims whose detached stamp failed and whose retry pass has not run yet: the controller's queue
        # drops the retry once it shuts down (or the stop outlasts its backoff), so a stop counts them.
        self._unstamped: set[Request] = set()

    def detach(self, retry: Callable[[Request], None]) -> None:
        """Send each stamp from a background task; `retry` re-enqueues a claim whose stamp failed."""
        self._retry = retry

    def retrying(self, request: Request) -> None:
        """A pass of `request` runs: it backfills a stamp that failed, if need be."""
        self._unstamped.discard(request)

    def held_writes(self) -> dict[str, int]:
        """Detached stamps not yet sent (most held behind claims)."""
        return {"claim_stamp": len(self.in_flight)}

    async def flush_held(self) -> None:
        """Return once every detached stamp is done."""
        while pending := [t for t in self.in_flight.values() if not t.done()]:
            await asyncio.wait(pending)

    def unwritten(self) -> dict[str, int]:
        """Stamps in flight, plus failed ones no pass has retried yet."""
        return {"claim_stamp": len(self.in_flight) + len(self._unstamped)}

    async def write(
        self,
        stored: Mapping[str, Any],
        patch: ClaimMetadataPatch,
        *,
        api: Client,
        store: Store,
        fresh: Freshest,
        pressure: ClaimPressure,
    ) -> KubeError | None:
        """Send the stamp `patch` of the claim `stored`: once detached, start it in the background (None);
        else write it now and return its failure, if any (the pass raises it for backoff)."""
        meta = stored["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if self._retry is not None:
            if uid not in self.in_flight:  # else: the write in flight carries it; its event re-runs us
                # The UID makes a stamp that waited (claim pressure) fail on a deleted-and-recreated claim
                # (422 "field is immutable") instead of stamping the new one; its retry pass settles it.
                body = patch.body()
                body["metadata"]["uid"] = uid
                task = asyncio.create_task(
                    self._send_detached(
                        stored, body, Request(ns, name), api=api, store=store, fresh=fresh, pressure=pressure
                    )
                )
                self.in_flight[uid] = task
            return None
        try:
            updated = await ex.patch_claim_metadata(api, stored, patch.body())
        except KubeError as exc:
            return exc
        if updated is not None:
            fresh.remember(SANDBOX_CLAIM, updated)
        return None

    async def _send_detached(
        self,
        stored: Mapping[str, Any],
        body: Mapping[str, Any],
        request: Request,
        *,
        api: Client,
        store: Store,
        fresh: Freshest,
        pressure: ClaimPressure,
    ) -> None:
        uid = stored["metadata"]["uid"]
        failed: KubeError | None = None
        # Bookkeeping only (the claim is Ready already): let claims still arriving have the API server first.
        await pressure.wait_calm(pressure.hold)
        current = store.get(SANDBOX_CLAIM, request.namespace, request.name)
        if (
            current is None
            or current["metadata"].get("uid") != uid
            or current["metadata"].get("deletionTimestamp")
        ):
            # Deleted while the stamp waited (short-lived claims often are): nothing left to stamp.
            self.in_flight.pop(uid, None)
            return
        try:
            updated = await ex.patch_claim_metadata(api, stored, body)
            if updated is not None:
                fresh.remember(SANDBOX_CLAIM, updated)
        except KubeError as exc:
            failed = exc
        finally:
            self.in_flight.pop(uid, None)
        if failed is not None and self._retry is not None:
            self._unstamped.add(request)
            if pressure.stopped:
                # The graceful stop's flush: the controller's queue is shut down, a retry would vanish.
                log.info(
                    "claim %s/%s: first-ready stamp failed while stopping, not retried: %s",
                    request.namespace,
                    request.name,
                    describe_error(failed),
                )
                return
            log.info(
                "claim %s/%s: metadata write failed, retrying: %s", request.namespace, request.name, failed
            )
            self._retry(request)
