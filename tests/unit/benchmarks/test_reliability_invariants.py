"""The burst invariants (benchmarks/reliability/invariants.py) catch each kind of violation they name.

Synthetic final states and audit events: a clean burst passes; a double takeover, an over-created pool
member, a lost claim, a deleted Sandbox and a write after a leader change are each reported.
"""

from __future__ import annotations

from typing import Any

import pytest
from benchmarks.reliability.burst import Settled
from benchmarks.reliability.invariants import check_burst, writes_after

from agent_sandbox.devcluster.audit import AuditEvent, parse_event

pytestmark = pytest.mark.unit

NS = "ns"
READY = {"conditions": [{"type": "Ready", "status": "True"}]}
CTRL = "agent-sandbox-controller/0.1.0"


def owner(kind: str, name: str) -> list[dict[str, Any]]:
    return [{"kind": kind, "name": name, "uid": f"uid-{name}", "controller": True}]


def sandbox(name: str, kind: str, owner_name: str, launch: str = "warm") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"agents.x-k8s.io/launch-type": launch},
                     "ownerReferences": owner(kind, owner_name)},
        "status": READY,
    }  # fmt: skip


def claim(name: str, bound: str, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}"},
            "status": {"sandbox": {"name": bound}, **(READY if ready else {})}}  # fmt: skip


def event(verb: str, name: str, *, code: int = 200, agent: str = CTRL, **raw: Any) -> AuditEvent:
    got = parse_event({
        "stage": "ResponseComplete", "verb": verb, "userAgent": agent,
        "user": {"username": "sa", "extra": {"authentication.kubernetes.io/credential-id": [raw.pop("cred", "")]}},
        "objectRef": {"resource": "sandboxes", "namespace": NS, "name": "" if verb == "create" else name},
        "responseStatus": {"code": code},
        "requestReceivedTimestamp": raw.pop("at", "2026-01-01T00:00:00Z"),
        **raw,
    })  # fmt: skip
    assert got is not None
    return got


def create(name: str, kind: str, owner_name: str) -> AuditEvent:
    return event("create", name, code=201, responseObject={"metadata": {"name": name,
                 "ownerReferences": owner(kind, owner_name)}})  # fmt: skip


def takeover(sb: str, cl: str) -> AuditEvent:
    patch = [{"op": "replace", "path": "/metadata/ownerReferences", "value": owner("SandboxClaim", cl)}]
    return event("patch", sb, requestObject=patch)


def clean() -> tuple[Settled, list[AuditEvent]]:
    """Pool of 1: member m1 adopted by claim a (refill m2), claim b cold."""
    settled = Settled(
        claims=[claim("a", "m1"), claim("b", "b")],
        sandboxes=[
            sandbox("m1", "SandboxClaim", "a"),
            sandbox("m2", "SandboxWarmPool", "pool"),
            sandbox("b", "SandboxClaim", "b", launch="cold"),
        ],
        at=0.0,
        complete=True,
    )
    events = [create("m1", "SandboxWarmPool", "pool"), takeover("m1", "a"),
              create("m2", "SandboxWarmPool", "pool"), create("b", "SandboxClaim", "b")]  # fmt: skip
    return settled, events


def test_a_clean_burst_holds() -> None:
    settled, events = clean()
    check = check_burst(settled, events, namespace=NS, replicas=1)
    assert check.violations == []
    assert (check.warm, check.cold, check.pool_creates, check.expected_creates) == (1, 1, 2, 3)


def test_a_second_takeover_of_the_same_sandbox_is_reported() -> None:
    settled, events = clean()
    check = check_burst(settled, [*events, takeover("m1", "b")], namespace=NS, replicas=1)
    assert "Sandbox m1 taken over by ['a', 'b']" in check.violations
    assert "claim b had a cold Sandbox and took over a warm one" in check.violations


