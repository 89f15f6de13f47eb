"""Claim observability: first-observed times, the readiness-metrics rules, and the claim metrics (§4.13, §5.8).

Owns: the in-memory first-observed map (name -> (time, UID); a new UID overwrites, deletes only match the
same UID), the pure rules deciding what an authoritative status write means for the latency metrics and
the `claim-first-ready-at` stamp, the latency arithmetic, and the Prometheus families
`agent_sandbox_claim_startup_latency_ms`, `agent_sandbox_claim_controller_startup_latency_ms`,
`agent_sandbox_client_claim_startup_latency_ms`, `agent_sandbox_creation_latency_ms`,
`agent_sandbox_claim_creation_total` (registered once in the process registry).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from prometheus_client import Counter, Histogram

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import (
    ReadOnlyObject,
    normalize_created_by,
    parse_time,
    status_condition,
)
from agent_sandbox.kube.metrics import REGISTRY

__all__ = [
    "CLAIM_BUCKETS",
    "CREATION_BUCKETS",
    "ClaimMetrics",
    "Latencies",
    "ObservedTimes",
    "ReadyStep",
    "latencies",
    "launch_type_of",
    "readiness_step",
    "template_of",
]

UNKNOWN_TEMPLATE: Final = "__unknown__"
CLAIM_BUCKETS: Final = (
    100,
    250,
    500,
    750,
    1000,
    1250,
    1500,
    2000,
    2500,
    5000,
    10000,
    30000,
    60000,
    120000,
    240000,
)
CREATION_BUCKETS: Final = (
    50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000, 240000, 300000, 600000,
)  # fmt: skip


class ObservedTimes:
    """First time each claim (by name, guarded by UID) was seen by this process (§4.1)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], tuple[datetime, str]] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def record(self, namespace: str, name: str, uid: str, now: datetime) -> None:
        """Remember `now` unless this UID was already seen (a different UID is a new claim: overwrite)."""
        held = self._seen.get((namespace, name))
        if held is None or held[1] != uid:
            self._seen[(namespace, name)] = (now, uid)

    def get(self, namespace: str, name: str, uid: str) -> datetime | None:
        held = self._seen.get((namespace, name))
        return held[0] if held is not None and held[1] == uid else None

    def drain(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Forget the entry (only if it belongs to `uid`, when given): a newer claim's entry survives."""
        held = self._seen.get((namespace, name))
        if held is not None and (uid is None or held[1] == uid):
            del self._seen[(namespace, name)]


class ReadyStep(enum.Enum):
    """What an authoritative status write implies for metrics and the first-ready stamp (§4.13)."""

    NOTHING = "nothing"
    DRAIN = "drain"  # forget the first-observed entry
    DRAIN_BACKFILL = "drain_backfill"  # forget, and stamp first-ready "unknown" if missing
    RECORD = "record"  # record the latencies, stamp first-ready = now, forget


def readiness_step(*, old_ready: bool, new_ready: bool, first_ready_stamped: bool) -> ReadyStep:
    """§4.13 readiness-metrics table: record exactly once, on the first observed Ready transition."""
    if not new_ready:
        return ReadyStep.DRAIN_BACKFILL if old_ready else ReadyStep.NOTHING
    if old_ready:
        return ReadyStep.DRAIN_BACKFILL
    if first_ready_stamped:
        return ReadyStep.DRAIN  # a flap or a resume: already recorded once
    return ReadyStep.RECORD


def launch_type_of(sandbox: ReadOnlyObject | None) -> str:
    """From the Sandbox label only: `warm`, else `cold`; `unknown` with no Sandbox."""
    if sandbox is None:
        return "unknown"
    labels = (sandbox.get("metadata") or {}).get("labels") or {}
    return c.LAUNCH_TYPE_WARM if labels.get(c.LABEL_LAUNCH_TYPE) == c.LAUNCH_TYPE_WARM else c.LAUNCH_TYPE_COLD


def template_of(sandbox: ReadOnlyObject | None) -> str:
    annotations = ((sandbox or {}).get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(c.ANNOTATION_SANDBOX_TEMPLATE_REF) or UNKNOWN_TEMPLATE)


@dataclass(frozen=True, slots=True)
class Latencies:
    """Milliseconds to record; None = skip that histogram."""

    webhook_ms: float | None
    controller_ms: float | None
    client_ms: float | None
    creation_ms: float | None


def _ms(start: datetime | None, end: datetime) -> float | None:
    if start is None:
        return None
    ms = (end - start).total_seconds() * 1000.0
    return None if ms < 0 else float(int(ms))  # whole milliseconds; future/negative starts are skipped


def latencies(
    claim: ReadOnlyObject, sandbox: ReadOnlyObject | None, *, now: datetime, first_observed: datetime
) -> Latencies:
    """The latency samples of a claim's first Ready (§4.13)."""
    ann = (claim.get("metadata") or {}).get("annotations") or {}
    observed = parse_time(ann.get(c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT)) or first_observed
    creation: float | None = None
    if sandbox is not None:
        created = parse_time((sandbox.get("metadata") or {}).get("creationTimestamp"))
        ready = status_condition(sandbox, c.CONDITION_READY)
        ready_at = parse_time((ready or {}).get("lastTransitionTime"))
        if created is not None and ready_at is not None:
            creation = _ms(created, ready_at)
    return Latencies(
        webhook_ms=_ms(parse_time(ann.get(c.ANNOTATION_WEBHOOK_FIRST_OBSERVED_AT)), now),
        controller_ms=_ms(observed, now),
        client_ms=_ms(parse_time(ann.get(c.ANNOTATION_CLIENT_FIRST_REQUESTED_AT)), now),
        creation_ms=creation,
    )


class ClaimMetrics:
    """The claim controller's Prometheus families (one set per process, in the shared registry)."""

    _families: dict[str, Any] = {}

    def __init__(self) -> None:
        fam = ClaimMetrics._families
        if not fam:
            labels = ["launch_type", "sandbox_template"]
            fam["webhook"] = Histogram(
                "agent_sandbox_claim_startup_latency_ms",
                "Time from the webhook first observing a SandboxClaim to the claim first becoming Ready.",
                labels,
                buckets=CLAIM_BUCKETS,
                registry=REGISTRY,
            )
            fam["controller"] = Histogram(
                "agent_sandbox_claim_controller_startup_latency_ms",
                "Time from the controller first observing a SandboxClaim to the claim first becoming Ready.",
                labels,
                buckets=CLAIM_BUCKETS,
                registry=REGISTRY,
            )
            fam["client"] = Histogram(
                "agent_sandbox_client_claim_startup_latency_ms",
                "Time from the client requesting a SandboxClaim to the claim first becoming Ready.",
                labels,
                buckets=CLAIM_BUCKETS,
                registry=REGISTRY,
            )
            fam["creation"] = Histogram(
                "agent_sandbox_creation_latency_ms",
                "Time from Sandbox creation to the Sandbox becoming Ready.",
                ["namespace", "launch_type", "sandbox_template"],
                buckets=CREATION_BUCKETS,
                registry=REGISTRY,
            )
            fam["created"] = Counter(
                "agent_sandbox_claim_creation",
                "Sandboxes provided to SandboxClaims (cold creates and warm adoptions).",
                [
                    "namespace",
                    "sandbox_template",
                    "launch_type",
                    "warmpool_name",
                    "pod_condition",
                    "created_by",
                ],
                registry=REGISTRY,
            )
        self.webhook: Histogram = fam["webhook"]
        self.controller: Histogram = fam["controller"]
        self.client: Histogram = fam["client"]
        self.creation: Histogram = fam["creation"]
        self.created: Counter = fam["created"]

    def record_ready(self, claim: ReadOnlyObject, sandbox: ReadOnlyObject | None, lat: Latencies) -> None:
        launch, template = launch_type_of(sandbox), template_of(sandbox)
        for hist, value in ((self.webhook, lat.webhook_ms), (self.controller, lat.controller_ms)):
            if value is not None:
                hist.labels(launch, template).observe(value)
        if lat.client_ms is not None:
            self.client.labels(launch, template).observe(lat.client_ms)
        if lat.creation_ms is not None:
            namespace = (claim.get("metadata") or {}).get("namespace", "")
            self.creation.labels(namespace, launch, template).observe(lat.creation_ms)

    def count_creation(
        self,
        claim: ReadOnlyObject,
        sandbox: ReadOnlyObject,
        *,
        launch_type: str,
        pool: str,
        ready: bool,
        template: str,
    ) -> None:
        meta = claim.get("metadata") or {}
        created_by = normalize_created_by((meta.get("labels") or {}).get(c.LABEL_CREATED_BY))
        self.created.labels(
            meta.get("namespace", ""),
            template,
            launch_type,
            pool,
            "ready" if ready else "not_ready",
            created_by,
        ).inc()
