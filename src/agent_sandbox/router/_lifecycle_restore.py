"""Whether a restore asked for a hibernated Sandbox can come to anything (`RestoreChecks`).

The lifecycle controller never restores an archive marked `expired-at`, or one whose SandboxClaim has
expired, and it ends a restore by deleting the archive without a Sandbox coming back. A request held for such
a Sandbox is told so at once (a 503 saying why) instead of waiting out the resume timeout. The checks read the
API server (the router's archive view keeps neither annotations nor owners), so their verdicts are remembered
and their reads shared: a unit of its own beside resume on request (`_lifecycle`), which asks it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..api import lifecycle as lc
from ..api.meta import controlled_by, controller_name, deadline_after, format_rfc3339nano
from ..kube import SANDBOX, SANDBOX_CLAIM, ApiClient, Forbidden, KubeError, NotFound
from ._lifecycle_activity import Key
from ._lifecycle_state import LifecycleState

__all__ = ["RestoreChecks", "refusal_detail"]

log = logging.getLogger("agent_sandbox.router.lifecycle")

_REFUSALS_KEPT = 1024  # archives whose restore verdict is remembered (least recently used dropped)
_VERDICT_TTL = 10.0  # a verdict that rests on a claim's state is read again after this long (seconds)


def refusal_detail(ns: str, name: str, why: str) -> str:
    """The detail of a 503 for a hibernated Sandbox that will not be restored. It carries "could not be
    resumed", the phrase both SDKs take for "the router said why": until December 6 it said "could not be
    restored", so the Python SDK added "is hibernated: restore it with resume()" to a refusal that said it
    never would be, and the Go SDK replaced the reason with a generic "deleted"."""
    return f"Sandbox {ns}/{name} could not be resumed: {why}"


@dataclass(frozen=True, slots=True)
class _Verdict:
    """`_restore_refused`'s answer for one version (uid + resourceVersion) of an archive, until `until`."""

    uid: str
    resource_version: str
    refusal: str
    until: float


