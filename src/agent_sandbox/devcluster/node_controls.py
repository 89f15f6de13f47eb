"""The calls that change what a running dev cluster's fake nodes, pods and volumes report (docs/devcluster.md).

Owns: the guarded read-modify-write of a node or pod (`_patch_guarded`: merge patch under the object's
resourceVersion, conflicts retried), extra nodes (`add_node`, `delete_node`), cordon, taints and node
readiness, a pod's externally decided readiness (`set_pod_ready`), and the host directory behind a claim
(`volume_path`). The pure computations (taint lists, the Ready condition, the pod status patch) live in
simulation.py; `DevCluster` (cluster.py) inherits these calls.

Failure modes: `ClusterError` (no such object, the API refused the write, a node not Ready/NotReady in time).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_sandbox.devcluster.config import NOT_READY_LABEL, node_manifest
from agent_sandbox.devcluster.provisioner import volume_host_path
from agent_sandbox.devcluster.simulation import pod_readiness_status, ready_status, with_taint, without_taint
from agent_sandbox.devcluster.state import ClusterError, ClusterHandle


class ClusterControls(ClusterHandle):
    """Node, pod and volume simulations on a running cluster (a base of `DevCluster`)."""

    def _patch_guarded(
        self,
        path: str,
        what: str,
        change: Callable[[dict[str, Any]], dict[str, Any] | None],
        *,
        subresource: str = "",
    ) -> Any:
        """Merge-patch the object at `path` with `change(object)` under optimistic concurrency.

        `change` returns the patch (None: nothing to do); the object's resourceVersion guards it and
        conflicts are retried, so a concurrent writer (the node lifecycle controller adds taints too, kwok
        writes pod status) is never overwritten.
        """
        admin = self.admin()
        for _ in range(50):
            status, obj = admin.request("GET", path)
            if status != 200:
                raise ClusterError(f"{what}: HTTP {status}: {obj}")
            patch = change(obj)
            if patch is None:
                return obj
            patch.setdefault("metadata", {})["resourceVersion"] = obj["metadata"]["resourceVersion"]
            status, body = admin.request("PATCH", f"{path}/{subresource}" if subresource else path, patch)
            if status == 200:
                return body
            if status != 409:
                raise ClusterError(f"patching {what} failed: HTTP {status}: {body}")
        raise ClusterError(f"{what} kept changing; gave up after 50 conflicts")

    def _update_node(self, name: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> Any:
        """Merge-patch node `name` with `change(node)` (see `_patch_guarded`)."""
        return self._patch_guarded(f"/api/v1/nodes/{name}", f"node {name!r}", change)

    def add_node(self, name: str, *, timeout: float = 30.0) -> None:
        """Create one more kwok-managed node (capacity from the cluster's config) and wait until it is Ready.

        Not recorded in the state (`dev down` needs nothing: the node lives in etcd). Remove it with
        `delete_node`.
        """
        status, body = self.admin().request("POST", "/api/v1/nodes", node_manifest(name, self.config))
        if status != 201:
            raise ClusterError(f"creating node {name!r} failed: HTTP {status}: {body}")
        self._wait_ready(name, "True", timeout)

    def delete_node(self, name: str) -> None:
        """Delete a node (e.g. one made by `add_node`); pods bound to it are left to the pod GC."""
        status, body = self.admin().request("DELETE", f"/api/v1/nodes/{name}")
        if status not in (200, 404):
            raise ClusterError(f"deleting node {name!r} failed: HTTP {status}: {body}")

    def _wait_ready(self, name: str, want: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, node = self.admin().request("GET", f"/api/v1/nodes/{name}")
            if status == 200 and ready_status(node) == want:
                return
            time.sleep(0.1)
        raise ClusterError(f"node {name!r} did not report Ready={want} within {timeout:.0f}s")

    def cordon_node(self, name: str, cordoned: bool = True) -> None:
        """Mark the node unschedulable (`kubectl cordon`) or schedulable again (`cordoned=False`)."""
        self._update_node(name, lambda _: {"spec": {"unschedulable": True if cordoned else None}})

    def taint_node(self, name: str, key: str, value: str = "", effect: str = "NoSchedule") -> None:
        """Add (or replace) the taint key=value:effect on the node."""
        self._update_node(
            name,
            lambda node: {
                "spec": {"taints": with_taint(node.get("spec", {}).get("taints") or [], key, value, effect)}
            },
        )

    def untaint_node(self, name: str, key: str, effect: str | None = None) -> None:
        """Remove the node's taints with `key` (only those with `effect`, when given)."""

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            taints = node.get("spec", {}).get("taints") or []
            kept = without_taint(taints, key, effect)
            return None if len(kept) == len(taints) else {"spec": {"taints": kept or None}}

        self._update_node(name, change)

    def set_node_ready(self, name: str, ready: bool, *, wait: bool = True, timeout: float = 30.0) -> None:
        """Simulate a node failure (`ready=False`) or recovery; waits until the Ready condition agrees.

        NotReady is the node label `devcluster.agents.x-k8s.io/not-ready`: kwok's heartbeat skips labelled
        nodes and a stage writes Ready=False, so it sticks until `set_node_ready(name, True)`.
        """
        self._update_node(
            name, lambda _: {"metadata": {"labels": {NOT_READY_LABEL: None if ready else "true"}}}
        )
        if wait:
            self._wait_ready(name, "True" if ready else "False", timeout)

    def set_pod_ready(self, namespace: str, name: str, ready: bool) -> dict[str, Any]:
        """Report a Running pod's containers ready (or not), as a kubelet does when a readiness probe flips.

        For pods whose readiness kwok leaves alone (annotation `devcluster.agents.x-k8s.io/readiness:
        external`, see docs/devcluster.md "Pod start"): e.g. a local runner calls this once the pod's
        server answers. The status write is guarded by the pod's resourceVersion (conflicts are retried).

        Raises:
            ClusterError: no such pod, it is not Running, or the API refused the write.
        """

        def readiness(pod: dict[str, Any]) -> dict[str, Any]:
            try:
                return {"status": pod_readiness_status(pod, ready)}
            except ValueError as exc:
                raise ClusterError(str(exc)) from None

        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        result: dict[str, Any] = self._patch_guarded(
            path, f"pod {namespace}/{name}", readiness, subresource="status"
        )
        return result

    def volume_path(self, namespace: str, claim: str) -> Path | None:
        """Host directory backing the PVC `namespace/claim`, None while it is unbound."""
        admin = self.admin()
        status, pvc = admin.request("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        volume = pvc.get("spec", {}).get("volumeName") if status == 200 else None
        if not volume:
            return None
        status, pv = admin.request("GET", f"/api/v1/persistentvolumes/{volume}")
        if status != 200:
            return None
        raw = volume_host_path(pv)
        return Path(raw) if raw else None
