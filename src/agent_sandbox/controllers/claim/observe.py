"""The SandboxClaim controller's observe stage: one pass's `Snapshot`, from the cache and our own writes.

Reads the claim's Sandboxes (named in its status or assignment record, owned by it, or of its name), its
warm pool and their template, as the cache has them or as our own not-yet-observed writes left them
(`store.Freshest`); `decide` sees nothing but this. Two cases ask the API server instead: a takeover whose
answer was lost, and a pool or template the cache does not have (yet).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from agent_sandbox.api.meta import (
    claim_pool_name,
    claim_sandbox_name,
    controlled_by,
    pool_key,
    pool_template_name,
    sandbox_pool_name,
)
from agent_sandbox.kube import (
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    NotFound,
    Object,
    Reader,
    ResourceKind,
)

from ..indexes import INDEX_SANDBOX_CLAIM_UID
from .adoption import is_adoptable
from .decide import Snapshot, assigned_name
from .queue import WarmQueue
from .store import Freshest, Store

__all__ = ["observe", "sandbox_view"]


async def observe(
    claim: Mapping[str, Any],
    now: datetime,
    *,
    store: Store,
    fresh: Freshest,
    authoritative: Reader,
    queue: WarmQueue,
    allowed_domains: tuple[str, ...],
) -> Snapshot:
    """What `decide` needs about `claim`: the Sandboxes it names or owns, its pool and template.

    A takeover that ended without an answer (`Freshest.take_uncertain`) is settled here by one uncached
    read: the member is the claim's if the takeover applied, else it goes back to its pool's queue.
    """
    meta = claim["metadata"]
    ns, uid = meta["namespace"], meta["uid"]
    status_name = claim_sandbox_name(claim)
    assigned, _ = assigned_name(claim)
    owned = {o["metadata"]["name"]: o for o in store.by_index(SANDBOX, INDEX_SANDBOX_CLAIM_UID, uid, ns)}
    for sname in fresh.bound_to(uid):
        view = sandbox_view(store, fresh, ns, sname)
        if controlled_by(view, SANDBOX_CLAIM, uid):
            assert view is not None
            owned[sname] = view
    uncertain = fresh.take_uncertain(uid)
    if uncertain and uncertain not in owned:
        # A takeover ended without an answer: ask the API server whether it applied.
        try:
            live = await authoritative.get(SANDBOX, uncertain, namespace=ns)
        except NotFound:
            live = None
        if controlled_by(live, SANDBOX_CLAIM, uid):
            assert live is not None
            fresh.remember(SANDBOX, live)
            owned[uncertain] = live
        elif live is not None and is_adoptable(live):
            # It did not apply: the member is still free, give it back to its queue.
            node = (live.get("status") or {}).get("nodeName") or ""
            queue.add(pool_key(ns, sandbox_pool_name(live) or ""), uncertain, node)
    owned = {k: (sandbox_view(store, fresh, ns, k) or v) for k, v in owned.items()}
    pool_name = claim_pool_name(claim)
    pool = store.get(SANDBOX_WARM_POOL, ns, pool_name) if pool_name else None
    if pool_name and pool is None:
        pool = await _uncached(authoritative, SANDBOX_WARM_POOL, ns, pool_name)
    template_name = pool_template_name(pool) if pool is not None else ""
    template = store.get(SANDBOX_TEMPLATE, ns, template_name) if template_name else None
    if template_name and template is None:
        template = await _uncached(authoritative, SANDBOX_TEMPLATE, ns, template_name)
    return Snapshot(
        claim=claim,
        now=now,
        status_sandbox=sandbox_view(store, fresh, ns, status_name) if status_name else None,
        assigned=sandbox_view(store, fresh, ns, assigned) if assigned else None,
        owned=tuple(owned.values()),
        same_name=sandbox_view(store, fresh, ns, meta["name"]),
        pool=pool,
        template=template,
        allowed_domains=allowed_domains,
    )


def sandbox_view(store: Store, fresh: Freshest, ns: str, name: str) -> Object | None:
    """The Sandbox `ns/name` as the cache has it, or as our own newer write left it (`Freshest`)."""
    return fresh.view(SANDBOX, ns, name, store.get(SANDBOX, ns, name))


async def _uncached(authoritative: Reader, kind: ResourceKind, ns: str, name: str) -> Object | None:
    """A pool or template the cache lacks, asked of the API server before the claim is told it is missing.

    A claim POSTed right after its pool and template can reach this controller before their watch events
    do; `WarmPoolNotFound` / `TemplateNotFound` would then be a false terminal condition (clients stop
    waiting on it). One uncached GET, only on this miss path; None when it really is not there, or when
    no object can have that name (`_nameable`: asking would only get a 400 and retry it forever).
    """
    if not _nameable(name):
        return None
    try:
        return await authoritative.get(kind, name, namespace=ns)
    except NotFound:
        return None


def _nameable(name: str) -> bool:
    """Whether an object could have `name` as far as a GET by name goes: a valid URL path segment.

    kube-apiserver refuses a GET whose name is ".", ".." or contains "/" or "%" (apimachinery's
    `IsValidPathSegmentName`) with 400 BadRequest before any lookup, and no object is ever created with
    such a name. A claim's `warmPoolRef` and a pool's `sandboxTemplateRef` are free text, so these names
    are "not found" (WarmPoolNotFound / TemplateNotFound, as upstream's cached lookup reports them), known
    without a request. Other invalid names ("Bad_Name") the server answers with an ordinary 404.
    """
    return name not in (".", "..") and "/" not in name and "%" not in name
