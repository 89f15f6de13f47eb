"""Upstream address resolution (router spec §1.4) and the "only sandboxes" rule (operations spec §11).

Order, first match wins: `X-Sandbox-Pod-IP` -> cached Sandbox UID -> cached `namespace/X-Sandbox-ID`
-> DNS form `<id>.<namespace>.svc.<cluster-domain>`. Stronger than upstream where the cache can tell:

- With the cache on, an `X-Sandbox-Pod-IP` must belong to the named Sandbox. Another Sandbox's IP ->
  403. An address that was this sandbox's former pod's is stale (the sandbox was suspended, or
  hibernated, since): the request is resolved as one by name, to the current pod (source `cache-name`)
  or, while there is none, as a dial failure, which `--sandbox-lifecycle` holds while a Sandbox that
  resumes on request resumes (until December 6 that was a 403 after 2 s, before any hold: a hibernated
  Sandbox never came back for upstream's SDK, which sends the address it read once with every request).
  So is an address the cache does not know when the Sandbox has no pod at all and the lifecycle would
  resume it (`resumable`: a router that started after its pod went), and any address of this Sandbox's
  once a request was held while it resumed (`resumed`: the address predates the resume). Any other
  address the cache does not know waits briefly for the watch to catch up (a pod that just became
  Ready), then 403. The named address itself is dialled only while it is the named sandbox's pod's, so a
  dev cluster's loopback pod IPs are reachable only as a sandbox's.
- With the cache on, an `X-Sandbox-UID` must belong to the named Sandbox (403 otherwise), and the DNS
  form is not used for namespaces the cache watches: a name without a Ready sandbox pod is a dial
  failure (retried with re-resolution, then 502), which is what the DNS form gives for a Sandbox whose
  pod is not Ready, and any other Service in those namespaces is not a proxy target. Namespaces outside
  `--cache-namespace` still use the DNS form, as upstream.
- The DNS form is resolved by the router and the address is dialled only if it is not link-local,
  multicast or unspecified (nor loopback unless `--allow-loopback-pod-ip`).

Every attempt of the retry loop resolves again, so an address that changes during the backoff is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..api.constants import LABEL_WARM_POOL_SANDBOX
from ._podcache import PodCache, PodEntry
from ._routing import Route, RouteError, always_refused

__all__ = ["POD_IP_WAIT", "ClaimedCheck", "DialError", "Resolver", "Target"]

log = logging.getLogger(__name__)

POD_IP_WAIT = 2.0
"""How long a request naming a Pod IP the cache does not know waits for the watch before 403."""


class DialError(OSError):
    """A dial-phase failure found before connecting (unknown name, DNS error): retryable."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where one attempt dials."""

    host: str
    """IP literal to connect to."""
    port: int
    source: str
    """`pod-ip`, `cache`, `cache-name` or `dns` (router spec §1.4 source labels)."""
    authority: bytes
    """The forwarded `Host` header (upstream URL's host:port)."""
    entry: PodEntry | None = None
    """The cache entry used, for active invalidation."""


