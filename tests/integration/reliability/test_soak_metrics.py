"""The kube-apiserver metrics the soak's timeline reads exist under the names it reads them by.

A renamed or misnamed metric does not fail a soak: its field is just missing from the timeline. The soak's
watch cache capacity was read as `apiserver_watch_cache_capacity` for a day and recorded nothing; the gauge
is `watch_cache_capacity`. This test reads a real kube-apiserver's `/metrics` after a burst of writes.
"""

from __future__ import annotations

import pytest
from benchmarks import promtext
from benchmarks.reliability.soak import apiserver_counts, apiserver_heap, watch_cache_capacity

from agent_sandbox.devcluster import DevCluster

pytestmark = pytest.mark.integration

# More ConfigMap events within the watch cache's 75 s history window than its 100-event floor holds, so
# kube-apiserver doubles that cache at least once.
CONFIGMAPS = 250


def test_the_soak_reads_request_counts_heap_and_watch_cache_capacity(
    cluster: DevCluster, namespace: str
) -> None:
    admin = cluster.admin()
    for i in range(CONFIGMAPS):
        status, body = admin.request(
            "POST", f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": f"cm-{i}"}}
        )
        assert status == 201, body

    status, text = admin.request("GET", "/metrics")
    assert status == 200, text
    assert isinstance(text, str)
    samples = promtext.parse(text)

    assert apiserver_counts(samples).get("POST configmaps", 0) >= CONFIGMAPS
    heap = apiserver_heap(samples)
    assert heap["heap_inuse_mib"] > 0
    assert heap["gc_cycles"] >= 1
    assert watch_cache_capacity(samples).get("configmaps", 0) >= 2 * 100
