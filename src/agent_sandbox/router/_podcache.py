"""The watch-backed Pod cache (`--cache-enabled`, router spec §1.9), with the indexes our checks need.

Owns: one `kube.Informer` over Pods labelled `agents.x-k8s.io/sandbox-name-hash` with a pod IP
(`status.podIP!=`, resync 10 min), cluster-wide or in `--cache-namespace`, and four indexes rebuilt
from its events:

- `by_uid`: controlling Sandbox UID -> entry, Ready pods only (upstream's cache key);
- `by_name`: (namespace, Sandbox name) -> entry, Ready pods that are not unclaimed warm-pool members
  (`agents.x-k8s.io/warm-pool-sandbox` absent: pool members are reachable by UID only);
- `warm_by_name`: (namespace, Sandbox name) -> entry, Ready pods still labelled as unclaimed pool members
  (the resolver asks the API server whether their Sandbox was claimed meanwhile: `_resolve.ClaimedCheck`);
- `by_ip`: pod IP -> entry, every tracked pod, Ready or not (who owns an address);
- `known`: (namespace, Sandbox name) of every tracked pod (is this name a sandbox at all);
- `former`: pod IP -> (namespace, Sandbox name) for addresses whose pod went away and that no pod holds
  now (bounded): a client holding a stale address of a suspended-and-resumed sandbox can be told apart
  from one naming an address that never was that sandbox's.

A Pod is tracked only with a controller ownerReference of kind `Sandbox` in group `agents.x-k8s.io`
(any version). The Sandbox name is that owner's name (upstream uses the Pod name; they differ only for
Sandboxes with the legacy `agents.x-k8s.io/pod-name` annotation, where the owner name is what clients
send as `X-Sandbox-ID`).

Active invalidation (`evict`) removes an entry a dial found dead; the next informer event restores it.
Waiters (`wait_changed`) are woken on every change, so a request that names a pod the watch has not
delivered yet can wait for it instead of failing.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from ..api.constants import GROUP, LABEL_SANDBOX_NAME_HASH, LABEL_WARM_POOL_SANDBOX
from ..kube import POD, HandlerFuncs, Informer, ListWatcher, Object
from ._changes import Changes

__all__ = ["INITIAL_SYNC_ERROR", "PodCache", "PodEntry"]

log = logging.getLogger("agent_sandbox.router.podcache")

INITIAL_SYNC_ERROR = "pod cache failed initial sync (check RBAC for pods get/list/watch)"
RESYNC_PERIOD = 600.0
FORMER_LIMIT = 65536


@dataclass(frozen=True, slots=True)
class PodEntry:
    """What the router knows about one sandbox Pod."""

    ip: str
    pod: str
    namespace: str
    sandbox: str
    uid: str
    """The controlling Sandbox's UID."""
    ready: bool
    warm: bool
    """An unclaimed warm-pool member (reachable by UID only)."""
    pod_uid: str = ""
    """The Pod's own UID (tells a recreated pod from the one a dial just failed on)."""
    restarts: int = 0
    """Container restarts (tells a pod whose container came back from the one a dial just failed on)."""
    deleting: bool = False
    """The Pod has a deletionTimestamp (a suspend or a delete is taking it away; it may still be Ready)."""


def entry_for(pod: Object) -> PodEntry | None:
    """The cache entry of `pod`, or None if it is not a Sandbox's pod or has no IP."""
    meta = pod.get("metadata") or {}
    owner = next(
        (
            ref
            for ref in meta.get("ownerReferences") or ()
            if ref.get("controller")
            and ref.get("kind") == "Sandbox"
            and str(ref.get("apiVersion", "")).split("/")[0] == GROUP
        ),
        None,
    )
    status = pod.get("status") or {}
    ip = status.get("podIP") or ""
    if owner is None or not ip or not owner.get("uid") or not owner.get("name"):
        return None
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )
    labels = meta.get("labels") or {}
    return PodEntry(
        ip=ip,
        pod=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        sandbox=str(owner["name"]),
        uid=str(owner["uid"]),
        ready=ready,
        warm=LABEL_WARM_POOL_SANDBOX in labels,
        pod_uid=str(meta.get("uid", "")),
        restarts=sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or ()),
        deleting=bool(meta.get("deletionTimestamp")),
    )


