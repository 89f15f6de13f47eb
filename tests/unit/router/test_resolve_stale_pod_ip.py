"""A stale `X-Sandbox-Pod-IP` of a Sandbox with no pod (suspended, hibernated) is resolved as a request by name,
so `--sandbox-lifecycle` can hold it while the Sandbox resumes (pure logic over the Pod cache's indexes).

Until December 6 such a request waited 2 s for the cache and was refused with 403 before any hold: a
hibernated Sandbox never came back for upstream's SDK (it sends the address it read once with every request).
Another sandbox's address stays refused. The real router and controller: tests/integration/lifecycle/
test_stale_pod_ip.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.kube.testing import FakeClient
from agent_sandbox.router._lifecycle import RouterLifecycle
from agent_sandbox.router._lifecycle_state import LifecycleState, _diet_archive, archive_view, sandbox_view
from agent_sandbox.router._metrics import RouterMetrics
from agent_sandbox.router._podcache import PodCache
from agent_sandbox.router._resolve import DialError, Resolver
from agent_sandbox.router._routing import RouteError
from tests.unit.router.test_resolve import cache_with, pod, r

pytestmark = pytest.mark.unit


def resolver(cache: PodCache, resumable: set[tuple[str, str]] | None = None) -> Resolver:
    return Resolver(
        cluster_domain="cluster.local",
        allow_loopback=True,
        cache=cache,
        resumable=None if resumable is None else lambda ns, name: (ns, name) in resumable,
    )


def gone(cache: PodCache, *pods: dict[str, Any]) -> PodCache:
    for p in pods:
        cache._delete(p)
    return cache


async def test_the_former_ip_of_a_sandbox_without_a_pod_is_a_dial_failure_at_once() -> None:
    cache = gone(cache_with(pod("sb", "10.0.0.1")), pod("sb", "10.0.0.1"))  # suspended or hibernated
    res = resolver(cache)
    assert res.resolve_fast(r(ip="10.0.0.1")) is None
    started = time.monotonic()
    with pytest.raises(DialError, match="no sandbox team/sb in the pod cache"):
        await res.resolve(r(ip="10.0.0.1"))
    assert time.monotonic() - started < 0.5  # not the 2 s wait for the watch, then 403
    # Its pod back (resumed, restored): the new one.
    cache._upsert(pod("sb", "10.0.0.9"))
    target = res.resolve_fast(r(ip="10.0.0.1"))
    assert target is not None
    assert (target.host, target.source) == ("10.0.0.9", "cache-name")


async def test_the_former_ip_of_a_sandbox_whose_new_pod_is_not_ready_is_a_dial_failure() -> None:
    cache = gone(cache_with(pod("sb", "10.0.0.1")), pod("sb", "10.0.0.1"))
    cache._upsert(pod("sb", "10.0.0.9", ready=False))
    with pytest.raises(DialError, match="sandbox team/sb has no Ready pod"):
        await resolver(cache).resolve(r(ip="10.0.0.1"))


async def test_another_sandboxes_address_stays_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent_sandbox.router._resolve.POD_IP_WAIT", 0.2)
    cache = gone(cache_with(pod("sb", "10.0.0.1"), pod("other", "10.0.0.2")), pod("sb", "10.0.0.1"))
    cache._delete(pod("other", "10.0.0.2"))
    cache._upsert(pod("third", "10.0.0.3"))
    res = resolver(cache, resumable={("team", "sb")})
    with pytest.raises(RouteError, match=r"10\.0\.0\.3 does not belong to sandbox team/sb") as err:
        res.resolve_fast(r(ip="10.0.0.3"))  # a current sandbox pod's: refused at once, even resumable
    assert err.value.status == 403
    with pytest.raises(RouteError, match=r"10\.0\.0\.3 does not belong"):
        res.resolve_fast(r(ip="10.0.0.3"), resumed=True)
    # Another sandbox's former address, the Sandbox not resumable and with a pod: refused after the wait.
    cache._upsert(pod("sb", "10.0.0.9"))
    with pytest.raises(RouteError, match=r"10\.0\.0\.2 does not belong"):
        await resolver(cache).resolve(r(ip="10.0.0.2"))


async def test_an_unknown_address_of_a_resumable_sandbox_without_a_pod_is_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A router that started after the Sandbox's pod went does not know the address was its pod's."""
    monkeypatch.setattr("agent_sandbox.router._resolve.POD_IP_WAIT", 0.2)
    cache = cache_with(pod("running", "10.0.0.4"))
    held = resolver(cache, resumable={("team", "sb"), ("team", "running")})
    started = time.monotonic()
    with pytest.raises(DialError, match=r"sandbox team/sb has no pod \(X-Sandbox-Pod-IP 10.0.0.1 is not"):
        await held.resolve(r(ip="10.0.0.1"))
    assert time.monotonic() - started < 0.1
    # Not resumable (no lifecycle, or it did not ask for auto-resume): refused, as before.
    with pytest.raises(RouteError, match=r"10\.0\.0\.1 does not belong"):
        await resolver(cache).resolve(r(ip="10.0.0.1"))
    with pytest.raises(RouteError, match=r"10\.0\.0\.1 does not belong"):
        await resolver(cache, resumable=set()).resolve(r(ip="10.0.0.1"))
    # A Sandbox with a pod: an address that is not its pod's is refused, resumable or not.
    with pytest.raises(RouteError, match=r"10\.0\.0\.1 does not belong to sandbox team/running"):
        await held.resolve(r(sid="running", ip="10.0.0.1"))


