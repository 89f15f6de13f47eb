"""Cold-start admission (ours, `--sandbox-claim-cold-start-limit`; docs/design/cold-start-admission.md).

When the API server is the bottleneck (claims arriving faster than it can carry cold starts), starting a
cold Sandbox for every arrival at once makes every start share it: each of hundreds of cycles moves one
slow write at a time and they all finish together, long after the first ones could have. This gate lets
at most `limit` cold starts be *in the API-bound part of their cycle* at once - from the claim's Sandbox
create until its Pod is scheduled - and admits the others in the order the controller first saw them.
A claim waiting here writes nothing, exactly like a claim still in upstream's workqueue backlog, and a warm
member becoming usable wakes it (it then takes the member instead).

A slot is held from admission until the claim's Sandbox reports its Pod scheduled (or Ready), the claim
settles some other way (a warm member, a failure, deletion), or `max_hold` passes - so a Pod that never
schedules (quota, no node) costs one slot for `max_hold`, not forever. The kubelet's part of a cold start
(image pull, container start) holds no slot: on a real cluster, slow nodes never throttle admission.

Pure bookkeeping: no I/O; the reconciler calls it and wakes the requests it returns.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import find_condition
from agent_sandbox.kube import Request

__all__ = [
    "DEFAULT_COLD_START_LIMIT",
    "DEFAULT_MAX_HOLD",
    "ColdStartAdmission",
    "ColdStartAdmissionCollector",
    "past_scheduling",
]

DEFAULT_COLD_START_LIMIT = 0
"""0 = no limit (upstream's behaviour); see docs/design/cold-start-admission.md for the measured choice."""
DEFAULT_MAX_HOLD = 30.0
"""Seconds an admitted cold start may hold its slot without its Pod being scheduled."""

Arrival = tuple[datetime, str, str]  # (first observed, namespace, name): total order, oldest first


def past_scheduling(sandbox: Mapping[str, Any]) -> bool:
    """A cold start's API-bound part is over: the Sandbox reports its Pod scheduled (or itself Ready)."""
    conditions = (sandbox.get("status") or {}).get("conditions")
    return any(
        (find_condition(conditions, kind) or {}).get("status") == "True"
        for kind in (c.CONDITION_POD_SCHEDULED, c.CONDITION_READY)
    )


class ColdStartAdmission:
    """At most `limit` cold starts in flight; the rest admitted oldest first (`limit <= 0`: everyone)."""

    def __init__(
        self,
        limit: int,
        *,
        max_hold: float = DEFAULT_MAX_HOLD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.max_hold = max_hold
        self._clock = clock
        self._in_flight: dict[Request, float] = {}  # request -> admitted at (clock)
        # A scan per decision (no heap): waiting claims number in the hundreds and a scan is microseconds.
        self._waiting: dict[Request, Arrival] = {}

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def admit(self, request: Request, arrival: Arrival) -> bool:
        """May `request` start a cold Sandbox now? If not it waits (`settle` it once it no longer needs to).

        Admitted only if a slot is free and no older claim is waiting, so a newer claim's first pass cannot
        overtake an older one that a released slot has just woken.
        """
        if self.limit <= 0 or request in self._in_flight:
            return True
        self._expire()
        arrival = self._waiting.setdefault(request, arrival)
        if len(self._in_flight) >= self.limit:
            return False
        if any(other < arrival for other in self._waiting.values()):
            return False
        del self._waiting[request]
        self._in_flight[request] = self._clock()
        return True

    def settle(self, request: Request) -> list[Request]:
        """`request` needs no slot any more (Pod scheduled, warm, failed, gone); returns the claims to wake."""
        if self._in_flight.pop(request, None) is None and self._waiting.pop(request, None) is None:
            return []
        return self.next_up()

    def next_up(self) -> list[Request]:
        """The oldest waiting claims that the free slots would admit now (also after slots expired)."""
        if self.limit <= 0 or not self._waiting:
            return []
        self._expire()
        free = self.limit - len(self._in_flight)
        if free <= 0:
            return []
        return [req for req, _ in heapq.nsmallest(free, self._waiting.items(), key=lambda item: item[1])]

    def _expire(self) -> None:
        if not self._in_flight:
            return
        deadline = self._clock() - self.max_hold
        for request in [r for r, at in self._in_flight.items() if at <= deadline]:
            del self._in_flight[request]


class ColdStartAdmissionCollector:
    """`agent_sandbox_claim_cold_starts_{in_flight,waiting}` at scrape time (ours; upstream has neither)."""

    def __init__(self, admission: ColdStartAdmission) -> None:
        self.admission = admission

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "agent_sandbox_claim_cold_starts_in_flight",
            "Admitted cold starts whose Pod is not yet scheduled (--sandbox-claim-cold-start-limit).",
            value=self.admission.in_flight,
        )
        yield GaugeMetricFamily(
            "agent_sandbox_claim_cold_starts_waiting",
            "SandboxClaims waiting for a cold-start slot, admitted oldest first.",
            value=self.admission.waiting,
        )
