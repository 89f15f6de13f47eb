"""The soak's error-log count reads both controller log formats and only error-or-worse levels."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.reliability.soak import error_lines

pytestmark = pytest.mark.unit


def test_error_lines_in_json_and_console_logs(tmp_path: Path) -> None:
    log = tmp_path / "controller.log"
    log.write_text(
        '{"level":"info","msg":"error budget fine"}\n'
        '{"level":"error","msg":"Reconciler error"}\n'
        "2026-01-01T00:00:00Z\tERROR\tclaim\tboom\n"
        "2026-01-01T00:00:00Z\tINFO\tclaim\tan error word in an info line\n"
        '{"level":"dpanic","msg":"bad"}\n'
        "not a log line\n"
    )
    found = error_lines(log)
    assert len(found) == 3
    assert error_lines(log, offset=log.stat().st_size) == []


def test_minutes_report_rss_against_the_sandboxes_cached() -> None:
    from benchmarks.reliability.soak import Sample, Soak

    buckets = [(float("inf"), 0.0)]
    run = Soak(params={}, samples=[
        Sample(at_s=0.0, rss_mib=100.0, fds=10, queue_depth=0.0, sandboxes_cached=5000.0, pods_cached=5000.0, cpu_s=10.0, claim_buckets=buckets),
        Sample(at_s=50.0, rss_mib=101.0, fds=11, queue_depth=3.0, sandboxes_cached=5400.0, pods_cached=5600.0, cpu_s=35.0, claim_buckets=buckets),
        Sample(at_s=70.0, rss_mib=102.5, fds=11, queue_depth=0.0, sandboxes_cached=5200.0, pods_cached=5100.0, cpu_s=39.0, claim_buckets=buckets),
    ])  # fmt: skip
    minutes = run.as_dict()["minutes"]
    assert [
        (
            m["minute"],
            m["rss_mib_max"],
            m["sandboxes_cached_max"],
            m["pods_cached_max"],
            m["controller_cores"],
        )
        for m in minutes
    ] == [
        (1, 101.0, 5400.0, 5600.0, 0.5),  # 25 CPU seconds over the minute's 50 s
        (2, 102.5, 5200.0, 5100.0, 0.2),  # 4 over the next 20 s
    ]


def test_minutes_count_claim_starts_by_launch_type_and_pod_condition() -> None:
    from benchmarks.reliability.soak import Sample, Soak

    buckets = [(float("inf"), 0.0)]

    def look(at_s: float, starts: dict[str, float]) -> Sample:
        return Sample(at_s=at_s, rss_mib=1.0, fds=1, queue_depth=0.0, sandboxes_cached=0.0, pods_cached=0.0,
                      cpu_s=0.0, claim_buckets=buckets, starts=starts)  # fmt: skip

    run = Soak(params={}, samples=[
        look(0.0, {"warm ready": 5.0}),
        look(50.0, {"warm ready": 50.0, "warm not_ready": 2.0}),
        look(110.0, {"warm ready": 90.0, "warm not_ready": 2.0, "cold not_ready": 1.0}),
    ])  # fmt: skip
    assert [m["starts"] for m in run.as_dict()["minutes"]] == [
        {"warm ready": 45, "warm not_ready": 2},  # counted from the first look, not from process start
        {"cold not_ready": 1, "warm not_ready": 0, "warm ready": 40},
    ]


def test_the_client_view_is_exact_and_split_by_the_minute_a_claim_was_sent() -> None:
    from benchmarks.reliability.soak import Soak

    run = Soak(params={}, started_wall=1000.0, client={
        "ns/a": (1000.2, 1000.0),  # 200 ms, minute 1
        "ns/b": (1059.9, 1059.5),  # 400 ms, minute 1
        "ns/c": (1061.0, 1060.9),  # 100 ms, minute 2
        "ns/d": (1070.0, None),  # no send stamp: seen Ready, no latency
    })  # fmt: skip
    view = run.client_view()
    assert view is not None
    assert view["seen_ready"] == 4
    assert view["latency_ms"]["count"] == 3
    assert view["latency_ms"]["max"] == 400.0
    assert {m: s["count"] for m, s in view["minutes"].items()} == {1: 2, 2: 1}
    assert view["minutes"][2]["p50"] == 100.0
    assert Soak(params={}).client_view() is None  # no watcher: no client view rather than an empty one


def test_the_timeline_reads_each_window_s_latency_against_the_cores_each_process_used() -> None:
    from benchmarks.reliability.soak import Sample, Soak

    def look(at_s: float, cpu: dict[str, float]) -> Sample:
        return Sample(at_s=at_s, rss_mib=1.0, fds=1, queue_depth=0.0, sandboxes_cached=0.0, pods_cached=0.0,
                      cpu_s=0.0, claim_buckets=[], cpu_by_process=cpu)  # fmt: skip

    run = Soak(
        params={},
        samples=[look(0.0, {"etcd": 1.0, "kube-apiserver": 5.0}), look(10.0, {"etcd": 6.0, "kube-apiserver": 15.0}),
                 look(20.0, {"etcd": 7.0})],  # the API server gone by the last look: no figure, not a wrong one
        started_wall=1000.0,
        client={"a": (1000.5, 1000.1), "b": (1012.0, 1011.0), "c": (1015.0, 1014.9)},
    )  # fmt: skip
    first, second = run.timeline()
    assert first["cores"] == {"etcd": 0.5, "kube-apiserver": 1.0}
    assert first["client_ms"]["count"] == 1
    assert first["client_ms"]["max"] == 400.0
    assert second["cores"] == {"etcd": 0.1}
    assert second["client_ms"]["count"] == 2
    assert second["client_ms"]["max"] == 1000.0


def test_the_timeline_names_the_relists_restarted_watches_and_writes_of_each_window() -> None:
    from benchmarks.promtext import parse
    from benchmarks.reliability.soak import Sample, Soak, apiserver_counts

    metrics = """\
