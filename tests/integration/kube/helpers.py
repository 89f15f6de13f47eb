"""Helpers for the kube integration tests (real cluster, no mocks)."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime
from typing import Any

from agent_sandbox.devcluster import DevCluster


def compact_etcd(cluster: DevCluster, revision: int) -> None:
    """Compact the cluster's etcd history up to `revision` (loopback, plain HTTP gRPC gateway).

    After this, watches and lists from older resourceVersions get 410 Gone from the API server.
    """
    port = cluster.state.ports["etcd_client"]
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v3/kv/compaction",
        data=json.dumps({"revision": str(revision), "physical": True}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def event_manifest(name: str, namespace: str) -> dict[str, Any]:
    """A minimal events.k8s.io/v1 Event about nothing in particular (a cheap, uncached object kind)."""
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name},
        "eventTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingController": "kube-tests",
        "reportingInstance": "kube-tests",
        "action": "Testing",
        "reason": "Test",
        "type": "Normal",
        "note": name,
        "regarding": {"kind": "ConfigMap", "name": name, "namespace": namespace, "apiVersion": "v1"},
    }
