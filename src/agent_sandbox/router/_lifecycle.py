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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from ..api import lifecycle as lc
from ..api.constants import OperatingMode
from ..api.meta import controlled_by, controller_name, deadline_after, format_rfc3339nano
from ..kube import SANDBOX, SANDBOX_CLAIM, ApiClient, Conflict, Forbidden, KubeError, NotFound
from ._lifecycle_state import LifecycleState
from ._metrics import RouterMetrics
from ._podcache import PodCache, PodEntry
from ._routing import Route, RouteError

__all__ = ["MAX_HOLDS", "RETRY_AFTER", "ResumeFailed", "RouterLifecycle"]

log = logging.getLogger("agent_sandbox.router.lifecycle")

RETRY_AFTER = 5
MAX_HOLDS = 2  # a request waits for its Sandbox's resume at most this often (a replaced pod: twice)
_URGENT_WRITE_TIMEOUT = 2.0
_FLUSH_PERIOD = 1.0
_WAKE = 1.0  # a held request re-checks at least this often
_SLOW_HOLD = 5.0  # holds longer than this are logged
_REFUSALS_KEPT = 1024  # archives whose restore verdict is remembered (least recently used dropped)
_VERDICT_TTL = 10.0  # a verdict that rests on a claim's state is read again after this long (seconds)


class ResumeFailed(RouteError):
    """503: the Sandbox could not be resumed (the detail says why); sent with `Retry-After`."""

    def __init__(self, detail: str) -> None:
        super().__init__(503, detail)


Key = tuple[str, str]


def _refused(ns: str, name: str, why: str) -> str:
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


class Traffic(Protocol):
    """A relayed connection (`_tunnel.Tunnel`) as activity sees it."""

    @property
    def last_traffic(self) -> float: ...


