"""Local Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, built from the official Go modules and run as plain processes."""

from agent_sandbox.devcluster.binaries import (
    ETCD_VERSION,
    HELM_VERSION,
    KUBERNETES_VERSION,
    KWOK_VERSION,
    BuildError,
    ensure_binaries,
)
from agent_sandbox.devcluster.cluster import DevCluster
from agent_sandbox.devcluster.config import ClusterConfig
from agent_sandbox.devcluster.processes import ComponentError
from agent_sandbox.devcluster.state import ClusterError

__all__ = [
    "ETCD_VERSION",
    "HELM_VERSION",
    "KUBERNETES_VERSION",
    "KWOK_VERSION",
    "BuildError",
    "ClusterConfig",
    "ClusterError",
    "ComponentError",
    "DevCluster",
    "ensure_binaries",
]
