"""The local control plane behaves like a real cluster (issue: foundation)."""

from __future__ import annotations

import json
import ssl
import urllib.request
import uuid
from typing import Any

import pytest

from agent_sandbox.devcluster import ClusterConfig, DevCluster
from agent_sandbox.devcluster.processes import is_ours
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def _get(cluster: DevCluster, path: str) -> Any:
    status, body = cluster.admin().request("GET", path)
    return body if status == 200 else None


def test_pod_is_scheduled_to_a_kwok_node_and_runs_with_a_loopback_ip(
    cluster: DevCluster, namespace: str
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    status, body = cluster.admin().request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    assert status == 201, body

    def running() -> Any:
        got = _get(cluster, f"/api/v1/namespaces/{namespace}/pods/hello")
        return got if got and got["status"].get("phase") == "Running" and got["status"].get("podIP") else None

    got = wait_for(running, what="pod Running with an IP")
    assert got["spec"]["nodeName"] in cluster.state.nodes
    assert got["status"]["podIP"].startswith("127.")
    ready = {c["type"]: c["status"] for c in got["status"]["conditions"]}
    assert ready["Ready"] == "True"


def test_deleting_an_owner_garbage_collects_dependents(cluster: DevCluster, namespace: str) -> None:
    admin = cluster.admin()
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    status, owner = admin.request("POST", base, {"metadata": {"name": "owner"}})
    assert status == 201
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    status, _ = admin.request("POST", base, {"metadata": {"name": "child", "ownerReferences": [ref]}})
    assert status == 201
    assert admin.request("DELETE", f"{base}/owner")[0] == 200
    wait_for(lambda: admin.request("GET", f"{base}/child")[0] == 404, what="dependent garbage-collected")


def _as_token(cluster: DevCluster, token: str, path: str) -> int:
    ctx = ssl.create_default_context(cafile=str(cluster.directory / "pki" / "ca.crt"))
    req = urllib.request.Request(cluster.server + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_rbac_denies_without_binding_and_allows_with_it(cluster: DevCluster, namespace: str) -> None:
    admin = cluster.admin()
    ns_path = f"/api/v1/namespaces/{namespace}"
    assert admin.request("POST", f"{ns_path}/serviceaccounts", {"metadata": {"name": "reader"}})[0] == 201
    status, tr = admin.request(
        "POST", f"{ns_path}/serviceaccounts/reader/token", {"spec": {"expirationSeconds": 600}}
    )
    assert status == 201, tr
    token = tr["status"]["token"]
    assert _as_token(cluster, token, f"{ns_path}/configmaps") == 403

    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    role = {
        "metadata": {"name": "cm-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get"]}],
    }
    assert admin.request("POST", f"{rbac}/roles", role)[0] == 201
    binding = {
        "metadata": {"name": "cm-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    }
    assert admin.request("POST", f"{rbac}/rolebindings", binding)[0] == 201
    wait_for(lambda: _as_token(cluster, token, f"{ns_path}/configmaps") == 200, what="RBAC to allow")


def test_crd_object_can_be_created_watched_and_status_patched(cluster: DevCluster, namespace: str) -> None:
    group = f"g{uuid.uuid4().hex[:8]}.example.com"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                                "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                            },
                        }
                    },
                }
            ],
        },
    }
    admin = cluster.admin()
    crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    assert admin.request("POST", crd_path, crd)[0] == 201
    try:

        def established() -> bool:
            got = _get(cluster, f"{crd_path}/widgets.{group}")
            conds = {
                c["type"]: c["status"] for c in ((got or {}).get("status") or {}).get("conditions") or []
            }
            return conds.get("Established") == "True"

        wait_for(established, what="CRD Established")
        base = f"/apis/{group}/v1/namespaces/{namespace}/widgets"
        wait_for(lambda: admin.request("GET", base)[0] == 200, what="CRD served")
        status, created = admin.request(
            "POST",
            base,
            {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 1}},
        )
        assert status == 201, created
        rv = created["metadata"]["resourceVersion"]

        # Status is a subresource: a patch of the main resource ignores it, the /status patch applies it.
        admin.request("PATCH", f"{base}/w", {"status": {"phase": "Ignored"}})
        assert (_get(cluster, f"{base}/w") or {}).get("status", {}).get("phase") is None
        status, patched = admin.request("PATCH", f"{base}/w/status", {"status": {"phase": "Ready"}})
        assert status == 200, patched
        assert patched["status"]["phase"] == "Ready"

        ctx = admin._context()
        url = f"{cluster.server}{base}?watch=1&resourceVersion={rv}&timeoutSeconds=5"
        with urllib.request.urlopen(url, context=ctx, timeout=15) as resp:
            first = json.loads(resp.readline())
        assert first["type"] == "MODIFIED"
        assert first["object"]["status"]["phase"] == "Ready"
    finally:
        admin.request("DELETE", f"{crd_path}/widgets.{group}")


def test_down_leaves_no_process_and_no_data_dir() -> None:
    cluster = DevCluster.up(ClusterConfig(name=f"down-{uuid.uuid4().hex[:6]}", nodes=1))
    started = cluster.state.started
    assert {s.name for s in started} == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "volume-provisioner",
        "runner",
    }
    assert all(is_ours(s.pid, s.exe) for s in started)
    cluster.down()
    assert not any(is_ours(s.pid, s.exe) for s in started)
    assert not cluster.directory.exists()
    assert DevCluster.load(cluster.name) is None