apiserver_request_total{code="200",resource="pods",verb="LIST"} 3
apiserver_request_total{code="200",resource="pods",verb="WATCH"} 4
apiserver_request_total{code="410",resource="pods",verb="WATCH"} 1
apiserver_request_total{code="200",resource="sandboxes",verb="PATCH"} 90
apiserver_request_total{code="200",resource="",verb="LIST"} 2
apiserver_crd_conversion_webhook_duration_seconds_count{crd_name="sandboxes.agents.x-k8s.io",from_version="v1beta1",to_version="v1alpha1"} 7
apiserver_crd_conversion_webhook_duration_seconds_count{crd_name="sandboxclaims.extensions.agents.x-k8s.io",from_version="v1beta1",to_version="v1alpha1"} 3
"""
    assert apiserver_counts(parse(metrics)) == {
        "LIST pods": 3.0,
        "WATCH pods": 5.0,
        "LIST -": 2.0,
        "PATCH sandboxes": 90.0,
        "conversions": 10.0,
    }

    def look(at_s: float, counts: dict[str, float]) -> Sample:
        return Sample(at_s=at_s, rss_mib=1.0, fds=1, queue_depth=0.0, sandboxes_cached=0.0, pods_cached=0.0,
                      cpu_s=0.0, claim_buckets=[], apiserver_requests=counts)  # fmt: skip

    run = Soak(params={}, samples=[look(0.0, {"LIST pods": 3.0, "WATCH pods": 5.0}),
                                   look(10.0, {"LIST pods": 3.0, "WATCH pods": 5.0}),
                                   look(20.0, {"LIST pods": 4.0, "WATCH pods": 9.0, "LIST sandboxes": 1.0})])  # fmt: skip
    quiet, busy = run.timeline()
    assert "apiserver_requests" not in quiet  # nothing listed or re-watched: no entry, not zeros
    assert busy["apiserver_requests"] == {"LIST pods": 1, "LIST sandboxes": 1, "WATCH pods": 4}


def test_the_timeline_shows_the_api_servers_heap_and_its_collections_per_window() -> None:
    from benchmarks.promtext import parse
    from benchmarks.reliability.soak import Sample, Soak, apiserver_heap

    metrics = """\