def _authority(host: str, port: int) -> bytes:
    return (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode("ascii")


def _foreign(route: Route) -> RouteError:
    return RouteError(
        403,
        f"X-Sandbox-Pod-IP {route.pod_ip} does not belong to sandbox {route.namespace}/{route.sandbox_id}.",
    )


def _foreign_uid(route: Route) -> RouteError:
    return RouteError(
        403, f"X-Sandbox-UID {route.uid} does not belong to sandbox {route.namespace}/{route.sandbox_id}."
    )


def _uid_entry(cache: PodCache, route: Route) -> PodEntry | None:
    """The cached pod of the route's `X-Sandbox-UID` (None: no UID, or one the cache does not know).

    Raises:
        RouteError: 403, the UID is another sandbox's.
    """
    entry = cache.by_uid.get(route.uid) if route.uid else None
    if entry is not None and (entry.namespace != route.namespace or entry.sandbox != route.sandbox_id):
        raise _foreign_uid(route)
    return entry


Resumable = Callable[[str, str], bool]
"""(namespace, name) -> a request for that Sandbox that finds no pod is held while it resumes (or told why it
cannot be): `RouterLifecycle.resumable`."""

GetSandbox = Callable[[str, str], Awaitable[Mapping[str, Any]]]
"""(namespace, name) -> the Sandbox object; raises `kube.NotFound`, `kube.Forbidden`, ..."""


class ClaimedCheck:
    """Whether a pool member's Sandbox has been claimed though its Pod still carries the pool's label.

    A claim takes a warm Sandbox at once, but the controller relabels its Pod later (a write it holds while
    claims keep arriving, docs/design/claim-priority.md, up to the hold: 15 s). The router does not route to
    unclaimed pool members by name (spec §1.9.4: nobody may use, or tamper with, a sandbox before its
    claimant), so a client naming a just-claimed sandbox (curl, a browser through `agent-sandbox proxy`,
    anything without `X-Sandbox-Pod-IP`) got 502 for as long as the relabel was held. This asks the API
    server (one GET of the Sandbox) instead: claimed once its own pool label is gone, which the takeover
    writes before the claim is Ready. Answers are kept briefly per Sandbox UID (a claimed Sandbox never
    goes back to the pool; an unclaimed one is asked again after `UNCLAIMED_TTL`). Needs `get` on
    `sandboxes` (the router's ClusterRole grants it); refused or failing, the answer is "not claimed", as
    before.
    """

    UNCLAIMED_TTL = 0.5

    def __init__(self, get_sandbox: GetSandbox, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._get = get_sandbox
        self._clock = clock
        self._claimed: OrderedDict[str, None] = OrderedDict()
        self._unclaimed_until: dict[str, float] = {}
        self._asking: dict[str, asyncio.Future[bool]] = {}
        self._warned = False

    async def claimed(self, entry: PodEntry) -> bool:
        if entry.uid in self._claimed:
            return True
        if self._unclaimed_until.get(entry.uid, 0.0) > self._clock():
            return False
        asking = self._asking.get(entry.uid)
        if asking is None:  # requests that arrive together (a browser's page and its assets) share one GET
            asking = self._asking[entry.uid] = asyncio.ensure_future(self._ask(entry))
            asking.add_done_callback(lambda _f: self._asking.pop(entry.uid, None))
        return await asyncio.shield(asking)

    async def _ask(self, entry: PodEntry) -> bool:
        try:
            sandbox = await self._get(entry.namespace, entry.sandbox)
        except Exception as exc:  # NotFound, Forbidden (RBAC without `get sandboxes`), the API unreachable
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot tell whether pool member %s/%s was claimed: %s",
                    entry.namespace,
                    entry.sandbox,
                    exc,
                )
            sandbox = {}
        meta = sandbox.get("metadata") or {}
        claimed = meta.get("uid") == entry.uid and LABEL_WARM_POOL_SANDBOX not in (meta.get("labels") or {})
        if claimed:
            self._claimed[entry.uid] = None
            if len(self._claimed) > _CLAIMED_LIMIT:
                self._claimed.popitem(last=False)
            self._unclaimed_until.pop(entry.uid, None)
        else:
            now = self._clock()
            self._unclaimed_until = {u: t for u, t in self._unclaimed_until.items() if t > now}
            self._unclaimed_until[entry.uid] = now + self.UNCLAIMED_TTL
        return claimed


_CLAIMED_LIMIT = 65536


class Resolver:
    """Turns a validated `Route` into a dial `Target`."""

    def __init__(
        self,
        *,
        cluster_domain: str,
        allow_loopback: bool,
        cache: PodCache | None = None,
        claimed: ClaimedCheck | None = None,
        resumable: Resumable | None = None,
    ) -> None:
        self.cluster_domain = cluster_domain
        self.allow_loopback = allow_loopback
        self.cache = cache
        self.claimed = claimed
        self.resumable = resumable

    def _pod_ip(self, cache: PodCache, route: Route, resumed: bool) -> Target | bool:
        """Check a request's `X-Sandbox-Pod-IP` against the cache: the target when the address is the named
        Sandbox's pod's; True when the request is to be resolved by name instead (a stale address of the
        Sandbox: its former pod's, or any once the request was held while it resumed); False when the cache
        does not know the address (yet).

        Raises:
            RouteError: 403, the address is another sandbox's pod's, or the cache cannot check it.
        """
        assert route.pod_ip is not None
        ip = str(route.pod_ip)
        owner = cache.by_ip.get(ip)
        if owner is not None:
            if owner.namespace != route.namespace or owner.sandbox != route.sandbox_id:
                raise _foreign(route)
            if not resumed:
                return Target(ip, route.port, "pod-ip", _authority(ip, route.port), owner)
            # Held while the Sandbox resumed: its Ready pod now is the one the hold waited for (this one may be
            # the pod a suspend is deleting, still in the cache).
            return True
        if not cache.covers(route.namespace):
            # A namespace the cache does not watch (`--cache-namespace`): the address cannot be checked,
            # and the cache knows sandbox pods only (not a watched namespace's other pods, nor nodes), so
            # it is refused - at once and saying why (until December 6 after a 2 s wait for the cache,
            # as an address of another sandbox). Requests by name resolve by DNS there, as upstream's.
            raise RouteError(
                403,
                f"X-Sandbox-Pod-IP cannot be checked for namespace {route.namespace}: the router's Pod "
                "cache does not watch it (--cache-namespace); send the request without it.",
            )
        return resumed or cache.former.get(ip) == (route.namespace, route.sandbox_id)

    def refuse_named_elsewhere(self, route: Route, *, held: bool = True) -> None:
        """Refuse, before a request is held while its Sandbox resumes, what resolving it afterwards would refuse
        anyway: an `X-Sandbox-Pod-IP` that is another sandbox's pod's (or one in a namespace the cache does not
        watch), or, resolving by name, an `X-Sandbox-UID` that is another sandbox's. Nothing without the cache.

        A request for a Sandbox the router has seen Suspended is held before it is resolved (not to the pod a
        suspend is taking away), so until December 6 such a request resumed the Sandbox and only then got its
        403. An address or UID the cache does not know (a former pod's) is not refused here: it is resolved by
        name once the hold is over, as `resolve_fast(route, resumed=True)` does.

        `held=False`: the check before a request counts as activity, whether or not it is then held: what
        `resolve_fast(route)` would refuse. The Sandbox's own current pod's address is served by address there
        and its `X-Sandbox-UID` not read (spec §1.4, Pod IP first), so it is not refused for its UID either.

        Raises:
            RouteError: 403, as `resolve_fast(route, resumed=held)` would (after the hold).
        """
        cache = self.cache
        if cache is None:
            return
        if route.pod_ip is not None and isinstance(self._pod_ip(cache, route, held), Target):
            return  # (never with `held`: a held request's address is resolved by name)
        _uid_entry(cache, route)

    def resolve_fast(self, route: Route, *, resumed: bool = False) -> Target | None:
        """Resolve without waiting; None when the slow path (`resolve`) is needed.

        `resumed`: the request was held while its Sandbox resumed (`RouterLifecycle.hold` returned True), so
        its `X-Sandbox-Pod-IP`, unless another sandbox's, predates the resume: it is resolved by name.

        Raises:
            RouteError: 403, the request names another sandbox's Pod IP or UID.
        """
        cache = self.cache
        if route.pod_ip is not None:
            if cache is None:
                ip = str(route.pod_ip)
                return Target(ip, route.port, "pod-ip", _authority(ip, route.port))
            checked = self._pod_ip(cache, route, resumed)
            if isinstance(checked, Target):
                return checked
            if not checked:
                return None
            # A stale address of this sandbox: on as a request by name (the address is not dialled).
        if cache is None:
            return None
        entry = _uid_entry(cache, route)
        if entry is not None:
            return Target(entry.ip, route.port, "cache", _authority(entry.ip, route.port), entry)
        entry = cache.by_name.get((route.namespace, route.sandbox_id))
        if entry is not None:
            return Target(entry.ip, route.port, "cache-name", _authority(entry.ip, route.port), entry)
        return None

    async def resolve(self, route: Route, *, resumed: bool = False) -> Target:
        """Resolve, waiting where needed (cache catch-up, DNS).

        Raises:
            RouteError: 403 (see `resolve_fast`; also a Pod IP that is no sandbox's).
            DialError: nothing to dial (unknown sandbox, DNS failure, a stale Pod IP of a sandbox without a
                Ready pod): retryable, and held by `--sandbox-lifecycle` for a Sandbox that resumes on request.
        """
        target = self.resolve_fast(route, resumed=resumed)
        if target is not None:
            return target
        cache = self.cache
        if route.pod_ip is not None and cache is not None and not self._pod_ip(cache, route, resumed):
            key = (route.namespace, route.sandbox_id)
            if self.resumable is not None and not cache.sandbox_known(*key) and self.resumable(*key):
                # The Sandbox has no pod and resumes on request (suspended or hibernated before this router
                # saw its pod go): the address is its former pod's. Held as a request by name; once it is
                # resumed, it is resolved by name (`resumed`), never by this address.
                raise DialError(
                    f"sandbox {route.namespace}/{route.sandbox_id} has no pod (X-Sandbox-Pod-IP {route.pod_ip} "
                    "is not its pod's)"
                )
            stale = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POD_IP_WAIT):
                    while True:
                        await cache.wait_changed()
                        target = self.resolve_fast(route, resumed=resumed)
                        if target is not None:
                            return target
                        if self._pod_ip(cache, route, resumed):
                            stale = True  # its pod went meanwhile: on by name
                            break
            if not stale:
                raise _foreign(route)
        if cache is not None and cache.covers(route.namespace):
            warm = cache.warm_by_name.get((route.namespace, route.sandbox_id))
            if warm is not None and self.claimed is not None and await self.claimed.claimed(warm):
                return Target(warm.ip, route.port, "cache-name", _authority(warm.ip, route.port), warm)
            if cache.sandbox_known(route.namespace, route.sandbox_id):
                # Its pod exists but is not Ready (or is an unclaimed pool member named by name): a
                # headless Service would not publish it either, so do not ask DNS.
                if warm is not None:
                    raise DialError(
                        f"sandbox {route.namespace}/{route.sandbox_id} is an unclaimed warm-pool member "
                        "(reachable by X-Sandbox-UID only)"
                    )
                raise DialError(f"sandbox {route.namespace}/{route.sandbox_id} has no Ready pod")
            raise DialError(f"no sandbox {route.namespace}/{route.sandbox_id} in the pod cache")
        return await self._resolve_dns(route)

    async def _resolve_dns(self, route: Route) -> Target:
        name = f"{route.sandbox_id}.{route.namespace}.svc.{self.cluster_domain}"
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(name, route.port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise DialError(f"resolve {name}: {exc}") from exc
        for _family, _type, _proto, _canon, sockaddr in infos:
            ip = ipaddress.ip_address(sockaddr[0])
            if always_refused(ip) or (ip.is_loopback and not self.allow_loopback):
                continue
            return Target(str(ip), route.port, "dns", f"{name}:{route.port}".encode("ascii"))
        raise DialError(f"resolve {name}: no address the router may dial")

    def invalidate(self, target: Target, *, by_uid: bool) -> bool:
        """Evict a cache entry a dial found dead (router spec §1.9.5); True if something was evicted."""
        if self.cache is None or target.entry is None:
            return False
        entry = target.entry
        if by_uid:
            return self.cache.evict_uid(entry.uid, target.host)
        return self.cache.evict_name(entry.namespace, entry.sandbox, target.host)
