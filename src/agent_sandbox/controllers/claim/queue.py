"""The in-memory warm-candidate queue: per-pool (keyed by `api.meta.pool_key`), ordered, de-duplicated, with atomic take (controllers spec §4.2).

Owns: which pool members a claim may adopt next, in what order (§4.5.2: node spread, then FIFO), and the
reservation that makes a take exclusive. A process-local structure rebuilt from the Sandbox informer
(its initial listing replays every member as an add), never persisted, never listed from the API.

Concurrency: every method is synchronous and the controller runs on one asyncio event loop, so each call
is atomic with respect to the claim workers. `take()` judges candidates and reserves the chosen one in the
same call: two workers can never receive the same key. A reserved key stays out of the queue until the
adoption outcome is known (`release(requeue=...)`), so informer updates arriving meanwhile (a nodeName
refresh, say) cannot hand it to a second worker either. This is a latency measure, not the safety net:
the takeover patch itself is guarded server-side (`adoption.adoption_patch`).

Order (§4.5.2): while any queued key has a nodeName, pick from the node holding the most queued keys
(least used node first), first in queue order among ties; then unscheduled keys FIFO. Picking is
O(nodes) per candidate: per-node buckets are kept in queue order and walked lazily.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field

from .adoption import Verdict

__all__ = ["Take", "WarmQueue"]


@dataclass(frozen=True, slots=True)
class Take:
    """Outcome of `WarmQueue.take`: the reserved candidate (or None) and how many were skipped for IPs."""

    name: str | None
    pending: int = 0


@dataclass(slots=True)
class _Pool:
    seq_of: dict[str, int] = field(default_factory=dict)  # queued name -> position
    node_of: dict[str, str] = field(default_factory=dict)  # queued name -> nodeName ("" unscheduled)
    by_node: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> {name: seq}, seq order
    reserved: dict[str, tuple[int, str]] = field(default_factory=dict)  # in flight: name -> (seq, node)
    waiters: set[Hashable] = field(default_factory=set)

    def insert(self, name: str, seq: int, node: str) -> None:
        self.seq_of[name] = seq
        self.node_of[name] = node
        bucket = self.by_node.setdefault(node, {})
        if bucket and next(reversed(bucket.values())) > seq:
            # Rare (a key moved to another node, or a reservation came back): restore queue order.
            bucket[name] = seq
            self.by_node[node] = dict(sorted(bucket.items(), key=lambda kv: kv[1]))
        else:
            bucket[name] = seq

    def discard(self, name: str) -> None:
        if name in self.seq_of:
            del self.seq_of[name]
            bucket = self.by_node[self.node_of.pop(name)]
            del bucket[name]

    def order(self) -> Iterator[str]:
        """Keys in pick order, as if each were removed once yielded (the queue itself is untouched)."""
        counts = {node: len(b) for node, b in self.by_node.items() if node and b}
        walkers = {node: iter(self.by_node[node].items()) for node in counts}
        heads = {node: next(walkers[node]) for node in counts}
        while counts:
            most = max(counts.values())
            node = min((n for n, k in counts.items() if k == most), key=lambda n: heads[n][1])
            yield heads[node][0]
            counts[node] -= 1
            if counts[node]:
                heads[node] = next(walkers[node])
            else:
                del counts[node], heads[node]
        yield from list(self.by_node.get("", {}))


class WarmQueue:
    """Warm candidates per pool; see the module docstring."""

    def __init__(self) -> None:
        self._pools: dict[str, _Pool] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(len(p.seq_of) for p in self._pools.values())

    def size(self, queue: str) -> int:
        pool = self._pools.get(queue)
        return len(pool.seq_of) if pool else 0

    def names(self, queue: str) -> list[str]:
        """Queued keys in pick order (reserved ones excluded)."""
        pool = self._pools.get(queue)
        return list(pool.order()) if pool else []

    def add(self, queue: str, name: str, node: str = "") -> None:
        """Append `name` if new; if present (queued or reserved) only refresh its nodeName, keeping its place."""
        pool = self._pools.setdefault(queue, _Pool())
        if name in pool.reserved:
            seq, _ = pool.reserved[name]
            pool.reserved[name] = (seq, node)
        elif name in pool.seq_of:
            if pool.node_of[name] != node:
                seq = pool.seq_of[name]
                pool.discard(name)
                pool.insert(name, seq, node)
        else:
            pool.insert(name, next(self._seq), node)

    def remove(self, queue: str, name: str) -> None:
        """Forget `name` (queued or reserved); no-op if absent."""
        pool = self._pools.get(queue)
        if pool is not None:
            pool.discard(name)
            pool.reserved.pop(name, None)

    def remove_queue(self, queue: str) -> None:
        """Drop a whole pool (its SandboxWarmPool was deleted)."""
        self._pools.pop(queue, None)

    def take(self, queue: str, judge: Callable[[str], Verdict]) -> Take:
        """Judge keys in pick order and reserve the first Ready one (else the first networked one).

        Discarded keys are dropped; pending and kept keys stay where they are. Synchronous: atomic.
        """
        pool = self._pools.get(queue)
        if pool is None:
            return Take(None)
        chosen: str | None = None
        fallback: str | None = None
        pending = 0
        dropped: list[str] = []
        for name in pool.order():
            verdict = judge(name)
            if verdict is Verdict.ADOPT:
                chosen = name
                break
            if verdict is Verdict.FALLBACK:
                fallback = fallback or name
            elif verdict is Verdict.PENDING:
                pending += 1
            elif verdict is Verdict.DISCARD:
                dropped.append(name)
        for name in dropped:
            pool.discard(name)
        pick = chosen or fallback
        if pick is None:
            return Take(None, pending)
        pool.reserved[pick] = (pool.seq_of[pick], pool.node_of[pick])
        pool.discard(pick)
        return Take(pick, pending)

    def release(self, queue: str, name: str, *, requeue: bool) -> None:
        """End a reservation: put the key back in its old place (`requeue`) or drop it (adopted/gone)."""
        pool = self._pools.get(queue)
        if pool is None:
            return
        held = pool.reserved.pop(name, None)
        if held is not None and requeue:
            pool.insert(name, *held)

    def wait(self, queue: str, waiter: Hashable) -> None:
        """Register `waiter` (a claim request) to be woken when a member of `queue` becomes usable."""
        self._pools.setdefault(queue, _Pool()).waiters.add(waiter)

    def pop_waiters(self, queue: str) -> set[Hashable]:
        pool = self._pools.get(queue)
        if pool is None or not pool.waiters:
            return set()
        waiters, pool.waiters = pool.waiters, set()
        return waiters
