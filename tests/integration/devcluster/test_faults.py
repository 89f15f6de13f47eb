"""Restarting etcd and kube-apiserver in place (devcluster/faults.py), and the audit log that counts writes.

Runs on the fault cluster (its own control plane, audit log on), never on the shared `cluster`.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

import pytest

from agent_sandbox.devcluster import ClusterError, DevCluster
from agent_sandbox.devcluster.audit import AuditLog
from agent_sandbox.devcluster.faults import restart_component
from agent_sandbox.devcluster.processes import is_ours
from tests.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("faults")]


def _as_token(cluster: DevCluster, token: str, path: str) -> int:
    ctx = ssl.create_default_context(cafile=str(cluster.directory / "pki" / "ca.crt"))
    req = urllib.request.Request(cluster.server + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


def test_restart_in_place_keeps_data_ports_and_credentials(
    fault_cluster: DevCluster, fault_namespace: str
) -> None:
    cluster, ns = fault_cluster, fault_namespace
    admin = cluster.admin()
    audit = AuditLog(cluster.audit_log)
    mark = audit.mark()
    cms = f"/api/v1/namespaces/{ns}/configmaps"
    assert admin.request("POST", cms, {"metadata": {"name": "before"}})[0] == 201
    status, tr = admin.request(
        "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/default/token", {"spec": {"expirationSeconds": 600}}
    )
    assert status == 201, tr
    token = tr["status"]["token"]
    assert _as_token(cluster, token, f"{cms}/before") == 403  # authenticated (RBAC says no), not 401

    etcd = restart_component(cluster, "etcd", kill=True)
    assert etcd.new.pid != etcd.old_pid
    assert not is_ours(etcd.old_pid, etcd.new.exe)
    wait_for(
        lambda: admin.request("GET", f"{cms}/before")[0] == 200, what="data read back after etcd restart"
    )

    api = restart_component(cluster, "kube-apiserver")
    assert api.new.pid != api.old_pid
    assert cluster.server == DevCluster.load(cluster.name).server  # type: ignore[union-attr]  # same URL
    assert admin.request("GET", f"{cms}/before")[0] == 200
    assert _as_token(cluster, token, f"{cms}/before") == 403  # token still valid (same signing key)
    assert admin.request("POST", cms, {"metadata": {"name": "after"}})[0] == 201

    # The recorded state follows the new processes, so `down` stops them (and not the dead PIDs).
    recorded = {s.name: s.pid for s in DevCluster.load(cluster.name).state.started}  # type: ignore[union-attr]
    assert recorded["etcd"] == etcd.new.pid
    assert recorded["kube-apiserver"] == api.new.pid

    # The audit log spans the restart: both creates, attributed to the admin certificate.
    creates = [
        (e.name, e.code)
        for e in audit.since(mark)
        if (e.verb, e.resource, e.namespace, e.user) == ("create", "configmaps", ns, "admin")
    ]
    assert creates == [("before", 201), ("after", 201)]


def test_restart_refuses_unknown_and_stopped_components(fault_cluster: DevCluster) -> None:
    with pytest.raises(ClusterError, match="cannot restart 'kwok'"):
        restart_component(fault_cluster, "kwok")
    with pytest.raises(ClusterError, match="still running"):
        fault_cluster.respawn("etcd")
