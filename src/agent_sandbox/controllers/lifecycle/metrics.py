"""The lifecycle controller's metrics (ours, docs/lifecycle.md "Observability").

| metric | type | labels | what |
|---|---|---|---|
| `agent_sandbox_lifecycle_suspends_total` | counter | `cause` (Idle, Hibernate) | suspends this controller made |
| `agent_sandbox_lifecycle_resumes_total` | counter | `cause` (Request, Manual, Other) | Suspended -> Running transitions seen, by the `resume-reason` the resumer wrote |
| `agent_sandbox_lifecycle_hibernations_total` | counter | `cause` (HibernateAfter, Requested) | Sandboxes archived |
| `agent_sandbox_lifecycle_restores_total` | counter | `cause` (Request, Manual) | archives restored |
| `agent_sandbox_lifecycle_resume_seconds` | histogram | `cause`, `from` (suspended, hibernated) | resume (or restore request) to Ready, as seen here |
| `agent_sandbox_lifecycle_activity_probes_total` | counter | `result` (idle, busy, unreachable) | runtime activity asked before an idle suspend |
| `agent_sandbox_lifecycle_hibernated_sandboxes` | gauge | `namespace` | archives in the cache at scrape time |

Resumes are counted from Sandbox events (whoever resumed: a router, the CLI, kubectl), once per transition
this process sees; transitions while no controller runs are not counted. The resume-on-request latency a
client waits is the router's `sandbox_router_resume_wait_seconds` (docs/router.md).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from agent_sandbox.api import constants as c
from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import is_ready, parse_time
from agent_sandbox.kube import Informer, Object
from agent_sandbox.kube.metrics import REGISTRY

__all__ = ["RESUME_BUCKETS", "LifecycleMetrics"]

RESUME_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300)


class LifecycleMetrics:
    """Counters and histograms in `registry`, plus the resume timers fed by Sandbox events."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.suspends = Counter(
            "agent_sandbox_lifecycle_suspends",
            "Sandboxes suspended by the lifecycle controller.",
            ["cause"],
            registry=registry,
        )
        self.resumes = Counter(
            "agent_sandbox_lifecycle_resumes",
            "Suspended Sandboxes seen resuming, by who resumed them.",
            ["cause"],
            registry=registry,
        )
        self.hibernations = Counter(
            "agent_sandbox_lifecycle_hibernations",
            "Suspended Sandboxes archived (hibernated).",
            ["cause"],
            registry=registry,
        )
        self.restores = Counter(
            "agent_sandbox_lifecycle_restores", "Hibernated Sandboxes restored.", ["cause"], registry=registry
        )
        self.resume_seconds = Histogram(
            "agent_sandbox_lifecycle_resume_seconds",
            "Time from a resume (or restore request) to the Sandbox being Ready.",
            ["cause", "from"],
            buckets=RESUME_BUCKETS,
            registry=registry,
        )
        self.probes = Counter(
            "agent_sandbox_lifecycle_activity_probes",
            "Runtime activity asked before an idle suspend, by result.",
            ["result"],
            registry=registry,
        )
        self._pending: dict[str, tuple[datetime, str, str]] = {}

    # ------------------------------------------------------------------ Sandbox events

    def restore_started(self, uid: str, requested_at: datetime, cause: lc.Cause) -> None:
        """A restore created Sandbox `uid`: time it until Ready."""
        self._pending[uid] = (requested_at, str(cause), "hibernated")

    def on_update(self, old: Object, new: Object, now: datetime) -> None:
        """Count Suspended -> Running transitions and time resumes until Ready."""
        uid = str((new.get("metadata") or {}).get("uid") or "")
        old_mode = (old.get("spec") or {}).get("operatingMode")
        new_mode = (new.get("spec") or {}).get("operatingMode") or c.OperatingMode.RUNNING
        if old_mode == c.OperatingMode.SUSPENDED and new_mode == c.OperatingMode.RUNNING:
            ann = (new.get("metadata") or {}).get("annotations") or {}
            old_ann = (old.get("metadata") or {}).get("annotations") or {}
            fresh = ann.get(lc.ANNOTATION_RESUMED_AT) and ann.get(lc.ANNOTATION_RESUMED_AT) != old_ann.get(
                lc.ANNOTATION_RESUMED_AT
            )
            cause = str(ann.get(lc.ANNOTATION_RESUME_REASON)) if fresh else str(lc.Cause.OTHER)
            self.resumes.labels(cause).inc()
            started = parse_time(ann.get(lc.ANNOTATION_RESUMED_AT)) if fresh else None
            self._pending[uid] = (started or now, cause, "suspended")
        if uid in self._pending and is_ready(new) and not is_ready(old):
            started, cause, source = self._pending.pop(uid)
            self.resume_seconds.labels(cause, source).observe(max((now - started).total_seconds(), 0.0))

    def on_delete(self, obj: Object) -> None:
        self._pending.pop(str((obj.get("metadata") or {}).get("uid") or ""), None)


class HibernatedCollector:
    """`agent_sandbox_lifecycle_hibernated_sandboxes`, counted from the archive informer at scrape time."""

    def __init__(self, archives: Informer) -> None:
        self._archives = archives

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "agent_sandbox_lifecycle_hibernated_sandboxes",
            "Hibernated Sandboxes (SandboxArchives), by namespace.",
            labels=["namespace"],
        )
        if self._archives.has_synced:
            counts = Tally(str((a.get("metadata") or {}).get("namespace", "")) for a in self._archives.list())
            for namespace, count in sorted(counts.items()):
                family.add_metric([namespace], count)
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())
