"""Read the dev cluster's kube-apiserver audit log: who wrote what, counted outside the controller.

Owns: parsing `logs/audit.log` (JSON lines, written with `ClusterConfig(audit_log=True)`, policy in
`config.audit_policy_yaml`) into `AuditEvent`s, reading it incrementally (`AuditLog.mark()` /
`AuditLog.since(mark)`), and the selections reliability checks need (writes by a client, Sandbox creates
with their owner). `ResponseComplete` events are kept, one per finished request; a request logged at
`RequestReceived` (Sandbox creates only, by the policy) that never finished is reported only when asked
(`since(mark, unfinished=True)`): kube-apiserver was killed while it was in flight.

Attribution: `user` is the authenticated user (`admin` for the admin certificate, a ServiceAccount name
for token clients), `user_agent` the client's User-Agent (the controller sends `agent-sandbox-controller/...`),
`credential_id` the token's ID (`JTI=...`), so two replicas that run with two tokens of the same
ServiceAccount are told apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = [
    "WRITE_VERBS",
    "AuditEvent",
    "AuditLog",
    "interrupted_sandbox_creates",
    "ownership_transfers",
    "parse_event",
    "sandbox_creates",
    "writes",
]

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
_CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


def _epoch(value: str | None) -> float:
    if not value:
        return 0.0
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One API request: finished (stage ResponseComplete), or received and never finished (code 0)."""

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    user: str
    user_agent: str
    credential_id: str
    received: float  # epoch seconds, when the API server received the request
    completed: float  # epoch seconds, when it finished
    response: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    request: Any = field(default=None, compare=False, repr=False)  # the body (a patch, for patches)
    audit_id: str = field(default="", compare=False, repr=False)
    finished: bool = True  # False: logged at RequestReceived, no ResponseComplete (the server died)

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS

    def created_name(self) -> str:
        """The name of a created object (from the response when the request used generateName)."""
        if self.name:
            return self.name
        return str(((self.response or {}).get("metadata") or {}).get("name") or "")

    def created_owner_kind(self) -> str:
        """Kind of the controlling owner of a created object ("" when unknown or none).

        From the response; from the request body when the request did not succeed (an interrupted create
        answers a Status, though its write may have applied).
        """
        body = self.response if self.succeeded else self.request
        meta = body.get("metadata") if isinstance(body, dict) else None
        for ref in (meta or {}).get("ownerReferences") or ():
            if ref.get("controller"):
                return str(ref.get("kind") or "")
        return ""

    def requested_name(self) -> tuple[str, str]:
        """(name, generateName) of the object a create asked for, from the request body."""
        meta = (self.request.get("metadata") if isinstance(self.request, dict) else None) or {}
        return str(meta.get("name") or self.name or ""), str(meta.get("generateName") or "")


_STAGES = frozenset({"ResponseComplete", "RequestReceived"})


def parse_event(raw: dict[str, Any]) -> AuditEvent | None:
    """An `AuditEvent` from one decoded log line (ResponseComplete, or RequestReceived with
    `finished=False`); None for other stages."""
    stage = raw.get("stage")
    if stage not in _STAGES:
        return None
    ref = raw.get("objectRef") or {}
    user = raw.get("user") or {}
    creds = (user.get("extra") or {}).get(_CREDENTIAL_ID) or [""]
    return AuditEvent(
        verb=str(raw.get("verb") or ""),
        group=str(ref.get("apiGroup") or ""),
        resource=str(ref.get("resource") or ""),
        subresource=str(ref.get("subresource") or ""),
        namespace=str(ref.get("namespace") or ""),
        name=str(ref.get("name") or ""),
        code=int((raw.get("responseStatus") or {}).get("code") or 0),
        user=str(user.get("username") or ""),
        user_agent=str(raw.get("userAgent") or ""),
        credential_id=str(creds[0]),
        received=_epoch(raw.get("requestReceivedTimestamp")),
        completed=_epoch(raw.get("stageTimestamp")),
        response=raw.get("responseObject"),
        request=raw.get("requestObject"),
        audit_id=str(raw.get("auditID") or ""),
        finished=stage == "ResponseComplete",
    )