go_memstats_heap_inuse_bytes 3.145728e+08
go_gc_duration_seconds{quantile="0.5"} 0.0001
go_gc_duration_seconds_sum 0.5
go_gc_duration_seconds_count 40
"""
    assert apiserver_heap(parse(metrics)) == {"heap_inuse_mib": 300.0, "gc_cycles": 40.0}
    assert apiserver_heap(parse("process_cpu_seconds_total 3\n")) == {}

    def look(at_s: float, heap: dict[str, float]) -> Sample:
        return Sample(at_s=at_s, rss_mib=1.0, fds=1, queue_depth=0.0, sandboxes_cached=0.0, pods_cached=0.0,
                      cpu_s=0.0, claim_buckets=[], apiserver_heap=heap)  # fmt: skip

    run = Soak(params={}, samples=[look(0.0, {}), look(10.0, {"heap_inuse_mib": 300.0, "gc_cycles": 40.0}),
                                   look(20.0, {"heap_inuse_mib": 320.5, "gc_cycles": 46.0})])  # fmt: skip
    unscraped, second = run.timeline()
    assert "apiserver_gc_cycles" not in unscraped  # no count before the first scrape: no entry, not a jump
    assert unscraped["apiserver_heap_mib"] == 300.0
    assert (second["apiserver_heap_mib"], second["apiserver_gc_cycles"]) == (320.5, 6)


def test_the_timeline_shows_the_watch_caches_that_grew_past_their_floor() -> None:
    from benchmarks.promtext import parse
    from benchmarks.reliability.soak import Sample, Soak, watch_cache_capacity

    metrics = """\
watch_cache_capacity{group="",resource="pods"} 4096
watch_cache_capacity{group="agents.x-k8s.io",resource="sandboxes"} 8192
watch_cache_capacity{group="",resource="configmaps"} 100
apiserver_watch_cache_capacity_increase_total{group="",resource="pods"} 6
"""
    capacity = watch_cache_capacity(parse(metrics))
    assert capacity == {"pods": 4096, "sandboxes": 8192}  # the 100-event floor is left out
    assert watch_cache_capacity(parse("process_cpu_seconds_total 3\n")) == {}

    def look(at_s: float, capacity: dict[str, int]) -> Sample:
        return Sample(at_s=at_s, rss_mib=1.0, fds=1, queue_depth=0.0, sandboxes_cached=0.0, pods_cached=0.0,
                      cpu_s=0.0, claim_buckets=[], watch_cache_capacity=capacity)  # fmt: skip

    first, second = Soak(params={}, samples=[look(0.0, {}), look(10.0, {}), look(20.0, capacity)]).timeline()
    assert "watch_cache_capacity" not in first
    assert second["watch_cache_capacity"] == {"pods": 4096, "sandboxes": 8192}


def test_the_timeline_shows_kernel_time_and_page_faults_per_process_and_what_the_heap_gave_back() -> None:
    from benchmarks.proc_sampling import KernelShare
    from benchmarks.promtext import parse
    from benchmarks.reliability.soak import Sample, Soak, apiserver_heap

    assert apiserver_heap(parse("go_memstats_heap_released_bytes 1.048576e+08\n")) == {
        "heap_released_mib": 100.0
    }

    def look(at_s: float, kernel: dict[str, KernelShare], released: float) -> Sample:
        return Sample(at_s=at_s, rss_mib=1.0, fds=1, queue_depth=0.0, sandboxes_cached=0.0, pods_cached=0.0,
                      cpu_s=0.0, claim_buckets=[], kernel_by_process=kernel,
                      apiserver_heap={"heap_released_mib": released})  # fmt: skip

    api = "kube-apiserver"
    run = Soak(params={}, samples=[
        look(0.0, {api: KernelShare(1.0, 1_000), "etcd": KernelShare(0.5, 10)}, 50.0),
        look(10.0, {api: KernelShare(3.0, 251_000), "etcd": KernelShare(0.5, 10)}, 20.0),
        look(20.0, {api: KernelShare(3.0, 251_000)}, 20.0),  # etcd gone: no entry for it
    ])  # fmt: skip
    growing, level = run.timeline()
    assert growing["kernel"] == {
        api: {"system_cores": 0.2, "minor_faults_k_per_s": 25.0}
    }  # idle etcd left out
    assert growing["apiserver_heap_released_mib"] == 20.0
    assert "kernel" not in level