class RouterLifecycle:
    """Activity records and resume on request for one router process."""

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
        self.api = api
        self.state = state
        self.cache = cache
        self.metrics = metrics
        self.resume_timeout = resume_timeout
        self.activity_interval = activity_interval
        self._clock = clock
        self._pending: dict[Key, float] = {}
        self._written: dict[Key, float] = {}
        self._resuming: dict[Key, asyncio.Task[str]] = {}
        self._verdicts: OrderedDict[Key, _Verdict] = OrderedDict()
        self._ending: dict[Key, asyncio.Task[bool]] = {}
        self._open: dict[Key, int] = {}
        self._tunnels: dict[Key, set[Traffic]] = {}

    # ------------------------------------------------------------------ activity

    def record(self, namespace: str, name: str) -> Awaitable[bool] | None:
        """Note a request to `namespace/name`; an awaitable when its activity must be written first.

        The awaitable's result is True when the write found the Sandbox Suspended although this router still
        saw it Running: the lifecycle controller suspended it just before (the race docs/lifecycle.md
        describes), so its pod is about to go and the request should wait for the resumed one.
        """
        if self.activity_interval <= 0:
            return None
        key = (namespace, name)
        view = self.state.sandboxes.get(key)
        if view is None or view.suspended or view.unclaimed_pool_member:
            return None  # an unclaimed pool member: not to be tampered with (module docstring)
        timeout = self.state.policy(namespace, view.annotations, view.template).idle_timeout
        if timeout is None:
            return None
        now = self._clock()
        age = now - max(view.last_activity or 0.0, self._written.get(key, 0.0))
        if age >= timeout / 2:
            self._pending.pop(key, None)
            self._written[key] = now
            return self._write_activity(key, now, bound=_URGENT_WRITE_TIMEOUT)
        if age >= min(self.activity_interval, timeout / 4):
            self._pending[key] = now
        return None

    def opened(self, namespace: str, name: str) -> None:
        """A request to the Sandbox is in flight (until `closed`): a long download or a slow command through a
        port the runtime does not serve keeps the Sandbox in use although no new request arrives."""
        if self.activity_interval > 0:
            key = (namespace, name)
            self._open[key] = self._open.get(key, 0) + 1

    def closed(self, namespace: str, name: str) -> None:
        """The request `opened` counted ended."""
        key = (namespace, name)
        count = self._open.get(key, 0) - 1
        if count > 0:
            self._open[key] = count
        else:
            self._open.pop(key, None)

    def watch(self, namespace: str, name: str, tunnel: Traffic) -> None:
        """A WebSocket or h2c connection to the Sandbox (until `unwatch`): activity while bytes move on it.

        Not merely while it is open: a gRPC channel or a browser tab left open for the night would keep the
        Sandbox from ever idling.
        """
        if self.activity_interval > 0:
            self._tunnels.setdefault((namespace, name), set()).add(tunnel)

    def unwatch(self, namespace: str, name: str, tunnel: Traffic) -> None:
        key = (namespace, name)
        tunnels = self._tunnels.get(key)
        if tunnels is not None:
            tunnels.discard(tunnel)
            if not tunnels:
                del self._tunnels[key]

    def _in_use(self, since: float) -> list[Key]:
        """Sandboxes with a request in flight, or a tunnel that moved bytes after `since` (monotonic)."""
        busy = list(self._open)
        busy.extend(
            key
            for key, tunnels in self._tunnels.items()
            if key not in self._open and any(t.last_traffic > since for t in tunnels)
        )
        return busy

    async def _write_activity(self, key: Key, when: float, *, bound: float | None = None) -> bool:
        """Write `last-activity`; True when the written Sandbox is Suspended."""
        stamp = format_rfc3339nano(datetime.fromtimestamp(when, UTC))
        patch = {"metadata": {"annotations": {lc.ANNOTATION_LAST_ACTIVITY: stamp}}}
        try:
            async with asyncio.timeout(bound):
                written = await self.api.patch(SANDBOX, key[1], patch, namespace=key[0])
        except (KubeError, TimeoutError, OSError) as exc:
            self.metrics.lifecycle_activity_write(key[0], False)
            log.info("activity record of %s/%s not written: %s", key[0], key[1], exc)
            return False
        self.metrics.lifecycle_activity_write(key[0], True)
        return (written.get("spec") or {}).get("operatingMode") == OperatingMode.SUSPENDED

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

    async def run(self) -> None:
        """Write the noted activity in the background (one patch per Sandbox per flush, at most)."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(_FLUSH_PERIOD)
            now = time.monotonic()
            for namespace, name in self._in_use(last):
                urgent = self.record(namespace, name)  # at the same bounded rate as new requests
                if urgent is not None:
                    await urgent
            last = now
            due, self._pending = self._pending, {}
            for key, when in due.items():
                self._written[key] = when
                await self._write_activity(key, when)
            self._prune()

    def _prune(self) -> None:
        """Forget our writes once the informer shows them (or the Sandbox is gone)."""
        for key, when in list(self._written.items()):
            view = self.state.sandboxes.get(key)
            if view is None or (view.last_activity or 0.0) >= when - 0.001:
                del self._written[key]

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
        if (
            view is None
            and archive is not None
            and self.state.policy(ns, archive.annotations, archive.template).auto_resume
        ):
            if archive.shutdown_time is not None and now >= archive.shutdown_time:
                return _refused(ns, name, "it is hibernated and has expired (its shutdownTime passed)")
            if archive.deleting:
                return _refused(ns, name, "it is hibernated and its archive is being deleted")
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
        if not self.state.policy(key[0], archive.annotations, archive.template).auto_resume:
            return None
        return "restore"

    async def _resume(self, key: Key, action: str) -> str:
        """The one write a resume needs (guarded, so one router of many writes); returns what it did."""
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
                        return "joined"  # another router (or the CLI) resumed it
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
                return "joined"
            patch = lc.restore_request_patch(lc.Cause.REQUEST, now)
            if archive is not None:
                patch["metadata"] = {"resourceVersion": archive.resource_version}
            try:
                await self.api.patch(lc.ARCHIVE, name, patch, namespace=ns)
            except Conflict:
                self.metrics.lifecycle_resume(ns, "joined")
                return "joined"  # another router asked first (or the controller is restoring it)
            self.metrics.lifecycle_resume(ns, "restored")
            log.info("asked to restore %s/%s on request", ns, name)
            return "restored"
        return "waited"

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
            return _refused(ns, name, why), float("inf")
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
        return _refused(ns, name, why), _VERDICT_TTL

    async def _restore_ended(self, key: Key) -> bool:
        """The restore asked for `key` will not bring the Sandbox back: neither it nor its archive exists (the
        controller deleted the archive without restoring: its claim expired, or the Sandbox the restore
        created, or the archive, was deleted). Confirmed by uncached reads: the router's informers may lag
        (an archive created just before the restore request, a Sandbox created just before its archive's
        deletion)."""
        ns, name = key
        if key in self.state.sandboxes or key in self.state.archives:
            return False
        for kind in (SANDBOX, lc.ARCHIVE):
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
                and task.result() in ("restored", "joined")
                and await self._restore_ended_within(key, until - loop.time())
            ):
                raise ResumeFailed(
                    _refused(
                        ns,
                        name,
                        "it was hibernated, and its archive was deleted with no Sandbox coming back (its "
                        "SandboxClaim expired, or it was deleted)",
                    )
                )
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
