"""The `agent_sandboxes` gauge, computed from the Sandbox cache at every scrape (controllers spec §5.8).

Owns: label derivation per Sandbox (namespace, ready_condition, expired, launch_type, sandbox_template,
owned_by, created_by) and the aggregation into one sample per distinct label combination (no zero
samples). The collector reads the informer store synchronously: `/metrics` is rendered on the event-loop
thread, so the store cannot change underneath it. Before the Sandbox informer has synced, or if reading
fails, the scrape carries no `agent_sandboxes` samples (upstream: list with a 5 s timeout, nothing on
failure).

The other project metrics of §5.8 belong elsewhere: the claim latency histograms,
`agent_sandbox_creation_latency_ms` and `agent_sandbox_claim_creation_total` are recorded by the
SandboxClaim controller (§4.13); `agent_sandbox_build_info` by the process.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from agent_sandbox.api.constants import (
    ANNOTATION_SANDBOX_TEMPLATE_REF,
    CONDITION_READY,
    LABEL_CREATED_BY,
    LABEL_LAUNCH_TYPE,
    LAUNCH_TYPE_COLD,
    LAUNCH_TYPE_WARM,
    REASON_SANDBOX_EXPIRED,
)
from agent_sandbox.api.kinds import SANDBOX_CLAIM, SANDBOX_WARM_POOL
from agent_sandbox.api.meta import controlled_by, normalize_created_by, status_condition
from agent_sandbox.kube import Informer, Object
from agent_sandbox.kube.metrics import register_replacing

__all__ = ["SANDBOXES_METRIC", "SandboxCollector", "register_collector", "sandbox_metric_labels"]

log = logging.getLogger("agent_sandbox.controllers.sandbox")

SANDBOXES_METRIC = "agent_sandboxes"
_LABELS = (
    "namespace",
    "ready_condition",
    "expired",
    "launch_type",
    "sandbox_template",
    "owned_by",
    "created_by",
)


def sandbox_metric_labels(sandbox: Object) -> tuple[str, ...]:
    """The `agent_sandboxes` label values of one Sandbox, in `_LABELS` order."""
    meta: Mapping[str, Any] = sandbox.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    ready = status_condition(sandbox, CONDITION_READY)
    owned_by = "None"
    # Version-agnostic: pool members adopted before the v1beta1 upgrade still say v1alpha1.
    if controlled_by(sandbox, SANDBOX_CLAIM):
        owned_by = SANDBOX_CLAIM.kind
    elif controlled_by(sandbox, SANDBOX_WARM_POOL):
        owned_by = SANDBOX_WARM_POOL.kind
    return (
        meta.get("namespace") or "",
        "true" if ready is not None and ready.get("status") == "True" else "false",
        "true" if ready is not None and ready.get("reason") == REASON_SANDBOX_EXPIRED else "false",
        LAUNCH_TYPE_WARM if labels.get(LABEL_LAUNCH_TYPE) == LAUNCH_TYPE_WARM else LAUNCH_TYPE_COLD,
        annotations.get(ANNOTATION_SANDBOX_TEMPLATE_REF) or "unknown",
        owned_by,
        normalize_created_by(labels.get(LABEL_CREATED_BY)),
    )


class SandboxCollector:
    """Prometheus collector emitting `agent_sandboxes` from a Sandbox informer."""

    def __init__(self, informer: Informer) -> None:
        self._informer = informer

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Declared without samples so registration does not scrape (and never fails) early.
        yield GaugeMetricFamily(
            SANDBOXES_METRIC, "Number of Sandboxes per label combination.", labels=_LABELS
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            SANDBOXES_METRIC, "Number of Sandboxes per label combination.", labels=_LABELS
        )
        if self._informer.has_synced:
            try:
                counts = Counter(sandbox_metric_labels(s) for s in self._informer.list())
            except Exception:  # a malformed object must not break the whole scrape
                log.exception("agent_sandboxes: skipping this scrape")
                counts = Counter()
            for values, count in sorted(counts.items()):
                family.add_metric(list(values), float(count))
        yield family


def register_collector(registry: CollectorRegistry, informer: Informer) -> SandboxCollector:
    """Register (or re-register, replacing an earlier one in the same registry) the collector."""
    collector = SandboxCollector(informer)
    register_replacing(registry, SANDBOXES_METRIC, collector)
    return collector
