"""What must hold after a claim burst, checked against the final objects and the API server's audit log.

Owns: `check_burst` (the claim/pool invariants of controllers spec §4.6 "concurrency properties" and
§3.11, counted from outside the controller) and `writes_after` (writes a deposed leader sent after its
successor started). Every check returns counts and a list of violations (empty = held), so a CI test can
assert on it and a long trial can report it.

The invariants, for one namespace holding one pool and a burst of claims against it:

* no lost claim: every claim Ready and bound (`status.sandbox.name`);
* no Sandbox bound to two claims: the bound names are distinct, each bound Sandbox is controlled by its
  claim, and the audit log shows no Sandbox taken over twice;
* no claim bound twice: no claim took over two Sandboxes, or took one over and also had one created cold;
* creates == replicas + refills + cold claims: every Sandbox the pool created is still a member or was
  adopted by a claim (none was created and then deleted as excess); every cold Sandbox belongs to its
  claim; the pool is whole again;
* no Sandbox deleted by the controller (nothing in a burst expires or is excess).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import controller_ref
from agent_sandbox.devcluster.audit import (
    AuditEvent,
    interrupted_sandbox_creates,
    ownership_transfers,
    sandbox_creates,
    writes,
)
from agent_sandbox.kube import Object

from .burst import Settled, is_ready

__all__ = ["CONTROLLER_AGENT", "BurstCheck", "check_burst", "writes_after"]

CONTROLLER_AGENT = "agent-sandbox-controller/"


@dataclass
class BurstCheck:
    """Counts and violations of one burst (`ok` when there are no violations)."""

    claims: int = 0
    ready: int = 0
    warm: int = 0
    cold: int = 0
    pool_creates: int = 0
    cold_creates: int = 0
    other_creates: int = 0
    interrupted_creates_applied: int = 0  # logged as failed (the client died), yet the Sandbox exists
    expected_creates: int = 0
    transfers: int = 0
    controller_sandbox_deletes: int = 0
    pool_ready: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _bound(claim: Object) -> str:
    return str(((claim.get("status") or {}).get("sandbox") or {}).get("name") or "")


def check_burst(
    settled: Settled,
    events: Sequence[AuditEvent],
    *,
    namespace: str,
    replicas: int,
    pool: str = "pool",
    max_listed: int = 10,
) -> BurstCheck:
    """Check one settled burst (see the module docstring); `events` must span the whole burst."""
    out = BurstCheck(claims=len(settled.claims))
    bad = out.violations
    by_name = {sb["metadata"]["name"]: sb for sb in settled.sandboxes}

    # -- no lost claim; bindings point at Sandboxes their claim controls
    bound: dict[str, str] = {}
    for claim in settled.claims:
        name, target = claim["metadata"]["name"], _bound(claim)
        out.ready += is_ready(claim)
        if not target or not is_ready(claim):
            bad.append(f"claim {name} not Ready/bound (sandbox {target or '-'})")
            continue
        bound[name] = target
        sb = by_name.get(target)
        ref = controller_ref(sb["metadata"]) if sb else None
        if ref is None or ref.get("kind") != "SandboxClaim" or ref.get("uid") != claim["metadata"]["uid"]:
            bad.append(f"claim {name} bound to {target}, which it does not control")
    bad.extend(f"Sandbox {s} bound by {k} claims" for s, k in Counter(bound.values()).items() if k > 1)

    # -- what was created, by whom, and what happened to it
    creates = sandbox_creates(events, namespace)
    names = [e.created_name() for e in creates]
    bad.extend(f"Sandbox {n} created {k} times" for n, k in Counter(names).items() if k > 1)
    kinds = {e.created_name(): e.created_owner_kind() for e in creates}
    # Creates cut short by a dying client are logged as failures though the write may have applied: each
    # Sandbox with no logged create must be explained by one of them, else it came from nowhere.
    applied = _applied_interrupted(
        {n: sb for n, sb in by_name.items() if n not in kinds},
        interrupted_sandbox_creates(events, namespace),
        pool=pool,
    )
    out.interrupted_creates_applied = len(applied)
    kinds.update(applied)
    bad.extend(
        f"Sandbox {n} exists but the audit log has no create for it" for n in by_name if n not in kinds
    )
    pool_created = {n for n, k in kinds.items() if k == "SandboxWarmPool"}
    cold_created = {n for n, k in kinds.items() if k == "SandboxClaim"}
    out.pool_creates, out.cold_creates = len(pool_created), len(cold_created)
    out.other_creates = len(kinds) - len(pool_created) - len(cold_created)
    if out.other_creates:
        bad.append(f"{out.other_creates} Sandbox creates with another owner")

    transfers = ownership_transfers(events, namespace, "SandboxClaim")
    out.transfers = len(transfers)
    per_sandbox: dict[str, set[str]] = defaultdict(set)
    per_claim: dict[str, set[str]] = defaultdict(set)
    for sandbox, taker in transfers:
        per_sandbox[sandbox].add(taker)
        per_claim[taker].add(sandbox)
    bad.extend(f"Sandbox {s} taken over by {sorted(cl)}" for s, cl in per_sandbox.items() if len(cl) > 1)
    bad.extend(f"claim {cl} took over {sorted(s)}" for cl, s in per_claim.items() if len(s) > 1)
    bad.extend(
        f"claim {n} had a cold Sandbox and took over a warm one" for n in cold_created & set(per_claim)
    )

    members = {
        n
        for n, sb in by_name.items()
        if (ref := controller_ref(sb["metadata"])) is not None
        and ref.get("kind") == "SandboxWarmPool"
        and ref.get("name") == pool
    }
    out.pool_ready = sum(1 for n in members if is_ready(by_name[n]))
    warm = {cl: s for cl, s in bound.items() if s in pool_created}
    cold = {cl: s for cl, s in bound.items() if s in cold_created}
    out.warm, out.cold = len(warm), len(cold)
    for cl, s in bound.items():
        if cl not in warm and cl not in cold:
            bad.append(f"claim {cl} bound to {s}, created by neither the pool nor the claim")
        elif cl in warm and (by_name[s]["metadata"].get("labels") or {}).get(c.LABEL_LAUNCH_TYPE) != "warm":
            bad.append(f"claim {cl}: adopted Sandbox {s} lacks launch-type=warm")
    vanished = sorted(pool_created - members - set(warm.values()))
    if vanished:
        bad.append(
            f"{len(vanished)} pool-created Sandboxes are neither members nor adopted: {vanished[:max_listed]}"
        )
    unclaimed_cold = sorted(cold_created - set(cold.values()))
    if unclaimed_cold:
        bad.append(f"{len(unclaimed_cold)} cold Sandboxes bound to no claim: {unclaimed_cold[:max_listed]}")
    if len(members) != replicas or out.pool_ready != replicas:
        bad.append(f"pool has {len(members)} members ({out.pool_ready} Ready), wants {replicas}")
    out.expected_creates = replicas + out.warm + out.cold
    if len(kinds) != out.expected_creates:
        bad.append(
            f"{len(kinds)} Sandbox creates, expected {out.expected_creates} "
            f"(replicas {replicas} + refills {out.warm} + cold {out.cold})"
        )

    deletes = [
        e
        for e in writes(events, namespace=namespace, user_agent_prefix=CONTROLLER_AGENT, resource="sandboxes")
        if e.verb == "delete" and e.succeeded
    ]
    out.controller_sandbox_deletes = len(deletes)
    if deletes:
        bad.append(f"controller deleted {len(deletes)} Sandboxes: {[e.name for e in deletes][:max_listed]}")
    return out


def _applied_interrupted(
    unlogged: dict[str, Object], interrupted: Sequence[AuditEvent], *, pool: str
) -> dict[str, str]:
    """Match Sandboxes without a logged create to interrupted creates (name or generateName prefix, and a
    creationTimestamp within the request's lifetime); each create explains at most one. Name -> owner kind.

    A create kube-apiserver died in has no body logged (it is decoded after RequestReceived): any name
    matches it, and the owner is told from the object: the pool names its members with generateName
    `<pool>-`, a claim names its cold Sandbox itself.
    """
    out: dict[str, str] = {}
    left = list(interrupted)
    for name, sb in sorted(unlogged.items()):
        meta = sb["metadata"]
        created = _epoch(meta.get("creationTimestamp"))
        for event in left:
            want, prefix = event.requested_name()
            if event.request is None:
                named = not event.name or event.name == name
            else:
                named = name == want or bool(prefix and not want and name.startswith(prefix))
            if named and event.received - 1.0 <= created <= event.completed + 5.0:
                if event.request is None:
                    generated = meta.get("generateName") == f"{pool}-"
                    out[name] = "SandboxWarmPool" if generated else "SandboxClaim"
                else:
                    out[name] = event.created_owner_kind()
                left.remove(event)
                break
    return out


def _epoch(value: str | None) -> float:
    if not value:
        return 0.0
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def writes_after(
    events: Iterable[AuditEvent], *, credential: str, after: float, exclude_resources: Sequence[str] = ()
) -> list[AuditEvent]:
    """Writes sent with token `credential` that the API server received after epoch `after`."""
    return [
        e
        for e in events
        if e.is_write
        and e.credential_id == credential
        and e.received > after
        and e.resource not in exclude_resources
    ]
