"""Resolution order and the "only sandboxes" rules over the Pod cache's indexes (pure logic).

The cache is fed pod objects through its informer handlers directly (as the watch would); the cache
against a real API server is covered in tests/integration/router/test_cache.py.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import pytest

from agent_sandbox.kube.errors import Forbidden
from agent_sandbox.kube.testing import FakeClient
from agent_sandbox.router._podcache import PodCache, PodEntry, entry_for
from agent_sandbox.router._resolve import ClaimedCheck, DialError, Resolver
from agent_sandbox.router._routing import Route, RouteError

pytestmark = pytest.mark.unit


def pod(
    name: str,
    ip: str,
    *,
    ns: str = "team",
    sandbox: str | None = None,
    uid: str | None = None,
    ready: bool = True,
    warm: bool = False,
    owner_kind: str = "Sandbox",
    api_version: str = "agents.x-k8s.io/v1beta1",
    controller: bool = True,
) -> dict[str, Any]:
    labels = {"agents.x-k8s.io/sandbox-name-hash": "abc"}
    if warm:
        labels["agents.x-k8s.io/warm-pool-sandbox"] = "pool"
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": api_version,
                    "kind": owner_kind,
                    "name": sandbox or name,
                    "uid": uid or f"uid-{sandbox or name}",
                    "controller": controller,
                }
            ],
        },
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def cache_with(*pods: dict[str, Any]) -> PodCache:
    cache = PodCache(FakeClient())
    for p in pods:
        cache._upsert(p)
    return cache


def r(ns: str = "team", sid: str = "sb", ip: str | None = None, uid: str | None = None) -> Route:
    return Route(sid, ns, 8888, ipaddress.ip_address(ip) if ip else None, uid)


@pytest.mark.parametrize(
    ("changes", "tracked"),
    [
        ({}, True),
        ({"owner_kind": "ReplicaSet"}, False),
        ({"api_version": "apps/v1"}, False),
        ({"api_version": "agents.x-k8s.io/v1alpha1"}, True),
        ({"controller": False}, False),
        ({"ip": ""}, False),
    ],
)
def test_entry_for(changes: dict[str, Any], tracked: bool) -> None:
    ip = changes.pop("ip", "10.0.0.1")
    assert (entry_for(pod("sb", ip, **changes)) is not None) is tracked


def test_entry_counts_container_restarts() -> None:
    """A held request tells the pod whose container came back from the one its dial failed on by this."""
    body = pod("sb", "10.0.0.1")
    entry = entry_for(body)
    assert entry is not None
    assert entry.restarts == 0
    body["status"]["containerStatuses"] = [{"name": "a", "restartCount": 2}, {"name": "b", "restartCount": 1}]
    restarted = entry_for(body)
    assert restarted is not None
    assert restarted.restarts == 3


def test_indexes() -> None:
    cache = cache_with(
        pod("sb", "10.0.0.1"),
        pod("warm-1", "10.0.0.2", warm=True),
        pod("booting", "10.0.0.3", ready=False),
        pod("legacy-pod", "10.0.0.4", sandbox="renamed"),
    )
    assert set(cache.by_uid) == {"uid-sb", "uid-warm-1", "uid-renamed"}
    assert set(cache.by_name) == {("team", "sb"), ("team", "renamed")}
    assert set(cache.by_ip) == {"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}
    assert cache.sandbox_known("team", "booting")
    assert not cache.sandbox_known("team", "nope")


def test_update_and_delete() -> None:
    cache = cache_with(pod("sb", "10.0.0.1"))
    cache._update({}, pod("sb", "10.0.0.9"))  # resumed on a new address
    assert cache.by_name[("team", "sb")].ip == "10.0.0.9"
    assert "10.0.0.1" not in cache.by_ip
    cache._update({}, pod("sb", "10.0.0.9", ready=False))
    assert ("team", "sb") not in cache.by_name
    assert "10.0.0.9" in cache.by_ip
    cache._delete(pod("sb", "10.0.0.9"))
    assert not cache.by_ip
    assert not cache.known


def test_claiming_a_warm_member_makes_it_reachable_by_name() -> None:
    cache = cache_with(pod("m", "10.0.0.2", warm=True))
    assert ("team", "m") not in cache.by_name
    cache._update({}, pod("m", "10.0.0.2"))
    assert ("team", "m") in cache.by_name


def test_evict_and_restore_on_next_event() -> None:
    cache = cache_with(pod("sb", "10.0.0.1"))
    assert not cache.evict_uid("uid-sb", "10.9.9.9")  # only if it still holds the failed IP
    assert cache.evict_uid("uid-sb", "10.0.0.1")
    assert "uid-sb" not in cache.by_uid
    assert ("team", "sb") not in cache.by_name
    cache._update({}, pod("sb", "10.0.0.1"))  # resync or any update restores it
    assert "uid-sb" in cache.by_uid
    assert cache.evict_name("team", "sb", "10.0.0.1")
    assert "uid-sb" in cache.by_uid


def resolver(cache: PodCache | None, allow_loopback: bool = False) -> Resolver:
    return Resolver(cluster_domain="cluster.local", allow_loopback=allow_loopback, cache=cache)


def test_without_cache() -> None:
    res = resolver(None)
    t = res.resolve_fast(r(ip="10.0.0.7"))
    assert t is not None
    assert (t.host, t.source, t.authority) == ("10.0.0.7", "pod-ip", b"10.0.0.7:8888")
    t6 = res.resolve_fast(r(ip="fd00::7"))
    assert t6 is not None
    assert t6.authority == b"[fd00::7]:8888"
    assert res.resolve_fast(r(uid="uid-sb")) is None  # -> DNS


def test_order_with_cache() -> None:
    res = resolver(cache_with(pod("sb", "10.0.0.1"), pod("warm-1", "10.0.0.2", warm=True)))
    by_ip = res.resolve_fast(r(ip="10.0.0.1"))
    assert by_ip is not None
    assert by_ip.source == "pod-ip"
    by_uid = res.resolve_fast(r(sid="warm-1", uid="uid-warm-1"))
    assert by_uid is not None
    assert (by_uid.host, by_uid.source) == ("10.0.0.2", "cache")
    by_name = res.resolve_fast(r())
    assert by_name is not None
    assert (by_name.host, by_name.source) == ("10.0.0.1", "cache-name")
    assert res.resolve_fast(r(sid="warm-1")) is None  # pool members: UID only
    unknown_uid = res.resolve_fast(r(uid="uid-gone"))
    assert unknown_uid is not None
    assert unknown_uid.source == "cache-name"


def test_foreign_pod_ip_and_uid_are_forbidden() -> None:
    res = resolver(cache_with(pod("sb", "10.0.0.1"), pod("other", "10.0.0.2")))
    with pytest.raises(RouteError) as err:
        res.resolve_fast(r(ip="10.0.0.2"))
    assert err.value.status == 403
    assert err.value.detail == "X-Sandbox-Pod-IP 10.0.0.2 does not belong to sandbox team/sb."
    with pytest.raises(RouteError, match="X-Sandbox-UID uid-other does not belong to sandbox team/sb"):
        res.resolve_fast(r(uid="uid-other"))


def test_stale_pod_ip_is_re_resolved() -> None:
    cache = cache_with(pod("sb", "10.0.0.1"))
    cache._delete(pod("sb", "10.0.0.1"))  # suspended
    cache._upsert(pod("sb", "10.0.0.9"))  # resumed elsewhere
    res = resolver(cache)
    assert res.resolve_fast(r(ip="10.0.0.2")) is None  # never this sandbox's: the slow path (wait, 403)
    t = res.resolve_fast(r(ip="10.0.0.1"))
    assert t is not None
    assert (t.host, t.source) == ("10.0.0.9", "cache-name")


async def test_unknown_pod_ip_waits_for_the_watch_then_403(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent_sandbox.router._resolve.POD_IP_WAIT", 0.2)
    cache = cache_with()
    res = resolver(cache)
    with pytest.raises(RouteError, match="does not belong"):
        await res.resolve(r(ip="10.0.0.5"))
    # The pod shows up while the request waits: it goes through.
    task = asyncio.create_task(res.resolve(r(ip="10.0.0.5")))
    await asyncio.sleep(0.05)
    cache._upsert(pod("sb", "10.0.0.5"))
    target = await task
    assert target.source == "pod-ip"


async def test_names_without_ready_pod_are_not_looked_up_in_watched_namespaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    async def fake_getaddrinfo(host: str, port: int, **_: Any) -> list[Any]:
        asked.append(host)
        return [(2, 1, 6, "", ("10.1.1.1", port))]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", fake_getaddrinfo)
    res = resolver(cache_with(pod("sb", "10.0.0.1"), pod("booting", "10.0.0.3", ready=False)))
    with pytest.raises(DialError, match="no sandbox team/kubernetes"):
        await res.resolve(r(sid="kubernetes"))
    with pytest.raises(DialError, match="sandbox team/booting has no Ready pod"):
        await res.resolve(r(sid="booting"))
    assert asked == []
    scoped = PodCache(FakeClient(), namespace="team")
    outside = await resolver(scoped).resolve(r(ns="elsewhere"))
    assert (outside.source, asked) == ("dns", ["sb.elsewhere.svc.cluster.local"])


async def test_dns_form_refuses_restricted_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    res = resolver(None)
    asked: list[str] = []

    async def fake_getaddrinfo(host: str, port: int, **_: Any) -> list[Any]:
        asked.append(host)
        return [(2, 1, 6, "", ("169.254.169.254", port)), (2, 1, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", fake_getaddrinfo)
    with pytest.raises(DialError, match="no address the router may dial"):
        await res.resolve(r())
    assert asked == ["sb.team.svc.cluster.local"]
    target = await resolver(None, allow_loopback=True).resolve(r())
    assert (target.host, target.source, target.authority) == (
        "127.0.0.1",
        "dns",
        b"sb.team.svc.cluster.local:8888",
    )


async def test_dns_failure_is_a_dial_error(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_such_host(host: str, port: int, **_: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", no_such_host)
    with pytest.raises(DialError, match=r"resolve sb\.team\.svc\.cluster\.local: .*not known"):
        await resolver(None).resolve(r())


class _Sandboxes:
    """A getter of Sandbox objects that counts its calls (the API server, for ClaimedCheck)."""

    def __init__(self, labels: dict[str, str], uid: str = "sb-uid") -> None:
        self.labels, self.uid, self.calls = labels, uid, 0
        self.fail: Exception | None = None

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls += 1
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return {
            "metadata": {"name": name, "namespace": namespace, "uid": self.uid, "labels": dict(self.labels)}
        }


def _member_entry() -> PodEntry:
    return PodEntry(
        ip="127.10.0.9", pod="m", namespace="team", sandbox="m", uid="sb-uid", ready=True, warm=True
    )


async def test_claimed_check_asks_once_per_claimed_sandbox_and_again_for_an_unclaimed_one() -> None:
    now = [100.0]
    api = _Sandboxes({"agents.x-k8s.io/warm-pool-sandbox": "abc"})
    check = ClaimedCheck(api.get, clock=lambda: now[0])
    entry = _member_entry()
    assert await check.claimed(entry) is False
    assert await check.claimed(entry) is False  # within the TTL: not asked again
    assert api.calls == 1
    now[0] += ClaimedCheck.UNCLAIMED_TTL + 0.01
    api.labels = {}  # the takeover removed the pool label from the Sandbox
    results = await asyncio.gather(*(check.claimed(entry) for _ in range(5)))
    assert results == [True] * 5
    assert api.calls == 2  # five requests at once share one GET
    now[0] += 3600
    assert await check.claimed(entry) is True
    assert api.calls == 2  # a claimed Sandbox never goes back to the pool


async def test_claimed_check_says_no_for_another_sandbox_or_when_it_cannot_ask() -> None:

    now = [0.0]
    recreated = _Sandboxes({}, uid="another-uid")  # same name, a new Sandbox: not the pod's owner
    assert await ClaimedCheck(recreated.get, clock=lambda: now[0]).claimed(_member_entry()) is False
    refused = _Sandboxes({})
    refused.fail = Forbidden(403, "Forbidden", "sandboxes is forbidden")
    assert await ClaimedCheck(refused.get, clock=lambda: now[0]).claimed(_member_entry()) is False


async def test_an_unclaimed_pool_member_by_name_is_not_said_to_have_no_ready_pod() -> None:
    """Its pod is Ready; it is reachable by UID only (the log line said "has no Ready pod" until December 6)."""
    res = resolver(cache_with(pod("warm-1", "10.0.0.2", warm=True)))
    with pytest.raises(DialError, match="team/warm-1 is an unclaimed warm-pool member"):
        await res.resolve(r(sid="warm-1"))