class RestoreChecks:
    """Verdicts on restores of hibernated Sandboxes, from uncached reads that are remembered and shared."""

    def __init__(self, api: ApiClient, state: LifecycleState, clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.state = state
        self._clock = clock
        self._verdicts: OrderedDict[Key, _Verdict] = OrderedDict()
        self._ending: dict[Key, asyncio.Task[bool]] = {}

    async def _restore_refused(self, ns: str, name: str, now: datetime) -> str:
        """Why the lifecycle controller will never restore archive `ns/name` ("" when nothing says so): it is
        marked `expired-at` (expired with `shutdownPolicy: Retain`), or its SandboxClaim (the archive's
        controller) has expired, as `lc.claim_expired` reckons it (the controller deletes such an archive
        instead). Until December 6 the router wrote the restore request anyway and held the request for the
        whole resume timeout while the controller deleted the archive.

        The router's archive view keeps neither the archive's own annotations nor its owners, so the verdict
        comes from uncached reads, and is remembered per archive version (uid + resourceVersion, as the
        informer shows it): an `expired-at` archive is kept indefinitely, and until December 6 every request
        to it cost two API reads. A verdict that rests on the claim is read again after `_VERDICT_TTL` (or
        at the claim's expiry, if sooner): the claim's own changes do not change the archive's version.
        A claim that cannot be read (a router role without `get` on sandboxclaims) is taken as not expired;
        `_wait_ready` then still ends the hold once the archive is gone with no Sandbox restored.
        """
        key = (ns, name)
        clock = self._clock()
        view = self.state.archives.get(key)
        known = self._verdicts.get(key)
        if (
            known is not None
            and view is not None
            and (known.uid, known.resource_version) == (view.uid, view.resource_version)
            and clock < known.until
        ):
            self._verdicts.move_to_end(key)
            return known.refusal
        try:
            archive = await self.api.get(lc.ARCHIVE, name, namespace=ns)
        except KubeError:
            return ""  # gone (the patch says so) or unreadable: the controller decides
        refusal, ttl = await self._archive_refusal(ns, name, archive, now)
        meta = archive.get("metadata") or {}
        self._verdicts[key] = _Verdict(
            str(meta.get("uid", "")), str(meta.get("resourceVersion", "")), refusal, clock + ttl
        )
        self._verdicts.move_to_end(key)
        while len(self._verdicts) > _REFUSALS_KEPT:
            self._verdicts.popitem(last=False)
        return refusal

    async def _archive_refusal(
        self, ns: str, name: str, archive: dict[str, Any], now: datetime
    ) -> tuple[str, float]:
        """(`_restore_refused`'s answer for `archive`, for how long it holds in seconds)."""
        expired_at = ((archive.get("metadata") or {}).get("annotations") or {}).get(lc.ANNOTATION_EXPIRED_AT)
        if expired_at:  # the controller's mark is never taken back: this archive version is final
            why = f"it is hibernated and has expired (its archive is marked {lc.ANNOTATION_EXPIRED_AT}={expired_at})"
            return refusal_detail(ns, name, why), float("inf")
        claim_name = controller_name(archive, SANDBOX_CLAIM)
        if not claim_name:
            return "", float("inf")
        try:
            claim = await self.api.get(SANDBOX_CLAIM, claim_name, namespace=ns)
        except (Forbidden, NotFound):
            # no grant on claims / deleted (the archive goes with it): nothing to tell here
            return "", _VERDICT_TTL
        except KubeError as exc:
            log.info("claim %s/%s of archive %s not read: %s", ns, claim_name, name, exc)
            return "", 0.0
        if not controlled_by(archive, SANDBOX_CLAIM, str(claim["metadata"].get("uid") or "")):
            return "", _VERDICT_TTL  # a new claim under the name: not the one whose expiry ends this archive
        expired, left = lc.claim_expired(claim, now)
        if not expired:
            return "", _VERDICT_TTL if left is None else max(0.0, min(_VERDICT_TTL, left))
        # Through deadline_after: a shutdownTime at datetime's lower end (year 0000 is clamped there) put
        # `now + left` a rounding error below it - OverflowError instead of an answer.
        at = deadline_after(now, left) if left is not None else None
        when = f" at {format_rfc3339nano(at)}" if at is not None else ""
        why = f"it is hibernated and its SandboxClaim {claim_name!r} has expired{when}"
        return refusal_detail(ns, name, why), _VERDICT_TTL

    async def _restore_ended(self, key: Key) -> bool:
        """The restore asked for `key` will not bring the Sandbox back: neither it nor its archive exists (the
        controller deleted the archive without restoring: its claim expired, or the Sandbox the restore
        created, or the archive, was deleted). Confirmed by uncached reads: the router's informers may lag
        (an archive created just before the restore request, a Sandbox created just before its archive's
        deletion). The Sandbox is read again after the archive: a hibernation creates the archive before it
        deletes the Sandbox, a restore creates the Sandbox before it deletes the archive, so one of the three
        reads sees whichever a hibernation or restore between them left."""
        ns, name = key
        if key in self.state.sandboxes or key in self.state.archives:
            return False
        for kind in (SANDBOX, lc.ARCHIVE, SANDBOX):
            try:
                await self.api.get(kind, name, namespace=ns)
            except NotFound:
                continue
            except KubeError:
                return False
            return False
        return True

    async def _restore_ended_within(self, key: Key, remaining: float) -> bool:
        """`_restore_ended`, bounded by the held request's time left; the reads are shared by every request
        held for `key` that asks meanwhile (one check per key per wake). Until December 6 each held request
        made its own reads on every wake, unbounded: with a slow API server (a 60 s client timeout per read,
        two reads) a request was held up to ~120 s past its deadline."""
        if remaining <= 0 or key in self.state.sandboxes or key in self.state.archives:
            return False  # out of time (the caller says so), or the cache answers: no reads
        check = self._ending.get(key)
        if check is None:
            check = asyncio.create_task(self._restore_ended(key), name=f"restore ended {key[0]}/{key[1]}")
            self._ending[key] = check
            check.add_done_callback(
                lambda t: self._ending.pop(key, None) if self._ending.get(key) is t else None
            )
        try:
            async with asyncio.timeout(remaining):
                return await asyncio.shield(check)  # one request's deadline does not cancel the others' check
        except TimeoutError:
            return False  # the caller's own bound says the rest