class AuditLog:
    """Incremental reader of one audit log file (byte offsets; a half-written last line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        """The current end of the log: `since(mark)` returns only what is written afterwards."""
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def since(self, offset: int = 0, *, unfinished: bool = False) -> list[AuditEvent]:
        """Every finished request logged after byte `offset`, in log order; with `unfinished`, then every
        request received after `offset` that has no response logged (yet: one still in flight counts)."""
        pending: dict[str, AuditEvent] = {}
        out: list[AuditEvent] = []
        for event in self._read(offset):
            if event.finished:
                pending.pop(event.audit_id, None)
                out.append(event)
            else:
                pending[event.audit_id] = event
        return out + list(pending.values()) if unfinished else out

    def _read(self, offset: int) -> Iterator[AuditEvent]:
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            return
        with fh:
            fh.seek(offset)
            for line in fh:
                if not line.endswith(b"\n"):
                    break  # being written
                event = parse_event(json.loads(line))
                if event is not None:
                    yield event


def writes(
    events: Iterable[AuditEvent],
    *,
    namespace: str | None = None,
    user_agent_prefix: str | None = None,
    resource: str | None = None,
) -> list[AuditEvent]:
    """Write requests (any outcome), optionally narrowed by namespace, client and resource."""
    return [
        e
        for e in events
        if e.is_write
        and (namespace is None or e.namespace == namespace)
        and (user_agent_prefix is None or e.user_agent.startswith(user_agent_prefix))
        and (resource is None or e.resource == resource)
    ]


def _is_sandbox_create(e: AuditEvent, namespace: str) -> bool:
    return e.verb == "create" and e.resource == "sandboxes" and not e.subresource and e.namespace == namespace


def sandbox_creates(events: Iterable[AuditEvent], namespace: str) -> list[AuditEvent]:
    """Successful Sandbox creates in `namespace` (each carries its response: name and owner)."""
    return [e for e in events if _is_sandbox_create(e, namespace) and e.succeeded]


def interrupted_sandbox_creates(events: Iterable[AuditEvent], namespace: str) -> list[AuditEvent]:
    """Sandbox creates in `namespace` that did not answer success because the request was cut short.

    When a client dies mid-request (a SIGKILLed controller), kube-apiserver stops waiting for the storage
    write and logs the request as failed (a 5xx, or no code), but the write may still be applied: such a
    create may or may not have made an object, and only the objects can tell. A create kube-apiserver
    itself died in (`finished=False`, read with `since(unfinished=True)`) is the same case, without a body.
    """
    return [e for e in events if _is_sandbox_create(e, namespace) and (e.code == 0 or e.code >= 500)]


def _new_controller(request: Any) -> dict[str, Any] | None:
    """The controlling owner reference a patch or update body sets, if it sets `ownerReferences`."""
    refs: Any = None
    if isinstance(request, list):  # JSON patch
        for op in request:
            if (
                isinstance(op, dict)
                and op.get("path") == "/metadata/ownerReferences"
                and op.get("op")
                in (
                    "add",
                    "replace",
                )
            ):
                refs = op.get("value")
    elif isinstance(request, dict):  # merge patch or full update
        refs = (request.get("metadata") or {}).get("ownerReferences")
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


def ownership_transfers(
    events: Iterable[AuditEvent], namespace: str, owner_kind: str
) -> list[tuple[str, str]]:
    """(Sandbox, owner name) for every successful write that made an `owner_kind` the Sandbox's controller.

    A claim's takeover of a warm member is such a write (a guarded JSON patch); a second one for the same
    Sandbox, or a second Sandbox for the same claim, would be a double binding. Updates that merely repeat
    an unchanged owner (a full-object update by the same controller) count too, so callers compare names.
    """
    out: list[tuple[str, str]] = []
    for e in events:
        if e.resource != "sandboxes" or e.namespace != namespace or e.verb not in ("patch", "update"):
            continue
        if e.subresource or not e.succeeded:
            continue
        ref = _new_controller(e.request)
        if ref is not None and ref.get("kind") == owner_kind:
            out.append((e.name, str(ref.get("name") or "")))
    return out