def test_an_over_created_member_is_reported() -> None:
    settled, events = clean()
    extra = [create("m3", "SandboxWarmPool", "pool"), event("delete", "m3")]
    check = check_burst(settled, [*events, *extra], namespace=NS, replicas=1)
    assert any("neither members nor adopted: ['m3']" in v for v in check.violations)
    assert any(v.startswith("4 Sandbox creates, expected 3") for v in check.violations)
    assert "controller deleted 1 Sandboxes: ['m3']" in check.violations


def test_a_lost_claim_and_a_foreign_binding_are_reported() -> None:
    settled, events = clean()
    settled.claims[1] = claim("b", "b", ready=False)
    settled.claims.append(claim("c", "m2"))
    check = check_burst(settled, events, namespace=NS, replicas=1)
    assert "claim b not Ready/bound (sandbox b)" in check.violations
    assert "claim c bound to m2, which it does not control" in check.violations


def test_writes_after_a_leader_change_are_found_by_credential() -> None:
    events = [event("patch", "x", cred="JTI=old", at="2026-01-01T00:00:01Z"),
              event("patch", "y", cred="JTI=old", at="2026-01-01T00:00:05Z"),
              event("patch", "z", cred="JTI=new", at="2026-01-01T00:00:06Z")]  # fmt: skip
    t = events[0].received + 2
    assert [e.name for e in writes_after(events, credential="JTI=old", after=t)] == ["y"]
    assert writes_after(events, credential="JTI=old", after=t, exclude_resources=("sandboxes",)) == []


def test_an_interrupted_create_that_applied_explains_one_sandbox_only() -> None:
    """A create cut short by a dying client is logged as failed though the Sandbox exists (counted once)."""
    settled, events = clean()
    settled.sandboxes[1] = sandbox("pool-x1", "SandboxWarmPool", "pool")
    settled.sandboxes[1]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    body = {"metadata": {"generateName": "pool-", "ownerReferences": owner("SandboxWarmPool", "pool")}}
    status = {"kind": "Status", "status": "Failure", "reason": "Timeout", "code": 504}
    cut = event("create", "", code=504, requestObject=body, responseObject=status,
                stageTimestamp="2026-01-01T00:00:01Z")  # fmt: skip
    events[2] = cut
    check = check_burst(settled, events, namespace=NS, replicas=1)
    assert check.violations == []
    assert (check.interrupted_creates_applied, check.pool_creates, check.expected_creates) == (1, 2, 3)
    # A second Sandbox of the pool with no create of its own is not explained by the same request.
    settled.sandboxes.append(sandbox("pool-x2", "SandboxWarmPool", "pool"))
    settled.sandboxes[-1]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    check = check_burst(settled, events, namespace=NS, replicas=1)
    assert "Sandbox pool-x2 exists but the audit log has no create for it" in check.violations


def test_a_create_the_api_server_died_in_explains_one_sandbox_by_its_generate_name() -> None:
    """kube-apiserver SIGKILLed after committing a create: only its RequestReceived line is logged (no body,
    no response), so the owner is told from the object (the pool's members use generateName `pool-`)."""
    settled, events = clean()
    settled.sandboxes[1] = sandbox("pool-x1", "SandboxWarmPool", "pool")
    settled.sandboxes[1]["metadata"].update(creationTimestamp="2026-01-01T00:00:00Z", generateName="pool-")
    died_in = parse_event({
        "stage": "RequestReceived", "verb": "create", "userAgent": CTRL, "auditID": "a1",
        "objectRef": {"resource": "sandboxes", "namespace": NS},
        "requestReceivedTimestamp": "2026-01-01T00:00:00Z", "stageTimestamp": "2026-01-01T00:00:00Z",
    })  # fmt: skip
    assert died_in is not None
    assert (died_in.finished, died_in.code) == (False, 0)
    events[2] = died_in
    check = check_burst(settled, events, namespace=NS, replicas=1)
    assert check.violations == []
    assert (check.interrupted_creates_applied, check.pool_creates, check.cold_creates) == (1, 2, 1)
    # Without the trace, the same Sandbox came from nowhere.
    check = check_burst(settled, [e for e in events if e.finished], namespace=NS, replicas=1)
    assert "Sandbox pool-x1 exists but the audit log has no create for it" in check.violations
