"""The claim's intent metadata, written before its status names a Sandbox (issue 11).

A CRD's `/status` write ignores metadata, so what upstream has on the claim by the time its status names a
Sandbox (first-observed time, trace context, the warm assignment record; `decide.decide_claim_intent`) is
written first, in one merge patch, never deferred: a client that sees the claim Ready reads its
`sandbox-name` and `controller-first-observed-at` (docs/design/claim-priority.md). The warm path writes it
too, while a takeover is in flight (`warm.WarmPath`'s `before_takeover`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import parse_time
from agent_sandbox.kube import SANDBOX_CLAIM, Client, Tracing

from . import execute as ex
from .decide import decide_claim_intent
from .observability import ObservedTimes
from .status import status_equal
from .store import Freshest, Store

__all__ = ["ClaimGone", "ensure_intent", "first_observed"]


class ClaimGone(Exception):
    """The claim was deleted during the pass (a write to it answered NotFound): the pass ends quietly.

    Raised where a None return cannot carry it (`warm.WarmPath`'s `before_takeover` hook); never reaches
    the controller runtime, which would count it as a reconcile error and retry it with backoff.
    """


async def ensure_intent(
    claim: Mapping[str, Any],
    sandbox: Mapping[str, Any] | None,
    *,
    drop_reference: bool,
    api: Client,
    store: Store,
    fresh: Freshest,
    observed: ObservedTimes,
    now: Callable[[], datetime],
    persist_observed: bool,
    tracing: Tracing,
) -> Mapping[str, Any] | None:
    """Write the claim's intent metadata (`decide_claim_intent`) unless it is there; never deferred.

    Returns the claim to base the status write on: the patch's answer while it carries the status this
    pass decided from (so the status write's resourceVersion guard still catches anyone else's status
    write), else `claim`. None: the claim is gone.
    """
    meta = claim["metadata"]
    ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
    view = fresh.view(SANDBOX_CLAIM, ns, name, store.get(SANDBOX_CLAIM, ns, name))
    if view is None or view["metadata"].get("uid") != uid:
        view = dict(claim)
    patch = decide_claim_intent(
        view,
        sandbox=sandbox,
        first_observed=first_observed(observed, view, now),
        persist_observed=persist_observed,
        trace_context=tracing.current_context_annotation() if tracing.enabled else "",
        drop_reference=drop_reference,
    )
    if not patch.empty:
        body = patch.body()
        body["metadata"]["uid"] = uid  # never lands on a recreated claim of the same name (422)
        updated = await ex.patch_claim_metadata(api, view, body)
        if updated is None:
            return None
        fresh.remember(SANDBOX_CLAIM, updated)
        view = updated
    if view is claim or not status_equal(view.get("status") or {}, claim.get("status") or {}):
        return claim
    return view


def first_observed(
    observed: ObservedTimes, claim: Mapping[str, Any], now: Callable[[], datetime]
) -> datetime:
    """When the controller first saw `claim`: this process's record, else the one persisted on the claim
    (an earlier process's), else `now()`."""
    meta = claim["metadata"]
    ann = meta.get("annotations") or {}
    return (
        observed.get(meta["namespace"], meta["name"], meta["uid"])
        or parse_time(ann.get(c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT))
        or now()
    )
