"""Leader election on a coordination.k8s.io/v1 Lease (client-go `leaderelection` semantics).

Owns: acquiring, renewing and releasing the Lease (controllers spec §5.4: id
`a3317529.agent-sandbox.x-k8s.io`, lease 15 s, renew deadline 10 s, retry 2 s, released on graceful
shutdown). Writes are optimistic (PUT with the observed resourceVersion), so two candidates can never both
win a round.

Expiry is judged on the local clock from when *we* last saw the record change (client-go's
`observedTime`), never from the timestamps inside the Lease, so clock skew between replicas does not
matter.

Fast hand-over: while waiting, a candidate also watches its Lease; a release (holder cleared) wakes it
immediately instead of at the next retry tick, so a successor takes over well within 2 s of a graceful
stop. A crashed leader is replaced after the lease duration.

Renewal (client-go's fast path): the leader renews optimistically with one PUT of the Lease it last
wrote, as long as that lease is still valid on its own clock; only a failed PUT falls back to the read-
then-write slow path.

Where it runs: `LeaderElector` runs on whatever loop awaits it, with the client it is given. The manager
runs it through `ThreadedLeaderElector` (`_electionthread`): its own thread, event loop and API client,
so reconcile work can neither starve nor throttle renewals.

Leadership is bounded in time: `is_leader` is true only until `renew_deadline` after the start of the
last successful acquire/renew attempt. A successor can take over only `lease_duration` (> renew deadline)
after it saw that write, so while `is_leader` holds, no successor can have started; the manager refuses
writes once it no longer holds (`kube.NotLeader`), e.g. in a process that was frozen (SIGSTOP, a long
pause) past its lease and runs again. A renewal that finds the Lease held by someone else steps down at
once instead of retrying until the deadline.

Failure modes: `hold()` raises `LeaderElectionLost` when renewals keep failing for `renew_deadline`, or
at once when another candidate holds the Lease;
the manager then stops (and the process exits non-zero, as controller-runtime does). Every failed
attempt is logged with what failed (`describe_error`; a timed-out attempt says how long it waited).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from ..api.errortext import describe_error
from ._client import ApiClient
from ._clock import REAL_CLOCK, Clock
from ._resources import LEASE
from .errors import Conflict, KubeError, NotFound
from .metrics import LEADER_ELECTION_STATUS

__all__ = [
    "Elector",
    "LeaderElectionConfig",
    "LeaderElectionLost",
    "LeaderElector",
    "RenewalRound",
    "default_identity",
    "next_attempt_delay",
]

log = logging.getLogger("agent_sandbox.kube.leaderelection")


class LeaderElectionLost(Exception):
    """Renewing the Lease failed for longer than the renew deadline; leadership must be given up."""


def default_identity() -> str:
    """controller-runtime's identity: "<hostname>_<uuid>"."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True, slots=True)
class LeaderElectionConfig:
    """Lease location and timings (defaults: controller-runtime's 15 s / 10 s / 2 s)."""

    name: str
    namespace: str
    identity: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True


class Elector(Protocol):
    """What the manager needs from a leader elector (`LeaderElector`, `ThreadedLeaderElector`)."""

    config: LeaderElectionConfig
    identity: str

    @property
    def is_leader(self) -> bool: ...

    async def acquire(self) -> None:
        """Block until this candidate holds the Lease."""
        ...

    async def hold(self) -> None:
        """Keep renewing until cancelled; raise `LeaderElectionLost` when renewal fails for too long."""
        ...

    async def release(self) -> bool:
        """Give the Lease up at once (graceful stop); False when not leading or the write failed."""
        ...

    async def close(self) -> None:
        """Free what the elector owns (after `release`)."""
        ...


# How many renewal rounds `LeaderElector.renew_rounds` keeps.
_ROUNDS_KEPT = 4096


@dataclass(frozen=True, slots=True)
class RenewalRound:
    """One successful renewal round, on the elector's clock (monotonic seconds)."""

    started: float
    """When the round began: the retry-period sleep after the previous round ended."""
    finished: float
    """When the renewal write succeeded."""

    @property
    def seconds(self) -> float:
        """How long the round took; a round reaching `renew_deadline` loses leadership."""
        return self.finished - self.started


def _micro_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def next_attempt_delay(retry_period: float, expires_in: float | None, jitter: float) -> float:
    """How long a candidate waits before its next attempt (unless the Lease changes first).

    client-go waits a retry period with up to 20% jitter (`jitter` in [0, 1)), so a successor could take
    up to 2.4 s after the holder's Lease expired; waking just after the expiry instead bounds the hand-over
    after a crash by the time one attempt takes.
    """
    delay = retry_period * (1 + jitter * 0.2)
    if expires_in is not None:
        delay = min(delay, max(0.0, expires_in) + 0.01)
    return delay


