"""The dev cluster's lifecycle install leaves a cluster whose garbage collector already follows SandboxArchives.

kube-controller-manager's garbage collector learns of a new kind at its discovery resync (every 30 s). Before
that, an owner deleted with `propagationPolicy: Orphan` goes without orphaning its archive, and the archive's
dangling owner reference has it deleted once the collector catches up (a fresh-clone CI run lost a test to
it; measured on a fresh cluster: the orphaned archive deleted 29 s after the install). `install_lifecycle`
waits for a canary archive to be collected; on this worker's cluster the CRD may be older, in which case
the test still pins the orphaning the lifecycle docs promise.
"""

from __future__ import annotations

import pytest

from agent_sandbox.api.lifecycle import ARCHIVE
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.lifecycle import install_lifecycle
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def test_an_orphaning_delete_right_after_the_install_keeps_the_archive(
    cluster: DevCluster, namespace: str
) -> None:
    install_lifecycle(cluster)
    admin = cluster.admin()
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    status, owner = admin.request("POST", configmaps, {"metadata": {"name": "owner"}})
    assert status == 201, owner
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    archive = {
        "apiVersion": ARCHIVE.api_version,
        "kind": ARCHIVE.kind,
        "metadata": {"name": "kept", "ownerReferences": [ref]},
        "spec": {"sandbox": {}, "sandboxUID": "none", "archivedAt": "2026-12-07T00:00:00Z"},
    }
    archives = ARCHIVE.path(namespace)
    status, created = admin.request("POST", archives, archive)
    assert status == 201, created
    status, _ = admin.request("DELETE", f"{configmaps}/owner", {"propagationPolicy": "Orphan"})
    assert status == 200

    def orphaned() -> bool:
        status, got = admin.request("GET", f"{archives}/kept")
        assert status == 200, f"the archive was deleted ({status}): its owner reference was not orphaned"
        return not got["metadata"].get("ownerReferences")

    wait_for(orphaned, what="the archive orphaned", timeout=20)
    status, _ = admin.request("GET", f"{configmaps}/owner")
    assert status == 404
    status, canaries = admin.request(
        "GET", ARCHIVE.path("default") + "?labelSelector=app.kubernetes.io/component%3Dgc-canary"
    )
    assert status == 200, canaries
    assert canaries["items"] == [], "the install left its garbage-collector canary behind"