class PodCache:
    """Sandbox pods by owner UID, Sandbox name and IP; run with `await cache.run()`."""

    def __init__(self, lw: ListWatcher, *, namespace: str | None = None) -> None:
        self.namespace = namespace or None
        self.informer = Informer(
            lw,
            POD,
            namespace=namespace or None,
            label_selector=LABEL_SANDBOX_NAME_HASH,
            field_selector="status.podIP!=",
            resync_period=RESYNC_PERIOD,
        )
        self.informer.add_handler(HandlerFuncs(add=self._upsert, update=self._update, delete=self._delete))
        self.by_uid: dict[str, PodEntry] = {}
        self.by_name: dict[tuple[str, str], PodEntry] = {}
        self.warm_by_name: dict[tuple[str, str], PodEntry] = {}
        self.by_ip: dict[str, PodEntry] = {}
        self.known: dict[tuple[str, str], int] = {}
        self.former: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._pods: dict[tuple[str, str], PodEntry] = {}
        self._changes = Changes()

    async def run(self) -> None:
        await self.informer.run()

    async def wait_synced(self) -> None:
        """Wait for the initial list (bound it with `asyncio.timeout`)."""
        await self.informer.wait_for_sync()

    @property
    def synced(self) -> bool:
        return self.informer.has_synced

    # ------------------------------------------------------------------ lookups

    def covers(self, namespace: str) -> bool:
        """The cache watches `namespace` (all namespaces unless `--cache-namespace`)."""
        return self.namespace is None or self.namespace == namespace

    def sandbox_known(self, namespace: str, name: str) -> bool:
        """Some tracked pod (Ready or not, claimed or not) belongs to Sandbox `namespace/name`."""
        return (namespace, name) in self.known

    async def wait_changed(self) -> None:
        """Return at the next change of the cache (bound it with `asyncio.timeout`)."""
        await self._changes.wait()

    # ------------------------------------------------------------------ invalidation

    def evict_uid(self, uid: str, ip: str) -> bool:
        """Drop the UID entry if it still points at `ip` (a dial to it found the host dead)."""
        entry = self.by_uid.get(uid)
        if entry is None or entry.ip != ip:
            return False
        del self.by_uid[uid]
        if self.by_name.get((entry.namespace, entry.sandbox)) is entry:
            del self.by_name[(entry.namespace, entry.sandbox)]
        return True

    def evict_name(self, namespace: str, name: str, ip: str) -> bool:
        """Drop the name entry only if it still holds the failed IP."""
        entry = self.by_name.get((namespace, name))
        if entry is None or entry.ip != ip:
            return False
        del self.by_name[(namespace, name)]
        return True

    # ------------------------------------------------------------------ informer events

    def _remove(self, key: tuple[str, str]) -> None:
        old = self._pods.pop(key, None)
        if old is None:
            return
        if self.by_uid.get(old.uid) is old:
            del self.by_uid[old.uid]
        name_key = (old.namespace, old.sandbox)
        if self.by_name.get(name_key) is old:
            del self.by_name[name_key]
        if self.warm_by_name.get(name_key) is old:
            del self.warm_by_name[name_key]
        if self.by_ip.get(old.ip) is old:
            del self.by_ip[old.ip]
            self.former[old.ip] = (old.namespace, old.sandbox)
            self.former.move_to_end(old.ip)
            if len(self.former) > FORMER_LIMIT:
                self.former.popitem(last=False)
        count = self.known.get(name_key, 0) - 1
        if count > 0:
            self.known[name_key] = count
        else:
            self.known.pop(name_key, None)

    def _upsert(self, pod: Object) -> None:
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        entry = entry_for(pod)
        changed = entry != self._pods.get(key)
        # Re-index even when unchanged: a resync restores entries a failed dial evicted.
        self._remove(key)
        if entry is not None:
            self._pods[key] = entry
            self.by_ip[entry.ip] = entry
            self.former.pop(entry.ip, None)
            name_key = (entry.namespace, entry.sandbox)
            self.known[name_key] = self.known.get(name_key, 0) + 1
            if entry.ready:
                self.by_uid[entry.uid] = entry
                if not entry.warm:
                    self.by_name[name_key] = entry
                else:
                    self.warm_by_name[name_key] = entry
        if changed:
            self._changes.notify()

    def _update(self, _old: Object, new: Object) -> None:
        self._upsert(new)

    def _delete(self, pod: Object) -> None:
        meta = pod.get("metadata") or {}
        self._remove((str(meta.get("namespace", "")), str(meta.get("name", ""))))
        self._changes.notify()
