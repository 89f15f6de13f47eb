"""The manager: wires the shared client, cache, event broadcaster and servers, and runs `Runnable`s.

Start order (controller-runtime `manager`, controllers spec §5.3-5.4):

1. metrics and health-probe servers (every replica serves them, leader or not);
2. the cache and other non-leader runnables (event broadcaster, webhook server...); wait for the caches
   created so far to sync (bounded by `cache_sync_timeout`);
3. leader election (if enabled): block until the Lease is held, keep renewing it in the background;
4. leader-gated runnables (controllers).

Leader election runs on its own thread, event loop and API client (`ThreadedLeaderElector` with
`ApiClient.clone`): its own connection and token bucket (`LEASE_CLIENT_QPS`/`LEASE_CLIENT_BURST`,
independent of `--kube-api-qps`), so neither a busy event loop nor a throttled or saturated shared
client can delay a renewal past the renew deadline.

Everything runs in one `asyncio.TaskGroup`. When `stop` is set: leader-gated runnables are cancelled
first and drain their in-flight work (bounded by `graceful_shutdown_timeout`); then, still leader, the
writes held back behind other work (`HeldWrites`: the Events, claim priority's first-ready stamps) are
sent (bounded by `shutdown_flush_timeout`; what is left or failed is named in a warning); then the Lease is
released (a successor takes over at once), then caches and servers stop. If any runnable fails, or leadership is
lost, the TaskGroup cancels the rest and `start()` raises that error (unwrapped when it is the only one).

Held writes are flushed before the release because the release ends this process's right to write (the
write gate refuses everything after it), and a successor does not redo them: an Event is emitted when a
claim is bound, and a first-ready stamp it finds missing on a Ready claim can only be `unknown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry

from ..api.errortext import describe_error
from ._cache import Cache, CachedClient, CacheOptions
from ._cachemetrics import CACHED_OBJECTS_METRIC, CachedObjectsCollector
from ._client import ApiClient
from ._electionthread import ThreadedLeaderElector
from ._events import EventBroadcaster, EventRecorder
from ._leaderelection import Elector, LeaderElectionConfig, default_identity
from ._pprof import add_pprof_routes
from ._servers import Check, HealthServer, MetricsServer
from ._stopreport import StopReport
from .errors import NotLeader
from .metrics import REGISTRY, register_replacing

__all__ = [
    "LEASE_CLIENT_BURST",
    "LEASE_CLIENT_QPS",
    "HeldWrites",
    "Manager",
    "ManagerOptions",
    "Runnable",
    "in_cluster_namespace",
]

log = logging.getLogger("agent_sandbox.kube.manager")

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

# The leader-election client's own budget. A leader makes one request per retry period (a PUT; a GET
# too on the slow path), so client-go's default 5 qps / 10 burst is ample, and a renewal never waits
# for tokens the reconcilers spent.
LEASE_CLIENT_QPS = 5.0
LEASE_CLIENT_BURST = 10


class Runnable(Protocol):
    """Anything the manager runs: `start()` blocks until cancelled.

    Optional attribute `need_leader_election` (default True): False runs it on every replica.
    """

    async def start(self) -> None: ...


class HeldWrites(Protocol):
    """Writes a component holds back for a while (claim priority) that a graceful stop must still send.

    The manager's graceful stop calls `flush()` after the leader-gated runnables drained and before it
    releases the Lease, bounded by `ManagerOptions.shutdown_flush_timeout`.
    """

    async def flush(self) -> None:
        """Stop holding and send everything held; return once sent (the caller bounds the wait)."""
        ...

    def unwritten(self) -> Mapping[str, int]:
        """Writes still held or being sent, plus those that failed once the stop began, by kind (the shutdown
        warning names what is lost)."""
        ...


def in_cluster_namespace(path: Path = _SA_NAMESPACE) -> str | None:
    """The pod's namespace from the service-account mount, or None outside a cluster."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


@dataclass
class ManagerOptions:
    """Manager settings; defaults match controller-runtime and controllers spec §5.4.

    The `new_*` factories exist for tests (swap a collaborator without patching globals).
    """

    metrics_bind_address: str = ":8080"
    health_probe_bind_address: str = ":8081"
    leader_election: bool = False
    leader_election_id: str = ""
    leader_election_namespace: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    leader_election_release_on_cancel: bool = True
    identity: str = ""
    graceful_shutdown_timeout: float = 30.0
    shutdown_flush_timeout: float = 5.0
    """Longest a graceful stop spends sending held writes (after the drain, before the Lease release)."""
    stop_report_after: float = 15.0
    """A stop still running this many seconds after `stop` logs every thread's and task's stack (`StopReport`),
    before the kubelet's default 30 s grace ends in a SIGKILL; 0 disables."""
    cache_sync_timeout: float = 120.0
    cache: CacheOptions = field(default_factory=CacheOptions)
    enable_pprof: bool = False
    enable_pprof_debug: bool = False
    registry: CollectorRegistry = REGISTRY
    event_hold: Callable[[float], Awaitable[None]] | None = None
    """Awaited with an Event's age before it is written (lets a busier write path go first)."""
    held_writes: Sequence[HeldWrites] = ()
    """Besides the Events: held writes a graceful stop sends before it releases the Lease (claim priority)."""
    new_cache: Callable[[ApiClient, CacheOptions], Cache] | None = None
    new_elector: Callable[[ApiClient, LeaderElectionConfig], Elector] | None = None


