"""Parsing the API server's audit log (devcluster/audit.py): stages, attribution, incremental reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.devcluster.audit import AuditLog, ownership_transfers, parse_event, sandbox_creates, writes

pytestmark = pytest.mark.unit


def line(**changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "stage": "ResponseComplete",
        "verb": "patch",
        "user": {
            "username": "system:serviceaccount:agent-sandbox-system:agent-sandbox-controller",
            "extra": {"authentication.kubernetes.io/credential-id": ["JTI=abc"]},
        },
        "userAgent": "agent-sandbox-controller/0.1.0",
        "objectRef": {
            "resource": "sandboxes",
            "namespace": "ns",
            "name": "sb",
            "apiGroup": "agents.x-k8s.io",
        },
        "responseStatus": {"metadata": {}, "code": 200},
        "requestReceivedTimestamp": "2026-01-01T00:00:00.000001Z",
        "stageTimestamp": "2026-01-01T00:00:00.500000Z",
    }
    event.update(changes)
    return event


def test_parse_keeps_attribution_and_times() -> None:
    event = parse_event(line())
    assert event is not None
    assert (event.verb, event.resource, event.namespace, event.name, event.code) == (
        "patch", "sandboxes", "ns", "sb", 200,
    )  # fmt: skip
    assert event.credential_id == "JTI=abc"
    assert event.user_agent.startswith("agent-sandbox-controller/")
    assert event.completed - event.received == pytest.approx(0.499999)
    assert event.is_write
    assert event.succeeded
    assert parse_event(line(stage="ResponseStarted")) is None


def test_generated_names_and_owners_come_from_the_response() -> None:
    response = {"metadata": {"name": "pool-x7k2p", "ownerReferences": [
        {"kind": "SandboxWarmPool", "name": "pool", "controller": True}]}}  # fmt: skip
    ref = {"resource": "sandboxes", "namespace": "ns", "apiGroup": "agents.x-k8s.io"}
    event = parse_event(
        line(verb="create", objectRef=ref, responseStatus={"code": 201}, responseObject=response)
    )
    assert event is not None
    assert event.created_name() == "pool-x7k2p"
    assert event.created_owner_kind() == "SandboxWarmPool"
    assert sandbox_creates([event], "ns") == [event]
    assert sandbox_creates([event], "other") == []


def test_incremental_reads_skip_a_half_written_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path)
    assert log.mark() == 0
    assert log.since(0) == []  # no file yet
    path.write_text(json.dumps(line(verb="create", responseStatus={"code": 409})) + "\n")
    mark = log.mark()
    with path.open("a") as fh:
        fh.write(json.dumps(line(verb="delete")) + "\n" + json.dumps(line())[:40])
    events = log.since(0)
    assert [e.verb for e in events] == ["create", "delete"]
    assert [e.verb for e in log.since(mark)] == ["delete"]
    assert writes(events, user_agent_prefix="kubectl") == []
    assert len(writes(events, namespace="ns", resource="sandboxes")) == 2


def test_ownership_transfers_from_json_and_merge_patches() -> None:
    claim_ref = {"kind": "SandboxClaim", "name": "c1", "controller": True}
    takeover = [
        {"op": "test", "path": "/metadata/ownerReferences", "value": []},
        {"op": "replace", "path": "/metadata/ownerReferences", "value": [claim_ref]},
    ]

    def on(name: str, **extra: str) -> dict[str, str]:
        return {"resource": "sandboxes", "namespace": "ns", "name": name, **extra}

    events = [
        parse_event(line(objectRef=on("m1"), requestObject=takeover)),
        parse_event(line(objectRef=on("m2"), requestObject={"metadata": {"ownerReferences": [claim_ref]}})),
        parse_event(line(objectRef=on("m3"), requestObject=takeover, responseStatus={"code": 422})),
        parse_event(line(objectRef=on("m4"), requestObject={"metadata": {"labels": {"a": "b"}}})),
        parse_event(line(objectRef=on("m5", subresource="status"), requestObject=takeover)),
    ]
    transfers = ownership_transfers([e for e in events if e is not None], "ns", "SandboxClaim")
    assert transfers == [("m1", "c1"), ("m2", "c1")]
    assert ownership_transfers([e for e in events if e is not None], "ns", "SandboxWarmPool") == []


def test_a_received_request_without_a_response_is_reported_only_when_asked(tmp_path: Path) -> None:
    """The server died between RequestReceived and ResponseComplete: the request stays unfinished."""
    path = tmp_path / "audit.log"
    received = {"stage": "RequestReceived", "verb": "create", "responseStatus": None}
    lines = [
        line(**received, auditID="done"),
        line(verb="create", auditID="done", responseStatus={"code": 201}),
        line(**received, auditID="died"),
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    log = AuditLog(path)
    assert [(e.audit_id, e.finished) for e in log.since(0)] == [("done", True)]
    events = log.since(0, unfinished=True)
    assert [(e.audit_id, e.finished, e.code) for e in events] == [("done", True, 201), ("died", False, 0)]
