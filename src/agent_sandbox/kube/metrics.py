"""Framework metrics and the process-wide Prometheus registry (controllers spec §5.8, operations §8).

Owns: `REGISTRY` (the equivalent of controller-runtime's `metrics.Registry`; project metrics register here
too so one `/metrics` endpoint serves everything) and the framework families with controller-runtime /
client-go names, labels and buckets:

* REST client: `rest_client_requests_total{code,method,host}`,
  `rest_client_request_duration_seconds{verb,host}`.
* Work queue: `workqueue_depth`, `workqueue_adds_total`, `workqueue_queue_duration_seconds`,
  `workqueue_work_duration_seconds`, `workqueue_unfinished_work_seconds`,
  `workqueue_longest_running_processor_seconds`, `workqueue_retries_total` (labels `name`, `controller`).
* Reconciles: `controller_runtime_reconcile_total{controller,result}`,
  `controller_runtime_reconcile_errors_total`, `controller_runtime_terminal_reconcile_errors_total`,
  `controller_runtime_reconcile_panics_total`, `controller_runtime_reconcile_time_seconds`,
  `controller_runtime_max_concurrent_reconciles`, `controller_runtime_active_workers`.
* Leader election: `leader_election_master_status{name}`.
* Process and platform collectors (`process_*`, `python_*`).

Families are created once at import; hot paths cache the labelled children so a sample costs one
attribute lookup and an addition.
"""

from __future__ import annotations

import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

# Go's client_golang exposes no `*_created` series; match the upstream /metrics surface exactly.
disable_created_metrics()  # type: ignore[no-untyped-call]

__all__ = [
    "CONTROLLER_ACTIVE_WORKERS",
    "CONTROLLER_MAX_CONCURRENT",
    "LEADER_ELECTION_STATUS",
    "RECONCILE_ERRORS",
    "RECONCILE_PANICS",
    "RECONCILE_TERMINAL_ERRORS",
    "RECONCILE_TIME",
    "RECONCILE_TOTAL",
    "REGISTRY",
    "REST_CLIENT_DURATION",
    "REST_CLIENT_REQUESTS",
    "WEBHOOK_IN_FLIGHT",
    "WEBHOOK_LATENCY",
    "WEBHOOK_REQUESTS",
    "WORKQUEUE_ADDS",
    "WORKQUEUE_DEPTH",
    "WORKQUEUE_LONGEST_RUNNING",
    "WORKQUEUE_QUEUE_DURATION",
    "WORKQUEUE_RETRIES",
    "WORKQUEUE_UNFINISHED_WORK",
    "WORKQUEUE_WORK_DURATION",
    "register_replacing",
]

REGISTRY = CollectorRegistry(auto_describe=True)
"""The registry served at `/metrics`. Register project metrics with `registry=REGISTRY`."""

# The default collectors are bound to the global registry; build our own instances for ours.
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

# client-go's request latency buckets (k8s.io/component-base/metrics/prometheus/restclient).
_REST_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
# controller-runtime workqueue: prometheus.ExponentialBuckets(10e-9, 10, 12).
_WQ_BUCKETS = tuple(10e-9 * 10**i for i in range(12))
# controller-runtime reconcile time buckets.
_RECONCILE_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
    1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60,
)  # fmt: skip

REST_CLIENT_REQUESTS = Counter(
    "rest_client_requests",
    "Number of HTTP requests, partitioned by status code, method, and host.",
    ["code", "method", "host"],
    registry=REGISTRY,
)
REST_CLIENT_DURATION = Histogram(
    "rest_client_request_duration_seconds",
    "Request latency in seconds. Broken down by verb, and host.",
    ["verb", "host"],
    buckets=_REST_BUCKETS,
    registry=REGISTRY,
)

# controller-runtime's webhook metrics (pkg/webhook/internal/metrics), for the conversion webhook: every
# replica serves it, and without them a failing conversion was invisible to an SRE (until December 6).
WEBHOOK_REQUESTS = Counter(
    "controller_runtime_webhook_requests_total",
    "Total number of admission requests by HTTP status code.",
    ["webhook", "code"],
    registry=REGISTRY,
)
WEBHOOK_LATENCY = Histogram(
    "controller_runtime_webhook_latency_seconds",
    "Histogram of the latency of processing admission requests",
    ["webhook"],
    registry=REGISTRY,
)
WEBHOOK_IN_FLIGHT = Gauge(
    "controller_runtime_webhook_requests_in_flight",
    "Current number of admission requests being served.",
    ["webhook"],
    registry=REGISTRY,
)

