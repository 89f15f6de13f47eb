"""Two controller replicas with leader election: the leader dies or freezes mid-burst.

Real control plane (fault cluster, audit log on); each replica is the real `agent-sandbox-controller`
running as the install's ServiceAccount with a token of its own, so the audit log's credential ID says
which replica sent each write. Lease timings are upstream's fixed 15 s / 10 s / 2 s.

* SIGKILL of the leader: the standby acquires the Lease at most 2 s after it expires (expiry = the dead
  leader's last successful renewal + leaseDurationSeconds, both from the audit log), and the burst
  completes with the claim invariants intact.
* SIGSTOP of the leader (a frozen process: long GC pause, VM stall, SIGSTOP): the standby takes over; when
  the old leader runs again it must send nothing new (only requests that had already passed its
  leadership check when it froze can still go out), none of its writes may be applied, and it must step
  down (exit).

A graceful stop (SIGTERM) releasing the Lease at once is `tests/integration/kube/test_controller_process.py::
test_second_replica_takes_over_within_2s_after_graceful_stop`. Each run of this module is one trial of
each kind (there is no long version yet).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from benchmarks.reliability import controllers
from benchmarks.reliability.burst import Settled, create_claims, create_template_and_pool, ready_count, settle
from benchmarks.reliability.invariants import check_burst, writes_after

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.audit import AuditEvent, AuditLog
from agent_sandbox.devcluster.processes import stop
from agent_sandbox.kube import ApiClient
from tests.helpers import eventually, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("faults")]

POOL = 10
CLAIMS = 30
LEASE_DURATION = 15.0
HANDOVER_BOUND = 2.0


@pytest.fixture
def replicas(fault_cluster: DevCluster, fault_namespace: str) -> Iterator[list[controllers.Replica]]:
    """Replicas a (the leader) and b (standing by), both stopped by PID afterwards."""
    started: list[controllers.Replica] = []
    try:
        a = controllers.start_replica(fault_cluster, "a", lease_namespace=fault_namespace)
        started.append(a)
        wait_for(lambda: a.leading, what="replica a leads", timeout=60)
        b = controllers.start_replica(fault_cluster, "b", lease_namespace=fault_namespace)
        started.append(b)
        wait_for(lambda: b.metric(f'leader_election_master_status{{name="{controllers.LEASE_NAME}"}}') == 0.0,
                 what="replica b standing by", timeout=60)  # fmt: skip
        yield started
    finally:
        for r in started:
            if r.alive():
                os.kill(r.started.pid, signal.SIGCONT)  # a frozen process cannot act on SIGTERM
            stop(r.started)


def lease_writes(events: list[AuditEvent], namespace: str, credential: str) -> list[AuditEvent]:
    return [
        e
        for e in events
        if e.resource == "leases" and e.namespace == namespace and e.name == controllers.LEASE_NAME
        and e.credential_id == credential and e.is_write and e.succeeded
    ]  # fmt: skip


@dataclass
class Handover:
    """A burst the leader failed in the middle of: where the audit log starts, when the fault hit, the
    settled objects."""

    audit: AuditLog
    mark: int
    faulted_at: float
    settled: Settled


async def burst_with_a_failing_leader(
    cluster: DevCluster, api: ApiClient, ns: str, standby: controllers.Replica, fault: Callable[[], float]
) -> Handover:
    """Half the burst sent and partly Ready, then `fault` (returns when it hit) on the leader, then the
    other half; returns once the standby leads and every claim settled."""
    audit = AuditLog(cluster.audit_log)
    mark = audit.mark()
    await create_template_and_pool(api, ns, POOL)
    await settle(api, ns, claims=0, replicas=POOL, within=120)
    await create_claims(api, ns, [f"c-{i:03d}" for i in range(CLAIMS // 2)])

    async def some_ready() -> int | None:
        return n if (n := await ready_count(api, ns)) >= 5 else None

    await eventually(some_ready, "the first claims Ready", within=120)
    faulted_at = fault()
    await create_claims(api, ns, [f"c-{i:03d}" for i in range(CLAIMS // 2, CLAIMS)])
    await asyncio.to_thread(wait_for, lambda: standby.leading, what="the standby leads", timeout=60)
    settled = await settle(api, ns, claims=CLAIMS, replicas=POOL, within=240)
    return Handover(audit, mark, faulted_at, settled)


def freeze(pid: int) -> float:
    os.kill(pid, signal.SIGSTOP)
    return time.time()


def handover(events: list[AuditEvent], ns: str, old: str, new: str) -> tuple[float, float]:
    """(the old leader's Lease expiry, the new leader's first Lease write), epoch seconds."""
    last_renewal = max(e.received for e in lease_writes(events, ns, old))
    acquired = min(e.completed for e in lease_writes(events, ns, new))
    return last_renewal + LEASE_DURATION, acquired


async def test_sigkill_of_the_leader_mid_burst(
    fault_cluster: DevCluster,
    fault_kube: ApiClient,
    fault_namespace: str,
    replicas: list[controllers.Replica],
) -> None:
    api, ns = fault_kube, fault_namespace
    a, b = replicas
    run = await burst_with_a_failing_leader(fault_cluster, api, ns, b, lambda: controllers.sigkill(a.started))

    events = run.audit.since(run.mark)
    expiry, acquired = handover(events, ns, a.credential, b.credential)
    print(f"killed {run.faulted_at - (expiry - LEASE_DURATION):.2f}s after the last renewal; "
          f"b acquired {acquired - expiry:+.2f}s after expiry")  # fmt: skip
    assert acquired - expiry <= HANDOVER_BOUND
    assert acquired >= expiry - 0.5, "the standby took a Lease that had not expired"
    assert writes_after(events, credential=a.credential, after=acquired) == []
    check = check_burst(run.settled, events, namespace=ns, replicas=POOL)
    assert check.ok, check.violations


async def test_a_frozen_leader_writes_nothing_once_replaced(
    fault_cluster: DevCluster,
    fault_kube: ApiClient,
    fault_namespace: str,
    replicas: list[controllers.Replica],
) -> None:
    api, ns = fault_kube, fault_namespace
    a, b = replicas
    run = await burst_with_a_failing_leader(fault_cluster, api, ns, b, lambda: freeze(a.started.pid))
    # Wake the old leader while the new one is busy (claims to bind, a pool to refill).
    await create_claims(api, ns, [f"late-{i:03d}" for i in range(10)])
    os.kill(a.started.pid, signal.SIGCONT)
    resumed = time.time()
    settled = await settle(api, ns, claims=CLAIMS + 10, replicas=POOL, within=240)
    # It steps down (and exits, as controller-runtime does) as soon as it sees b's Lease.
    await asyncio.to_thread(wait_for, lambda: not a.alive(), what="the old leader to exit", timeout=30)
    print(f"old leader exited {time.time() - resumed:.1f}s after it resumed")

    events = run.audit.since(run.mark)
    expiry, acquired = handover(events, ns, a.credential, b.credential)
    print(f"b acquired {acquired - expiry:+.2f}s after expiry; a resumed {resumed - acquired:.1f}s later")
    late = writes_after(events, credential=a.credential, after=acquired)
    shown = [
        (round(e.received - resumed, 3), e.verb, e.resource, e.subresource, e.name, e.code) for e in late
    ]
    print(f"old leader's requests after the hand-over: {shown}")
    # Nothing it sent after the hand-over was applied...
    assert [x for x, e in zip(shown, late, strict=True) if e.succeeded] == []
    # ...and nothing was sent once it ran again, except requests that had passed the leadership check
    # before it froze (queued for a connection at that moment: sent within moments of waking up).
    assert [x for x in shown if x[0] > 0.5] == []
    check = check_burst(settled, events, namespace=ns, replicas=POOL)
    assert check.ok, check.violations
