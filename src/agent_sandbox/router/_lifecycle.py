"""The router's part in sandbox lifecycle (`--sandbox-lifecycle`, ours, docs/lifecycle.md).

Two jobs, both only for Sandboxes that asked for them (`lifecycle.agents.x-k8s.io/*` on the Sandbox or its
template); every other request is proxied exactly as without the flag. So is every request to an unclaimed
warm-pool member (`agents.x-k8s.io/warm-pool-sandbox` on the Sandbox), whatever its template asks: it is no
one's Sandbox yet, not routable by name (router spec §1.9.4), and its pool owns its lifecycle (the lifecycle
controller never touches it either). Until December 6 a request naming one whose template asked for
`auto-resume` was held for the whole resume timeout and then told the member "was not Ready within 60s",
instead of the prompt 502 it gets without the flag.

**Activity.** A proxied request to a Sandbox with an idle timeout is activity, from its start until its end;
a WebSocket or h2c connection is activity while bytes move on it. The router keeps it in memory
and writes the `last-activity` annotation at most once per `--sandbox-lifecycle-activity-interval` (capped at
a quarter of the Sandbox's idle timeout) per Sandbox, in the background. When the recorded activity is older
than half the idle timeout, the write is made before the request is proxied, so a lifecycle controller about
to suspend the Sandbox sees it first (its suspend is guarded by the resourceVersion this write changes).

**Resume on request.** A request that finds no Ready pod for a Sandbox with `auto-resume: "true"` is held:
a suspended Sandbox is set Running (`resume-reason: Request`), a hibernated one (only its SandboxArchive
exists) gets a restore request, a Sandbox already starting is waited for. One resume per Sandbox per router
is shared by every request that arrives meanwhile, and the write is guarded by the resourceVersion the
router saw, so of several routers exactly one writes and the others wait. The request waits until a Ready
pod appears in the Pod cache, bounded by `--sandbox-lifecycle-resume-timeout` and by the request's own
deadline, then goes on as any request. When the Sandbox cannot start (its pod is Unschedulable, or its
controller reports an error such as a quota refusal) or the wait runs out, the request gets a 503 JSON
`{"detail": ...}` naming the Sandbox and the reason, with `Retry-After`. A hibernated Sandbox the lifecycle
controller will never restore (its archive marked `expired-at`, or its SandboxClaim expired) gets that 503 at
once, before any restore request is written; so does a held restore whose archive was deleted without a
Sandbox coming back (the controller ended it: its claim expired, or it was deleted). Every such refusal says
`Sandbox <ns>/<name> could not be resumed: <why>`: both SDKs take that phrase as "the router said why" (and
add no guess of their own); only the hold running out says `is resuming but was not Ready within <n>s`.

This module holds resume on request and the `RouterLifecycle` the rest of the router uses; activity records
are `_lifecycle_activity`'s, the verdicts on restores of hibernated Sandboxes `_lifecycle_restore`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ..api import lifecycle as lc
from ..api.constants import OperatingMode
from ..kube import SANDBOX, ApiClient, Conflict, NotFound
from ._lifecycle_activity import ActivityRecorder, Key
from ._lifecycle_restore import RestoreChecks, refusal_detail
from ._lifecycle_state import LifecycleState
from ._metrics import RouterMetrics
from ._podcache import PodCache, PodEntry
from ._routing import Route, RouteError

__all__ = ["MAX_HOLDS", "RETRY_AFTER", "ResumeFailed", "RouterLifecycle"]

log = logging.getLogger("agent_sandbox.router.lifecycle")

RETRY_AFTER = 5
MAX_HOLDS = 2  # a request waits for its Sandbox's resume at most this often (a replaced pod: twice)
_WAKE = 1.0  # a held request re-checks at least this often
_SLOW_HOLD = 5.0  # holds longer than this are logged


class ResumeFailed(RouteError):
    """503: the Sandbox could not be resumed (the detail says why); sent with `Retry-After`."""

    def __init__(self, detail: str) -> None:
        super().__init__(503, detail)


class RouterLifecycle(ActivityRecorder, RestoreChecks):
    """Activity records (`ActivityRecorder`) and resume on request for one router process."""

    def __init__(
        self,
        api: ApiClient,
        state: LifecycleState,
        cache: PodCache,
        metrics: RouterMetrics,
        *,
        resume_timeout: float,
        activity_interval: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        ActivityRecorder.__init__(self, api, state, metrics, activity_interval=activity_interval, clock=clock)
        RestoreChecks.__init__(self, api, state, clock)
        self.cache = cache
        self.resume_timeout = resume_timeout
        self._resuming: dict[Key, asyncio.Task[str]] = {}

    def seen_suspended(self, route: Route) -> bool:
        """The Sandbox is Suspended as this router last saw it (its pod, if the cache still has one, is going)."""
        view = self.state.sandboxes.get((route.namespace, route.sandbox_id))
        return view is not None and view.suspended and not view.unclaimed_pool_member

    def resumable(self, namespace: str, name: str) -> bool:
        """A request for Sandbox `namespace/name` that finds no pod is held while it resumes (suspended:
        resumed, hibernated: restored, starting: waited for), or told at once why it cannot be (`hold`).

        The resolver asks this for a request naming a pod IP it does not know while the Sandbox has no pod:
        the address is then its former pod's (it went before this router saw it), and the request is held as
        one by name instead of being refused as naming an address that is not the Sandbox's.
        """
        key = (namespace, name)
        return self._action(key) is not None or bool(self._final(key))

    def current_pod(self, route: Route) -> PodEntry | None:
        """The Ready pod the Pod cache has for the route's Sandbox now (one a suspend is about to delete)."""
        return self.cache.by_name.get((route.namespace, route.sandbox_id))

    # ------------------------------------------------------------------ resume on request

    async def hold(
        self, route: Route, deadline: float, failed: PodEntry | None = None, *, leaving: bool = False
    ) -> bool:
        """Hold a request that found no usable pod while its Sandbox resumes.

        Args:
            route: the request's route.
            deadline: the request's deadline (event loop time).
            failed: the cache entry a dial just failed on (a pod being deleted, or whose container died); a
                pod replacing it, or that pod with its container restarted, is awaited, not that one.
            leaving: `failed` is the pod of a Sandbox seen Suspended, which the suspend is about to delete
                (its deletion may not be in the Pod cache yet): that pod is taken again only once the Sandbox
                is Running and Ready at its current generation with that pod still not being deleted (resumed
                before the pod went, and the controller kept it).

        Returns:
            True when a Ready pod is there now (resolve and dial again); False when this Sandbox does not
            resume on request (the caller goes on as without lifecycle).

        Raises:
            ResumeFailed: it cannot start, or did not become Ready in time.
        """
        key = (route.namespace, route.sandbox_id)
        final = self._final(key)
        action = self._action(key)
        if action is None and not final:
            return False
        # The informers show a Sandbox (or its archive) there: the namespace is named in the metrics from now
        # on, as a request resolved to a pod names it. Until December 7 it was admitted only once a pod
        # resolved, after this hold had counted its resume and wait, so a namespace's first resume was "-".
        self.metrics.admit_namespace(route.namespace)
        loop = asyncio.get_running_loop()
        start = loop.time()
        outcome = "timeout"
        try:
            if final:
                raise ResumeFailed(final)
            assert action is not None
            task = self._resuming.get(key)
            if task is None or task.done():
                task = self._start_resume(key, action)
            await self._wait_ready(
                key, min(deadline, start + self.resume_timeout), task, failed, start, leaving=leaving
            )
            outcome = "ready"
            return True
        except ResumeFailed:
            outcome = "failed" if loop.time() < min(deadline, start + self.resume_timeout) else "timeout"
            raise
        finally:
            held = loop.time() - start
            self.metrics.lifecycle_resume_wait(route.namespace, outcome, held)
            if held > _SLOW_HOLD or outcome != "ready":
                log.info(
                    "request held %.2fs for %s/%s (%s): %s",
                    held,
                    key[0],
                    key[1],
                    action,
                    outcome,
                    extra={"sandbox_namespace": key[0], "sandbox_id": key[1]},
                )

    def _start_resume(self, key: Key, action: str) -> asyncio.Task[str]:
        """The one resume of `key` in this router, shared by every request held meanwhile."""
        task = asyncio.create_task(self._resume(key, action), name=f"resume {key[0]}/{key[1]}")
        self._resuming[key] = task
        task.add_done_callback(
            lambda t: self._resuming.pop(key, None) if self._resuming.get(key) is t else None
        )
        return task

    def _final(self, key: Key) -> str:
        """Why a Sandbox that asked for `auto-resume` will never be resumed ("" when nothing says so): it
        (or its archive) is being deleted, or its `shutdownTime` passed. Until December 6 such a request was
        held for the whole resume timeout and then told the Sandbox "was not Ready within 60s"."""
        ns, name = key
        view = self.state.sandboxes.get(key)
        if view is not None and view.unclaimed_pool_member:
            return ""  # not ours to answer for (module docstring): proxied as without lifecycle
        archive = self.state.archives.get(key)
        now = self._clock()
        if view is not None and self.state.policy(ns, view.annotations, view.template).auto_resume:
            if view.shutdown_time is not None and now >= view.shutdown_time:
                return f"Sandbox {ns}/{name} could not be resumed: it has expired (its shutdownTime passed)"
            if view.deleting and archive is None:  # with an archive: being hibernated (then restored)
                return f"Sandbox {ns}/{name} could not be resumed: it is being deleted"
        if view is None and archive is not None and self.state.archive_policy(archive).auto_resume:
            if archive.shutdown_time is not None and now >= archive.shutdown_time:
                return refusal_detail(ns, name, "it is hibernated and has expired (its shutdownTime passed)")
            if archive.deleting:
                return refusal_detail(ns, name, "it is hibernated and its archive is being deleted")
        return ""

    def _action(self, key: Key) -> str | None:
        """What a held request for `key` needs: "resume", "restore", "wait", or None (not ours to hold: it did
        not ask for `auto-resume`, or it is an unclaimed warm-pool member, which the router does not route to
        by name and nobody but a claim may start)."""
        view = self.state.sandboxes.get(key)
        if view is not None and view.unclaimed_pool_member:
            return None
        if view is not None and not view.deleting:
            if not self.state.policy(key[0], view.annotations, view.template).auto_resume:
                return None
            return "resume" if view.suspended else "wait"
        archive = self.state.archives.get(key)
        if archive is None or archive.deleting:
            return None
        if not self.state.archive_policy(archive).auto_resume:
            return None
        return "restore"

    async def _resume(self, key: Key, action: str) -> str:
        """The one write a resume needs (guarded, so one router of many writes); returns what it did:
        "resumed", "restored", "resume joined" / "restore joined" (another writer was first), or "waited"."""
        now = datetime.now(UTC)
        ns, name = key
        if action == "resume":
            view = self.state.sandboxes.get(key)
            rv = view.resource_version if view is not None else None
            for _attempt in range(3):
                try:
                    await self.api.patch(
                        SANDBOX, name, lc.resume_patch(lc.Cause.REQUEST, now, rv), namespace=ns
                    )
                except Conflict:
                    fresh = await self.api.get(SANDBOX, name, namespace=ns)
                    if (fresh.get("spec") or {}).get("operatingMode") != OperatingMode.SUSPENDED:
                        self.metrics.lifecycle_resume(ns, "joined")
                        return "resume joined"  # another router (or the CLI) resumed it
                    rv = fresh["metadata"]["resourceVersion"]
                    continue
                except NotFound:
                    action = "restore"  # archived meanwhile
                    break
                self.metrics.lifecycle_resume(ns, "resumed")
                log.info("resumed %s/%s on request", ns, name)
                return "resumed"
            else:
                raise RuntimeError(f"Sandbox {ns}/{name} kept changing while resuming")
        if action == "restore":
            if why := await self._restore_refused(ns, name, now):
                raise ResumeFailed(why)
            archive = self.state.archives.get(key)
            if archive is not None and archive.restore_requested:
                self.metrics.lifecycle_resume(ns, "joined")
                return "restore joined"
            patch = lc.restore_request_patch(lc.Cause.REQUEST, now)
            if archive is not None:
                patch["metadata"] = {"resourceVersion": archive.resource_version}
            try:
                await self.api.patch(lc.ARCHIVE, name, patch, namespace=ns)
            except Conflict:
                self.metrics.lifecycle_resume(ns, "joined")
                return "restore joined"  # another router asked first (or the controller is restoring it)
            self.metrics.lifecycle_resume(ns, "restored")
            log.info("asked to restore %s/%s on request", ns, name)
            return "restored"
        return "waited"

    async def _wait_ready(
        self,
        key: Key,
        until: float,
        task: asyncio.Task[str],
        failed: PodEntry | None,
        start: float,
        *,
        leaving: bool = False,
    ) -> None:
        loop = asyncio.get_running_loop()
        ns, name = key
        while True:
            entry = self.cache.by_name.get(key)
            if entry is not None and not entry.deleting:
                if failed is None or entry.pod_uid != failed.pod_uid or entry.restarts != failed.restarts:
                    return  # a new pod, or the failed one with its container restarted
                view = self.state.sandboxes.get(key)
                if leaving and view is not None and not view.suspended and view.ready:
                    return  # resumed before the suspend deleted it: the controller kept it, Ready, for this spec
            if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
                if isinstance(exc, ResumeFailed):
                    raise ResumeFailed(exc.detail)  # one per held request: the task's is shared
                raise ResumeFailed(f"Sandbox {ns}/{name} could not be resumed: {exc}")
            if (
                task.done()
                and not task.cancelled()
                and await self._restore_ended_within(key, until - loop.time())
            ):
                # Neither the Sandbox nor its archive exists (uncached reads say so: a hibernation creates
                # the archive before it deletes the Sandbox, a restore the Sandbox before it deletes the
                # archive), so nothing will come back. A Sandbox without a finalizer goes from Running to
                # absent in one watch event, never seen `deleting`: until December 7 a request held while
                # it resumed waited out the whole resume timeout and was told it "was not Ready within".
                if task.result() in ("restored", "restore joined"):
                    why = (
                        "it was hibernated, and its archive was deleted with no Sandbox coming back (its "
                        "SandboxClaim expired, or it was deleted)"
                    )
                else:
                    why = "it was deleted"
                raise ResumeFailed(refusal_detail(ns, name, why))
            if task.done() and not task.cancelled() and task.result() == "waited":
                # We waited for a Sandbox that looked Running (its pod being deleted by a suspend whose
                # write we had not seen yet): now that it shows Suspended (or archived), resume it.
                action = self._action(key)
                if action in ("resume", "restore"):
                    shared = self._resuming.get(key)
                    task = (
                        shared
                        if shared is not None and not shared.done()
                        else self._start_resume(key, action)
                    )
            view = self.state.sandboxes.get(key)
            if view is not None and not view.suspended and view.blocker:
                raise ResumeFailed(f"Sandbox {ns}/{name} could not be resumed: {view.blocker}")
            if final := self._final(key):  # expired or deleted while it was starting
                raise ResumeFailed(final)
            remaining = until - loop.time()
            if remaining <= 0:
                waited = loop.time() - start
                raise ResumeFailed(f"Sandbox {ns}/{name} is resuming but was not Ready within {waited:.0f}s")
            waits = [
                asyncio.ensure_future(self.cache.wait_changed()),
                asyncio.ensure_future(self.state.wait_changed()),
            ]
            watched: list[asyncio.Future[Any]] = [*waits]
            if not task.done():
                watched.append(task)
            try:
                await asyncio.wait(
                    watched, timeout=min(remaining, _WAKE), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for fut in waits:
                    fut.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await fut

    async def close(self) -> None:
        for task in [*self._resuming.values(), *self._ending.values()]:
            task.cancel()
