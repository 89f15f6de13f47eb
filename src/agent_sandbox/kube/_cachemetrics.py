"""`agent_sandbox_cached_objects{resource}`: how many objects each informer of the manager's cache holds.

Not an upstream metric (controller-runtime has none like it); ours because the controller's memory follows
what it caches: a soak reads RSS against these counts (Terminating Pods and cold backlog included), and an
operator sizing the controller for N Sandboxes reads what N costs. Computed on scrape from the stores, so
it costs nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily

from ._cache import Cache
from ._resources import ResourceKind

__all__ = ["CACHED_OBJECTS_METRIC", "CachedObjectsCollector", "cached_resource_label"]

CACHED_OBJECTS_METRIC = "agent_sandbox_cached_objects"
_HELP = "Objects held by the controller's informer cache, per resource (plural.group)."


def cached_resource_label(kind: ResourceKind) -> str:
    """The `resource` label of `kind`: "plural.group", or the plural alone for the core group."""
    return f"{kind.plural}.{kind.group}" if kind.group else kind.plural


class CachedObjectsCollector:
    """Prometheus collector over a `Cache`: one sample per informer created so far."""

    def __init__(self, cache: Cache) -> None:
        self._cache = cache

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Declared without samples so registration does not scrape.
        yield GaugeMetricFamily(CACHED_OBJECTS_METRIC, _HELP, labels=["resource"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(CACHED_OBJECTS_METRIC, _HELP, labels=["resource"])
        for kind, informer in sorted(self._cache.informers.items(), key=lambda kv: kv[0].plural):
            family.add_metric([cached_resource_label(kind)], float(len(informer)))
        yield family
