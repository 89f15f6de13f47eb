"""Cluster and controller settings of a benchmark run; the defaults are the upstream KWOK scalability gate.

Owns: `Tuning`, the control plane and controller settings of the upstream KWOK scalability gate (operations
spec §9.8: 100 kwok nodes, kube-apiserver in-flight 2000 / mutating 1000, etcd without fsync, controller
QPS 1000 / burst 2000, sandbox and claim workers 50, warm-pool batch 300), and how they become the dev
cluster's `ClusterConfig` and the controller's flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent_sandbox.devcluster import ClusterConfig
from agent_sandbox.devcluster.config import KWOK_POD_PARALLELISM, POD_DELETION_INSTANT

__all__ = ["Tuning"]


@dataclass(frozen=True, slots=True)
class Tuning:
    """Cluster and controller settings; defaults reproduce the upstream KWOK gate (§9.8)."""

    nodes: int = 100
    max_requests_inflight: int = 2000
    max_mutating_requests_inflight: int = 1000
    etcd_unsafe_no_fsync: bool = True
    scheduler_qps: float = 500.0
    scheduler_burst: int = 1000
    controller_manager_qps: float = 500.0
    controller_manager_burst: int = 1000
    kube_api_qps: int = 1000
    kube_api_burst: int = 2000
    sandbox_workers: int = 50
    claim_workers: int = 50
    warm_pool_workers: int = 1
    warm_pool_batch: int = 300
    extra_flags: tuple[str, ...] = ()
    # False: mark v1alpha1 `served: false` on the four CRDs before measuring, as upstream's kOps benchmark
    # does. While both are served the API server sends object changes through the conversion webhook in
    # sustained runs (~3% of the CPU per claim there; none seen in a burst), see docs/performance.md.
    serve_v1alpha1: bool = True
    # Serve kube-apiserver's pprof so a phase can profile it (`apiserver_profile`).
    apiserver_profiling: bool = False
    # Pods start at once: the KWOK gate runs kwok's instant pod-ready stage, so the benchmarks measure the
    # controller, not a simulated container start (the dev cluster's default is ~1 s, docs/devcluster.md).
    pod_start_delay_ms: int = 0
    pod_start_jitter_ms: int = 0
    # Deleted pods are removed at once, as the KWOK gate's kwok (fast pod-delete stage) does: one DELETE. The dev
    # cluster's default, "graceful", adds a kubelet's NotReady, terminate-at and terminated writes per deleted
    # pod (~13 % of the API server's CPU per claim cycle, docs/performance.md). docs/devcluster.md.
    pod_deletion: str = POD_DELETION_INSTANT
    # kwok's pod stage workers: its default 4, as kwokctl runs the KWOK gate (docs/devcluster.md).
    kwok_pod_parallelism: int = KWOK_POD_PARALLELISM
    # Another controller binary in place of ours (upstream's Go controller, same flags) for a same-machine A/B;
    # it serves no conversion webhook, so v1alpha1 is unserved whatever serve_v1alpha1 says.
    controller_binary: str = ""

    def cluster_config(self, name: str) -> ClusterConfig:
        return ClusterConfig(
            name=name,
            nodes=self.nodes,
            max_requests_inflight=self.max_requests_inflight,
            max_mutating_requests_inflight=self.max_mutating_requests_inflight,
            etcd_unsafe_no_fsync=self.etcd_unsafe_no_fsync,
            scheduler_qps=self.scheduler_qps,
            scheduler_burst=self.scheduler_burst,
            controller_manager_qps=self.controller_manager_qps,
            controller_manager_burst=self.controller_manager_burst,
            apiserver_profiling=self.apiserver_profiling,
            pod_start_delay_ms=self.pod_start_delay_ms,
            pod_start_jitter_ms=self.pod_start_jitter_ms,
            pod_deletion=self.pod_deletion,
            kwok_pod_parallelism=self.kwok_pod_parallelism,
        )

    def controller_flags(self) -> tuple[str, ...]:
        return (
            f"--kube-api-qps={self.kube_api_qps}",
            f"--kube-api-burst={self.kube_api_burst}",
            f"--sandbox-concurrent-workers={self.sandbox_workers}",
            f"--sandbox-claim-concurrent-workers={self.claim_workers}",
            f"--sandbox-warm-pool-concurrent-workers={self.warm_pool_workers}",
            f"--sandbox-warm-pool-max-batch-size={self.warm_pool_batch}",
            *self.extra_flags,
        )
