"""The kube-apiserver metrics the soak's timeline reads exist under the names it reads them by.

A renamed or misnamed metric does not fail a soak: its field is just missing from the timeline. The soak's
watch cache capacity was read as `apiserver_watch_cache_capacity` for a day and recorded nothing; the gauge
is `watch_cache_capacity`. This test reads a real kube-apiserver's `/metrics` after a burst of writes.
"""

from __future__ import annotations

import pytest
from benchmarks import promtext
from benchmarks.proc_sampling import process_kernel_share
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
    assert "heap_released_mib" in heap
    assert watch_cache_capacity(samples).get("configmaps", 0) >= 2 * 100


def test_the_soak_reads_system_cpu_and_page_faults_of_a_cluster_process(cluster: DevCluster) -> None:
    pid = next(started.pid for started in cluster.state.started if started.name == "kube-apiserver")
    share = process_kernel_share(pid)
    assert share is not None
    # A Go server that has been serving for seconds has faulted in its heap and spent kernel time on it.
    assert share.minor_faults > 1000
    assert share.system_s > 0
