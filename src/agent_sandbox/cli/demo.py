"""`make demo`: the README journey on a local cluster (grows as capabilities land).

Idempotent: a running demo cluster is reused, so `make demo` twice in a row works.
"""

from __future__ import annotations

import sys

from agent_sandbox.devcluster import ClusterConfig, DevCluster


def _say(msg: str) -> None:
    print(msg, flush=True)


def ensure_cluster(name: str) -> DevCluster:
    """The running cluster `name`, or a freshly started one."""
    cluster = DevCluster.load(name)
    if cluster is not None and all(cluster.running().values()):
        _say(f"reusing running cluster {name!r}")
        return cluster
    return DevCluster.up(ClusterConfig(name=name, nodes=2))


def run_demo(*, name: str = "demo") -> int:
    cluster = ensure_cluster(name)
    _say(cluster.describe())
    nodes = cluster.kubectl("get", "nodes", "-o", "wide")
    _say(nodes.stdout or nodes.stderr)
    _say(f"KUBECONFIG={cluster.kubeconfig} kubectl get nodes")
    _say(f"stop it with: .venv/bin/agent-sandbox dev down --name {name}")
    return 0 if nodes.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(run_demo())
