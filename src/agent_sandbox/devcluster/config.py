"""Knobs of one dev cluster and the files it writes (kubeconfigs, scheduler config, kwok stages).

Owns: `ClusterConfig` (defaults for tests, tunables for benchmarks) and rendering of the static files the
components read. Nothing here starts a process.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

# The dev cluster's Service range. ClusterIPs are only ever allocated, never dialled: there is no
# kube-proxy, and every component and webhook is reached through a loopback URL.
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
NODE_ANNOTATION = "kwok.x-k8s.io/node"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Everything `dev up` can tune. Defaults suit tests; benchmarks raise limits and nodes."""

    name: str = "default"
    nodes: int = 1
    node_cpu: str = "32"
    node_memory: str = "256Gi"
    node_pods: int = 1100
    max_requests_inflight: int = 800
    max_mutating_requests_inflight: int = 400
    etcd_unsafe_no_fsync: bool = True
    scheduler_qps: float = 200.0
    scheduler_burst: int = 400
    controller_manager_qps: float = 200.0
    controller_manager_burst: int = 400
    kwok_qps: float = 500.0
    kwok_burst: int = 1000
    # Bound for each component to become ready, in seconds.
    ready_timeout: float = 90.0
    # Time kwok keeps a deleted pod Terminating before removing it (the pod's grace period caps it).
    pod_delete_delay_ms: int = 1000


def kubeconfig_yaml(*, name: str, server: str, ca: Path, cert: Path, key: Path, user: str) -> str:
    """Render a one-context kubeconfig with file references (readable by kubectl and client libraries)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
        "preferences": {},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def scheduler_config_yaml(kubeconfig: Path, cfg: ClusterConfig) -> str:
    """KubeSchedulerConfiguration: client QPS/burst only apply through the config file."""
    doc = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {
            "kubeconfig": str(kubeconfig),
            "qps": cfg.scheduler_qps,
            "burst": cfg.scheduler_burst,
        },
        "leaderElection": {"leaderElect": False},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def kwok_stages_yaml(cfg: ClusterConfig) -> str:
    """The kwok Stage documents the dev cluster runs (see docs/devcluster.md for each behaviour)."""
    docs: list[str] = []
    stage_dir = resources.files("agent_sandbox.devcluster") / "stages"
    for entry in sorted(stage_dir.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            text = entry.read_text()
            if entry.name == "pod-delete.yaml":
                text = text.replace(
                    "durationMilliseconds: 1000", f"durationMilliseconds: {cfg.pod_delete_delay_ms}"
                )
            docs.append(text.strip())
    return "\n---\n".join(docs) + "\n"


def node_manifest(name: str, cfg: ClusterConfig) -> dict[str, object]:
    """A fake Node that kwok manages; capacity makes scheduling pressure real."""
    capacity = {"cpu": cfg.node_cpu, "memory": cfg.node_memory, "pods": str(cfg.node_pods)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/role": "agent",
                "node-role.kubernetes.io/agent": "",
                "type": "kwok",
            },
        },
        "spec": {},
        "status": {"allocatable": capacity, "capacity": capacity},
    }