_WQ_LABELS = ["name", "controller"]
WORKQUEUE_DEPTH = Gauge("workqueue_depth", "Current depth of workqueue", _WQ_LABELS, registry=REGISTRY)
WORKQUEUE_ADDS = Counter(
    "workqueue_adds", "Total number of adds handled by workqueue", _WQ_LABELS, registry=REGISTRY
)
WORKQUEUE_QUEUE_DURATION = Histogram(
    "workqueue_queue_duration_seconds",
    "How long in seconds an item stays in workqueue before being requested",
    _WQ_LABELS,
    buckets=_WQ_BUCKETS,
    registry=REGISTRY,
)
WORKQUEUE_WORK_DURATION = Histogram(
    "workqueue_work_duration_seconds",
    "How long in seconds processing an item from workqueue takes.",
    _WQ_LABELS,
    buckets=_WQ_BUCKETS,
    registry=REGISTRY,
)
WORKQUEUE_UNFINISHED_WORK = Gauge(
    "workqueue_unfinished_work_seconds",
    "How many seconds of work has been done that is in progress and hasn't been observed by "
    "work_duration. Large values indicate stuck threads.",
    _WQ_LABELS,
    registry=REGISTRY,
)
WORKQUEUE_LONGEST_RUNNING = Gauge(
    "workqueue_longest_running_processor_seconds",
    "How many seconds has the longest running processor for workqueue been running.",
    _WQ_LABELS,
    registry=REGISTRY,
)
WORKQUEUE_RETRIES = Counter(
    "workqueue_retries", "Total number of retries handled by workqueue", _WQ_LABELS, registry=REGISTRY
)

RECONCILE_TOTAL = Counter(
    "controller_runtime_reconcile",
    "Total number of reconciliations per controller",
    ["controller", "result"],
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors",
    "Total number of reconciliation errors per controller",
    ["controller"],
    registry=REGISTRY,
)
RECONCILE_TERMINAL_ERRORS = Counter(
    "controller_runtime_terminal_reconcile_errors",
    "Total number of terminal reconciliation errors per controller",
    ["controller"],
    registry=REGISTRY,
)
RECONCILE_PANICS = Counter(
    "controller_runtime_reconcile_panics",
    "Total number of reconciliation panics per controller",
    ["controller"],
    registry=REGISTRY,
)
RECONCILE_TIME = Histogram(
    "controller_runtime_reconcile_time_seconds",
    "Length of time per reconciliation per controller",
    ["controller"],
    buckets=_RECONCILE_BUCKETS,
    registry=REGISTRY,
)
CONTROLLER_MAX_CONCURRENT = Gauge(
    "controller_runtime_max_concurrent_reconciles",
    "Maximum number of concurrent reconciles per controller",
    ["controller"],
    registry=REGISTRY,
)
CONTROLLER_ACTIVE_WORKERS = Gauge(
    "controller_runtime_active_workers",
    "Number of currently used workers per controller",
    ["controller"],
    registry=REGISTRY,
)
LEADER_ELECTION_STATUS = Gauge(
    "leader_election_master_status",
    "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates "
    "master. 'name' is the string used to identify the lease. Please make sure to group by name.",
    ["name"],
    registry=REGISTRY,
)


# Weakly keyed by the registry itself: keyed by id(), a registry collected and a new one allocated at the
# same address would find (and try to unregister) a collector it never held.
_slots: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Collector]] = weakref.WeakKeyDictionary()


def register_replacing(registry: CollectorRegistry, slot: str, collector: Collector) -> None:
    """Register `collector` in `registry` as `slot`, unregistering what an earlier call put in that slot.

    For collectors bound to objects a process may build more than once (a manager re-created after a lost
    lease, the tests' managers on the shared registry): the newest one answers, none is registered twice.
    """
    slots = _slots.setdefault(registry, {})
    previous = slots.pop(slot, None)
    if previous is not None:
        registry.unregister(previous)
    registry.register(collector)
    slots[slot] = collector
