"""The lifecycle controller's observe stage: one pass's `Snapshot`, read from the cache only.

Kept apart from the executor: reading never writes, and `decide` sees nothing but what is read here (the
runtime's activity is added by the reconciler, when `decide` asks for it with `Probe`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import controller_name
from agent_sandbox.kube import (
    PVC,
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SERVICE,
    Client,
    NotFound,
    Object,
    Request,
    ResourceKind,
)

from .decide import Snapshot

__all__ = ["CHILD_KINDS", "observe"]

# The children a hibernated Sandbox keeps in its archive, by the `kind` its archive records.
CHILD_KINDS: Mapping[str, ResourceKind] = {"PersistentVolumeClaim": PVC, "Service": SERVICE}


async def _get(client: Client, kind: ResourceKind, name: str, namespace: str) -> Object | None:
    try:
        return await client.get(kind, name, namespace=namespace)
    except NotFound:
        return None


async def observe(
    client: Client,
    request: Request,
    *,
    extensions: bool,
    probe_enabled: bool,
    now: Callable[[], datetime],
) -> Snapshot:
    """What `decide` needs about one name: its Sandbox and/or archive, their template's annotations and
    claim (`extensions` only), and their children; `now` is read once, for the whole pass."""
    ns, name = request.namespace, request.name
    sandbox = await _get(client, SANDBOX, name, ns)
    archive = await _get(client, lc.ARCHIVE, name, ns)
    subject = (archive.get("spec") or {}).get("sandbox") if archive is not None else sandbox
    template_annotations: Mapping[str, str] | None = None
    claim: Object | None = None
    if extensions and subject is not None:
        template_name = lc.template_name_of(subject)
        if template_name:
            template = await _get(client, SANDBOX_TEMPLATE, template_name, ns)
            if template is not None:
                template_annotations = template["metadata"].get("annotations") or {}
        claim_name = controller_name(subject, SANDBOX_CLAIM)
        if claim_name:
            claim = await _get(client, SANDBOX_CLAIM, claim_name, ns)
    return Snapshot(
        now=now(),
        sandbox=sandbox,
        archive=archive,
        template_annotations=template_annotations,
        claim=claim,
        children=await _children(client, sandbox, archive, ns),
        probe_enabled=probe_enabled,
    )


async def _children(
    client: Client, sandbox: Object | None, archive: Object | None, ns: str
) -> tuple[Object, ...]:
    """The archive's children while one exists, else the PVCs and Service the Sandbox controls."""
    if archive is not None:
        wanted = [(str(ch.get("kind")), str(ch.get("name"))) for ch in archive["spec"].get("children") or []]
        found = []
        for kind, name in wanted:
            if kind in CHILD_KINDS and (obj := await _get(client, CHILD_KINDS[kind], name, ns)) is not None:
                found.append({**obj, "kind": kind})
        return tuple(found)
    if sandbox is None:
        return ()
    name, uid = sandbox["metadata"]["name"], sandbox["metadata"].get("uid")
    names = [
        (PVC, f"{(t.get('metadata') or {}).get('name')}-{name}")
        for t in sandbox["spec"].get("volumeClaimTemplates") or []
    ]
    names.append((SERVICE, name))
    found = []
    for child_kind, child in names:
        obj = await _get(client, child_kind, child, ns)
        if obj is None:
            continue
        ref = next((r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
        if ref is not None and ref.get("uid") == uid:
            found.append({**obj, "kind": child_kind.kind})
    return tuple(found)