class LeaderElector:
    """Campaigns for one Lease. Use `await acquire()`, then `await hold()`; `await release()` on stop."""

    def __init__(self, client: ApiClient, config: LeaderElectionConfig, *, clock: Clock = REAL_CLOCK) -> None:
        if config.lease_duration <= config.renew_deadline or config.renew_deadline <= config.retry_period:
            raise ValueError("need lease_duration > renew_deadline > retry_period")
        self._client = client
        self.config = config
        self.identity = config.identity or default_identity()
        self._clock = clock
        self._observed_spec: dict[str, Any] | None = None
        self._observed_lease: dict[str, Any] | None = None
        self._observed_rv: str | None = None
        self._why_not = ""
        self._held_by_other = ""
        self._observed_at = 0.0
        self._leader = False
        self._valid_until = 0.0
        self._changed = asyncio.Event()
        self._status = LEADER_ELECTION_STATUS.labels(config.name)
        self._status.set(0)
        self.renew_rounds: deque[RenewalRound] = deque(maxlen=_ROUNDS_KEPT)
        """The latest successful renewal rounds, oldest first (for tests and benchmarks)."""

    @property
    def is_leader(self) -> bool:
        """Holding the Lease now: acquired, not released or lost, and renewed within the renew deadline."""
        return self._leader and self._clock.now() < self._valid_until

    @property
    def observed_holder(self) -> str:
        """Holder identity in the last observed record ("" if none)."""
        return (self._observed_spec or {}).get("holderIdentity") or ""

    # ------------------------------------------------------------------ one round

    def _record(self, *, transitions: int, acquire_time: str | None) -> dict[str, Any]:
        now = _micro_time(datetime.now(UTC).timestamp())
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.config.lease_duration),
            "acquireTime": acquire_time or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def _observe(self, lease: dict[str, Any]) -> None:
        spec = lease.get("spec") or {}
        if spec != self._observed_spec:
            self._observed_spec = spec
            self._observed_at = self._clock.now()
        self._observed_lease = lease
        self._observed_rv = lease["metadata"]["resourceVersion"]

    def _lease_valid(self, duration: float) -> bool:
        return self._observed_at + duration > self._clock.now()

    async def _renew_optimistically(self) -> bool:
        """client-go's fast path: PUT the lease we last wrote, renewed, without reading it first."""
        lease, spec = self._observed_lease, self._observed_spec or {}
        if lease is None or spec.get("holderIdentity") != self.identity:
            return False
        if not self._lease_valid(float(spec.get("leaseDurationSeconds") or self.config.lease_duration)):
            return False
        renewed = {
            **lease,
            "spec": self._record(
                transitions=int(spec.get("leaseTransitions") or 0), acquire_time=spec.get("acquireTime")
            ),
        }
        try:
            updated = await self._client.update(LEASE, renewed)
        except KubeError as exc:
            cfg = self.config
            log.info(
                "failed to update lease %s/%s optimistically: %s; falling back to slow path",
                cfg.namespace,
                cfg.name,
                describe_error(exc),
            )
            return False
        self._observe(updated)
        return True

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: create the Lease, renew it, or take it over if free/expired. Returns success.

        When it returns False, `why_not` says why (the holder, or the write that lost a race).
        """
        cfg = self.config
        sent = self._clock.now()
        self._held_by_other = ""
        if await self._try_acquire_or_renew():
            # Nobody can take over before `lease_duration` after they saw this write, which was sent
            # after `sent`: the renew deadline (shorter) bounds how long this success proves leadership.
            self._valid_until = sent + cfg.renew_deadline
            return True
        return False

    async def _try_acquire_or_renew(self) -> bool:
        cfg = self.config
        if await self._renew_optimistically():
            return True
        try:
            lease = await self._client.get(LEASE, cfg.name, namespace=cfg.namespace)
        except NotFound:
            body = {
                "apiVersion": LEASE.api_version,
                "kind": LEASE.kind,
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": self._record(transitions=0, acquire_time=None),
            }
            try:
                created = await self._client.create(LEASE, body)
            except Conflict:  # AlreadyExists: another candidate created it first
                self._why_not = "another candidate created the Lease first"
                return False
            self._observe(created)
            return True
        self._observe(lease)
        spec = self._observed_spec or {}
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        if holder and holder != self.identity and self._lease_valid(duration):
            self._why_not = f"the Lease is held by {holder}"
            self._held_by_other = holder
            return False
        mine = holder == self.identity
        # client-go: keep acquireTime/transitions while renewing, count a transition on takeover.
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        lease["spec"] = self._record(
            transitions=transitions, acquire_time=spec.get("acquireTime") if mine else None
        )
        try:
            updated = await self._client.update(LEASE, lease)
        except Conflict as exc:
            self._why_not = f"the Lease changed while we wrote it ({describe_error(exc)})"
            return False
        self._observe(updated)
        return True

    def _expires_in(self) -> float | None:
        """Seconds until another holder's Lease expires on our clock (None: not held by another)."""
        if not self._held_by_other:
            return None
        spec = self._observed_spec or {}
        duration = float(spec.get("leaseDurationSeconds") or self.config.lease_duration)
        return self._observed_at + duration - self._clock.now()

    @property
    def why_not(self) -> str:
        """Why the last `try_acquire_or_renew` returned False."""
        return self._why_not

    # ------------------------------------------------------------------ campaign

    async def _watch_lease(self) -> None:
        cfg = self.config
        while True:
            try:
                async for _ in self._client.watch(
                    LEASE,
                    namespace=cfg.namespace,
                    field_selector=f"metadata.name={cfg.name}",
                    timeout_seconds=300,
                ):
                    self._changed.set()
            except KubeError as exc:
                log.debug("lease watch ended: %s", describe_error(exc))
                await self._clock.sleep(cfg.retry_period)

    async def acquire(self) -> None:
        """Block until this candidate holds the Lease."""
        cfg = self.config
        log.info("attempting to acquire leader lease %s/%s...", cfg.namespace, cfg.name)
        watcher = asyncio.create_task(self._watch_lease())
        try:
            while True:
                self._changed.clear()
                try:
                    if await self.try_acquire_or_renew():
                        break
                except KubeError as exc:
                    log.warning(
                        "error acquiring lease %s/%s: %s", cfg.namespace, cfg.name, describe_error(exc)
                    )
                # Wake on the next Lease change, after a jittered retry period, or when the holder's
                # Lease expires on our clock, whichever comes first.
                delay = next_attempt_delay(cfg.retry_period, self._expires_in(), random.random())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), delay)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        self._leader = True
        self._status.set(1)
        log.info(
            "successfully acquired lease %s/%s", cfg.namespace, cfg.name, extra={"identity": self.identity}
        )

    async def hold(self) -> None:
        """Renew every retry period until cancelled; raise `LeaderElectionLost` if renewal fails too long.

        One round (client-go `renew`): retry every `retry_period` until a renewal succeeds, each attempt
        bounded by what is left of `renew_deadline`; a round that reaches the deadline loses leadership.
        """
        cfg = self.config
        while True:
            await self._clock.sleep(cfg.retry_period)
            started = self._clock.now()
            deadline = started + cfg.renew_deadline
            last_error = ""
            while True:
                budget = max(0.1, deadline - self._clock.now())
                ok = False
                try:
                    async with asyncio.timeout(budget):
                        ok = await self.try_acquire_or_renew()
                    if not ok:
                        last_error = self._why_not
                except TimeoutError:
                    last_error = describe_error(
                        TimeoutError(f"renewal attempt timed out after {budget:.1f}s")
                    )
                except KubeError as exc:
                    last_error = describe_error(exc)
                if ok:
                    done = RenewalRound(started, self._clock.now())
                    self.renew_rounds.append(done)
                    # client-go logs this at V(4); `--zap-log-level=debug` shows every renewal and its time.
                    log.debug(
                        "successfully renewed lease %s/%s in %.3fs", cfg.namespace, cfg.name, done.seconds
                    )
                    break
                log.warning("failed to renew lease %s/%s: %s", cfg.namespace, cfg.name, last_error)
                if self._held_by_other and self._leader:
                    # It only gets the Lease after ours expired on its clock: we are not the leader,
                    # whatever our renew deadline says (e.g. this process was frozen meanwhile).
                    self._leader = False
                    self._status.set(0)
                    raise LeaderElectionLost(
                        f"leader election lost: lease {cfg.namespace}/{cfg.name} is held by {self._held_by_other}"
                    )
                if self._clock.now() >= deadline:
                    self._leader = False
                    self._status.set(0)
                    raise LeaderElectionLost(
                        f"leader election lost: lease {cfg.namespace}/{cfg.name} not renewed within the "
                        f"{cfg.renew_deadline:g}s renew deadline (last error: {last_error})"
                    )
                await self._clock.sleep(min(cfg.retry_period, max(0.0, deadline - self._clock.now())))

    async def release(self) -> bool:
        """Give the Lease up (holder cleared, duration 1 s) so a successor acquires it at once."""
        if not self._leader or self._observed_rv is None:
            return False
        cfg = self.config
        self._leader = False
        self._status.set(0)
        now = _micro_time(datetime.now(UTC).timestamp())
        spec = self._observed_spec or {}
        lease = {
            "apiVersion": LEASE.api_version,
            "kind": LEASE.kind,
            "metadata": {"name": cfg.name, "namespace": cfg.namespace, "resourceVersion": self._observed_rv},
            "spec": {
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": int(spec.get("leaseTransitions") or 0),
            },
        }
        try:
            await self._client.update(LEASE, lease)
        except KubeError as exc:
            log.error("failed to release lease %s/%s: %s", cfg.namespace, cfg.name, describe_error(exc))
            return False
        log.info("released lease %s/%s", cfg.namespace, cfg.name)
        return True

    async def close(self) -> None:
        """Nothing to free: the client belongs to the caller."""