class Manager:
    """Owns the shared dependencies of all controllers in the process and runs them."""

    def __init__(self, api: ApiClient, options: ManagerOptions | None = None) -> None:
        """Build the manager (no I/O yet).

        Raises:
            ValueError: leader election is on without an id, or without a namespace outside a cluster.
        """
        self.options = opts = options or ManagerOptions()
        self.api = api
        self.identity = opts.identity or default_identity()
        self.cache = opts.new_cache(api, opts.cache) if opts.new_cache else Cache(api, opts.cache)
        self.client = CachedClient(self.cache, api)
        self.events = EventBroadcaster(api, instance=self.identity, hold=opts.event_hold)
        register_replacing(opts.registry, CACHED_OBJECTS_METRIC, CachedObjectsCollector(self.cache))
        self.metrics_server = MetricsServer(opts.metrics_bind_address, opts.registry)
        if opts.enable_pprof or opts.enable_pprof_debug:
            add_pprof_routes(self.metrics_server.app, debug=opts.enable_pprof_debug)
        self.health_server = HealthServer(opts.health_probe_bind_address)
        self.elector: Elector | None = None
        if opts.leader_election:
            self.elector = self._new_elector(opts)
        self.elected = asyncio.Event()
        """Set once leader-gated runnables may run (immediately when leader election is off)."""
        self._runnables: list[Runnable] = [self.events]
        if self.elector is not None:
            api.set_write_gate(self._leadership_gate)

    def _leadership_gate(self) -> None:
        """Refuse a write once this process has led and cannot prove it still does (`NotLeader`).

        Before the first election nothing is refused (a standby's webhook writes its CRD patches); after
        it, a write goes out only while the elector holds the Lease within its renew deadline, so a
        deposed leader (frozen past its lease, partitioned, stepping down) writes nothing once a
        successor may have started.
        """
        if self.elected.is_set() and self.elector is not None and not self.elector.is_leader:
            raise NotLeader(
                "refusing to write: this process no longer holds the leader Lease "
                "(lost, released, or not renewed within the renew deadline)"
            )

    def _new_elector(self, opts: ManagerOptions) -> Elector:
        if not opts.leader_election_id:
            raise ValueError("leader election requires a leader election id")
        namespace = opts.leader_election_namespace or in_cluster_namespace()
        if not namespace:
            raise ValueError(
                "unable to find leader election namespace: not running in-cluster, "
                "please specify --leader-election-namespace"
            )
        cfg = LeaderElectionConfig(
            name=opts.leader_election_id,
            namespace=namespace,
            identity=self.identity,
            lease_duration=opts.lease_duration,
            renew_deadline=opts.renew_deadline,
            retry_period=opts.retry_period,
            release_on_cancel=opts.leader_election_release_on_cancel,
        )
        if opts.new_elector:
            return opts.new_elector(self.api, cfg)
        lease_client = self.api.clone(
            qps=LEASE_CLIENT_QPS,
            burst=LEASE_CLIENT_BURST,
            user_agent_suffix="leader-election",
            request_timeout=opts.renew_deadline,
        )
        return ThreadedLeaderElector(lease_client, cfg)

    def add(self, runnable: Runnable) -> None:
        """Register a runnable (before `start`)."""
        self._runnables.append(runnable)

    def event_recorder(self, controller: str) -> EventRecorder:
        """An events.k8s.io recorder reporting as `controller` (e.g. "sandbox-controller")."""
        return self.events.recorder(controller)

    def add_healthz_check(self, name: str, check: Check) -> None:
        self.health_server.healthz[name] = check

    def add_readyz_check(self, name: str, check: Check) -> None:
        self.health_server.readyz[name] = check

    # ------------------------------------------------------------------ run

    async def start(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set, then shut down in order. Raises the failure: itself when one runnable
        failed, an `ExceptionGroup` of the failures when several did in the same pass."""
        report = StopReport(self.options.stop_report_after)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._run(tg, stop, report), name="manager")
        except BaseExceptionGroup as group:
            leaves = _leaves(group)
            if len(leaves) == 1:
                raise leaves[0] from None
            raise
        finally:
            # Only now: the task group waits for runnables that outlived their grace (`_stop_tasks`).
            report.cancel()

    async def _run(self, tg: asyncio.TaskGroup, stop: asyncio.Event, report: StopReport) -> None:
        servers = [self.metrics_server, self.health_server]
        background: list[asyncio.Task[None]] = [tg.create_task(s.start(), name=s.name) for s in servers]
        leader_tasks: list[asyncio.Task[None]] = []
        hold: list[asyncio.Task[None]] = []

        async def startup() -> None:
            for server in servers:
                await server.wait_serving()
            background.append(tg.create_task(self.cache.start(), name="cache"))
            for r in self._runnables:
                if not getattr(r, "need_leader_election", True):
                    background.append(tg.create_task(r.start(), name=type(r).__name__))
            try:
                async with asyncio.timeout(self.options.cache_sync_timeout):
                    await self.cache.wait_for_sync()
            except TimeoutError:
                # Named, as controller-runtime names the kind: usually a CRD that is not installed (the
                # informer's 404s are in the log), e.g. --sandbox-lifecycle without SandboxArchive.
                waiting = sorted(
                    f"{kind.plural}.{kind.group or 'core'}"
                    for kind, inf in self.cache.informers.items()
                    if not inf.has_synced
                )
                raise TimeoutError(
                    f"timed out waiting for caches to sync: {', '.join(waiting) or 'none left'} "
                    "(is its CustomResourceDefinition installed?)"
                ) from None
            log.info("caches synced")
            if self.elector is not None:
                await self.elector.acquire()
                hold.append(tg.create_task(self.elector.hold(), name="leader-election"))
            self.elected.set()
            for r in self._runnables:
                if getattr(r, "need_leader_election", True):
                    leader_tasks.append(tg.create_task(r.start(), name=getattr(r, "name", type(r).__name__)))

        starting = tg.create_task(startup(), name="startup")
        try:
            await stop.wait()
            log.info("stopping: draining leader-gated runnables")
        finally:
            report.arm()
            starting.cancel()
            await self._stop_tasks(leader_tasks, self.options.graceful_shutdown_timeout)
            # Still leader (the renewals go on until `hold` stops): send what the controllers did but held
            # back. Until December 6 they were left for after the release, where the write gate refused or
            # cancellation dropped them, silently (a SIGTERM hand-over under claim load: 37 of 40 claims
            # without their Event, most without a real first-ready stamp).
            await self._flush_held_writes()
            await self._stop_tasks(hold, 1.0)
            if self.elector is not None:
                if self.options.leader_election_release_on_cancel:
                    try:
                        async with asyncio.timeout(2.0):
                            await self.elector.release()
                    except Exception as exc:
                        # Said, not swallowed: the next leader then waits out the lease (until December 6 a
                        # timed-out release left no line in the log).
                        log.warning(
                            "lease not released; a successor waits for it to expire",
                            extra={"error": describe_error(exc)},
                        )
                with contextlib.suppress(Exception):
                    await self.elector.close()
            await self._stop_tasks(background, 5.0)
            log.info("manager stopped")

    def _may_write(self) -> bool:
        """What `_leadership_gate` allows right now."""
        return self.elector is None or not self.elected.is_set() or self.elector.is_leader

    async def _flush_held_writes(self) -> None:
        """Send the held writes (`HeldWrites`) while the gate still allows it, bounded; warn about the rest."""
        held: list[HeldWrites] = [self.events, *self.options.held_writes]
        timeout = self.options.shutdown_flush_timeout
        timed_out = False
        if self._may_write():
            try:
                async with asyncio.timeout(timeout):
                    results = await asyncio.gather(*(h.flush() for h in held), return_exceptions=True)
            except TimeoutError:
                results, timed_out = [], True
            for result in results:
                if isinstance(result, Exception):
                    log.warning("flushing held writes failed", extra={"error": describe_error(result)})
        # The count includes the writes that failed during the flush (API server down, `NotLeader`): the
        # writers drop them as best effort but count them once stopping. It is taken here, before the
        # release: after a timeout, writes still in flight may yet land before it, so it is an upper bound.
        if not self._may_write():
            why = "leadership lost"  # before the flush, or during it: every write since was refused
        elif timed_out:
            why = f"not written within {timeout:g}s"
        else:
            why = "write failed"
        left: dict[str, int] = {}
        for h in held:
            for kind, count in h.unwritten().items():
                if count:
                    left[kind] = left.get(kind, 0) + count
        if left:
            log.warning(
                "stopping: %d held writes lost (%s): %s",
                sum(left.values()),
                why,
                ", ".join(f"{kind}={count}" for kind, count in sorted(left.items())),
            )

    @staticmethod
    async def _stop_tasks(tasks: list[asyncio.Task[None]], grace: float) -> None:
        live = [t for t in tasks if not t.done()]
        for task in live:
            task.cancel()
        if live:
            _, pending = await asyncio.wait(live, timeout=grace)
            if pending:
                log.warning("%d runnables did not stop within %.0fs", len(pending), grace)


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        elif not isinstance(exc, asyncio.CancelledError):
            out.append(exc)
    return out