async def test_once_resumed_the_address_is_resolved_by_name() -> None:
    """After a hold (`resumed`), the address predates the resume: the pod the hold waited for serves, also when
    the address is the Sandbox's old pod's still in the cache (being deleted), or one the cache never knew."""
    old = pod("sb", "10.0.0.1")
    old["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    cache = cache_with(old, pod("sb-new", "10.0.0.9", sandbox="sb"))
    res = resolver(cache)
    for ip in ("10.0.0.1", "10.0.0.77"):
        target = res.resolve_fast(r(ip=ip), resumed=True)
        assert target is not None
        assert (target.host, target.source) == ("10.0.0.9", "cache-name")
    assert (await res.resolve(r(ip="10.0.0.77"), resumed=True)).host == "10.0.0.9"
    # Without a Ready pod yet: a dial failure (retried, held again), not a 403.
    empty = resolver(cache_with())
    with pytest.raises(DialError):
        await empty.resolve(r(ip="10.0.0.1"), resumed=True)


async def test_a_pod_that_goes_while_the_request_waits_makes_its_address_stale() -> None:
    cache = cache_with()
    res = resolver(cache)
    task = asyncio.create_task(res.resolve(r(ip="10.0.0.5")))
    await asyncio.sleep(0.05)
    # Its pod shows up and goes (a watch event pair delivered together): the address is its former pod's.
    cache._upsert(pod("sb", "10.0.0.5"))
    cache._delete(pod("sb", "10.0.0.5"))
    with pytest.raises(DialError, match="no sandbox team/sb in the pod cache"):
        await asyncio.wait_for(task, 1.5)


async def test_the_lifecycle_says_which_sandboxes_resume_on_request() -> None:
    api = FakeClient()
    state = LifecycleState(api)
    auto = {lc.ANNOTATION_AUTO_RESUME: "true"}

    def sandbox(name: str, annotations: dict[str, str], mode: str, **labels: str) -> Any:
        meta = {"name": name, "namespace": "team", "uid": f"uid-{name}", "annotations": annotations}
        return sandbox_view({"metadata": {**meta, "labels": labels}, "spec": {"operatingMode": mode}})

    state.sandboxes[("team", "suspended")] = sandbox("suspended", auto, "Suspended")
    state.sandboxes[("team", "plain")] = sandbox("plain", {}, "Suspended")
    member = sandbox("member", auto, "Suspended", **{"agents.x-k8s.io/warm-pool-sandbox": "pool"})
    state.sandboxes[("team", "member")] = member
    archive = {
        "metadata": {"name": "hibernated", "namespace": "team", "uid": "a-uid", "resourceVersion": "3"},
        "spec": {"sandbox": {"metadata": {"annotations": auto}, "spec": {}}},
    }
    state.archives[("team", "hibernated")] = archive_view(_diet_archive(archive))
    lifecycle = RouterLifecycle(
        api,  # type: ignore[arg-type]
        state,
        PodCache(api),
        RouterMetrics(),
        resume_timeout=30,
        activity_interval=0,
    )
    assert lifecycle.resumable("team", "suspended")
    assert lifecycle.resumable("team", "hibernated")
    assert not lifecycle.resumable("team", "plain")  # did not ask for auto-resume
    assert not lifecycle.resumable("team", "member")  # an unclaimed pool member: nobody's to resume
    assert not lifecycle.resumable("team", "unknown")
    await lifecycle.close()


def test_another_sandboxes_address_is_refused_before_any_hold() -> None:
    """`Resolver.refuse_named_elsewhere` is asked before a request for a Sandbox the router has seen Suspended is
    held (`Proxy._forward`, `H2Connection._dial`): until December 6 such a request was held first, so the Sandbox
    was resumed for a request then refused for naming another sandbox's address."""
    cache = gone(cache_with(pod("sb", "10.0.0.1"), pod("other", "10.0.0.2")), pod("sb", "10.0.0.1"))
    res = resolver(cache, resumable={("team", "sb")})
    with pytest.raises(
        RouteError, match=r"X-Sandbox-Pod-IP 10\.0\.0\.2 does not belong to sandbox team/sb"
    ) as err:
        res.refuse_named_elsewhere(r(ip="10.0.0.2"))
    assert err.value.status == 403
    # Another sandbox's UID, without an address: as `resolve_fast` answers after the hold.
    other_uid = cache.by_ip["10.0.0.2"].uid
    with pytest.raises(
        RouteError, match=f"X-Sandbox-UID {other_uid} does not belong to sandbox team/sb"
    ) as err:
        res.refuse_named_elsewhere(r(uid=other_uid))
    assert err.value.status == 403
    # Nothing to refuse: no address or UID, the Sandbox's former address, one the cache does not know (a
    # former address the router never saw), or a UID the cache does not know. These are held.
    for route in (r(), r(ip="10.0.0.1"), r(ip="10.0.0.77"), r(uid="uid-unknown")):
        res.refuse_named_elsewhere(route)
    # The Sandbox's own current pod (a suspend is deleting it): not refused either.
    cache._upsert(pod("sb", "10.0.0.9"))
    res.refuse_named_elsewhere(r(ip="10.0.0.9", uid=cache.by_ip["10.0.0.9"].uid))
    # Without the cache nothing can be checked: nothing is refused.
    Resolver(cluster_domain="cluster.local", allow_loopback=True).refuse_named_elsewhere(r(ip="10.0.0.2"))


def test_an_address_in_a_namespace_the_cache_does_not_watch_is_refused_before_any_hold() -> None:
    cache = PodCache(FakeClient(), namespace="watched")
    res = resolver(cache, resumable={("team", "sb")})
    with pytest.raises(RouteError, match="cannot be checked for namespace team") as err:
        res.refuse_named_elsewhere(r(ip="10.0.0.1"))
    assert err.value.status == 403
    res.refuse_named_elsewhere(r())  # by name: resolved by DNS there, as upstream's


def test_the_activity_check_refuses_what_resolve_fast_refuses_and_no_more() -> None:
    """`refuse_named_elsewhere(route, held=False)` runs before every request counts as activity (lifecycle on):
    the Sandbox's own current pod's address is served by address with its UID unread (Pod IP first, as
    `resolve_fast`), so a contradicting `X-Sandbox-UID` beside it is not refused there either (a review found
    the first version of the check refused it only with lifecycle on)."""
    cache = cache_with(pod("sb", "10.0.0.1"), pod("other", "10.0.0.2"))
    res = resolver(cache, resumable={("team", "sb")})
    other_uid = cache.by_ip["10.0.0.2"].uid
    own = r(ip="10.0.0.1", uid=other_uid)
    target = res.resolve_fast(own)
    assert target is not None
    assert target.host == "10.0.0.1"
    res.refuse_named_elsewhere(own, held=False)
    with pytest.raises(RouteError, match="X-Sandbox-UID"):
        res.refuse_named_elsewhere(own)  # held: resolved by name after the hold, where the UID is read
    for foreign in (r(ip="10.0.0.2"), r(uid=other_uid)):
        with pytest.raises(RouteError) as err:
            res.refuse_named_elsewhere(foreign, held=False)
        assert err.value.status == 403
