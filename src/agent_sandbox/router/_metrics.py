"""The router's Prometheus metrics (router spec §1.14): same names, types, labels and buckets as upstream.

Owns: a private registry per `RouterMetrics` (served on the metrics listener), the metric objects, and
cached label children so the per-request cost is a dict lookup plus an increment. No per-sandbox-ID
label exists by design (unbounded cardinality). The namespace label is a header's value, so it is bounded
here (ours; upstream's Go router takes any): a namespace is named once a request to it was resolved to a
sandbox (authorized, and the Pod cache's checks passed), up to `MAX_NAMESPACES`; before that, and past the
bound, it is `-` (the spec's "unknown"). Request-scoped counts (authorization verdicts included) are taken
when the request ends, so a namespace's first request is named too. Until December 6
any client could add series at will with random `X-Sandbox-Namespace` values - refused requests included -
until a scrape took seconds and stalled the router's event loop (proxying and probes) with it.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..kube.buildinfo import build_info

__all__ = ["DURATION_BUCKETS", "MAX_NAMESPACES", "RESUME_BUCKETS", "RouterMetrics", "method_label"]

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180)
RESUME_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 180)
MAX_NAMESPACES = 1000
"""Namespaces named in labels (more than any one router serves sandboxes in)."""
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})


def method_label(method: str) -> str:
    """The `method` label: standard methods as sent, anything else "other" (bounded cardinality)."""
    return method if method in _METHODS else "other"


class RouterMetrics:
    """Every router metric, registered in `self.registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "sandbox_router_requests_total",
            "Requests handled by the proxy listener.",
            ["method", "code", "sandbox_namespace"],
            registry=r,
        )
        self.duration = Histogram(
            "sandbox_router_request_duration_seconds",
            "Time from request headers to the end of the response (upgrades: connection lifetime).",
            ["method", "code", "sandbox_namespace"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge(
            "sandbox_router_inflight_requests", "Requests currently being proxied.", registry=r
        )
        self.upstream_errors = Counter(
            "sandbox_router_upstream_errors_total",
            "Failed upstream exchanges by reason (dial, timeout, tls, eof, other).",
            ["sandbox_namespace", "reason"],
            registry=r,
        )
        self.upstream_retries = Counter(
            "sandbox_router_upstream_retries_total",
            "Retried upstream dials.",
            ["sandbox_namespace"],
            registry=r,
        )
        self.cache_invalidations = Counter(
            "sandbox_router_cache_invalidations_total",
            "Pod cache entries evicted after a dial to a dead host.",
            ["sandbox_namespace"],
            registry=r,
        )
        self.authz_decisions = Counter(
            "sandbox_router_authz_decisions_total",
            "Authorization verdicts.",
            ["sandbox_namespace", "decision"],
            registry=r,
        )
        self.cert_reloads = Counter(
            "sandbox_router_cert_reloads_total",
            "Serving certificate reloads by outcome.",
            ["outcome"],
            registry=r,
        )
        # Ours (docs/lifecycle.md), only with --sandbox-lifecycle.
        self.lifecycle_resumes = Counter(
            "sandbox_router_lifecycle_resumes_total",
            "Resumes this router caused on request: resumed, restored (archive), joined (another resumer wrote).",
            ["sandbox_namespace", "result"],
            registry=r,
        )
        self.resume_wait = Histogram(
            "sandbox_router_resume_wait_seconds",
            "Time a request was held while its Sandbox resumed, by outcome (ready, failed, timeout).",
            ["sandbox_namespace", "outcome"],
            buckets=RESUME_BUCKETS,
            registry=r,
        )
        self.activity_writes = Counter(
            "sandbox_router_lifecycle_activity_writes_total",
            "Coalesced last-activity annotation writes, by result (ok, error).",
            ["sandbox_namespace", "result"],
            registry=r,
        )
        # Ours (docs/router.md): the router out of file descriptors, on accepting a client or dialling.
        self.fd_exhaustion = Counter(
            "sandbox_router_fd_exhaustion_total",
            "Connections refused because the router ran out of file descriptors, by side (accept, dial).",
            ["side"],
            registry=r,
        )
        info = build_info()
        build = Gauge("sandbox_router_build_info", "Build information.", list(info), registry=r)
        build.labels(**info).set(1)
        self._request_children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._namespaces: set[str] = set()

    def admit_namespace(self, namespace: str) -> None:
        """A request to `namespace` was resolved to a sandbox: labels name it from now on (up to the bound)."""
        if namespace not in self._namespaces and len(self._namespaces) < MAX_NAMESPACES:
            self._namespaces.add(namespace)

    def _ns(self, namespace: str) -> str:
        return namespace if namespace in self._namespaces else "-"

    def observe_request(self, method: str, code: int, namespace: str, seconds: float) -> None:
        """Count one finished request and record its duration."""
        key = (method, str(code), self._ns(namespace))
        pair = self._request_children.get(key)
        if pair is None:
            label = (method_label(method), key[1], key[2])
            pair = self._request_children[key] = (
                self.requests.labels(*label),
                self.duration.labels(*label),
            )
        pair[0].inc()
        pair[1].observe(seconds)

    def _child(self, metric: Any, labels: tuple[str, ...]) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def upstream_error(self, namespace: str, reason: str) -> None:
        self._child(self.upstream_errors, (self._ns(namespace), reason)).inc()

    def upstream_retry(self, namespace: str) -> None:
        self._child(self.upstream_retries, (self._ns(namespace),)).inc()

    def cache_invalidation(self, namespace: str) -> None:
        self._child(self.cache_invalidations, (self._ns(namespace),)).inc()

    def authz_decision(self, namespace: str, allowed: bool) -> None:
        self._child(self.authz_decisions, (self._ns(namespace), "allow" if allowed else "deny")).inc()

    def lifecycle_resume(self, namespace: str, result: str) -> None:
        self._child(self.lifecycle_resumes, (self._ns(namespace), result)).inc()

    def lifecycle_resume_wait(self, namespace: str, outcome: str, seconds: float) -> None:
        self._child(self.resume_wait, (self._ns(namespace), outcome)).observe(seconds)

    def lifecycle_activity_write(self, namespace: str, ok: bool) -> None:
        self._child(self.activity_writes, (self._ns(namespace), "ok" if ok else "error")).inc()

    def fd_exhausted(self, side: str) -> None:
        self._child(self.fd_exhaustion, (side,)).inc()

    def cert_reload(self, ok: bool) -> None:
        self._child(self.cert_reloads, ("success" if ok else "failure",)).inc()
