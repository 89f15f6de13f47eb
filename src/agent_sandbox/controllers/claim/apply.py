"""The SandboxClaim executor of `decide.resolve`'s binding: the cold create or the bound Sandbox's fixes.

`resolve` names the Sandbox a claim is bound to and the write that binds it; a warm takeover is carried
out before (`warm.WarmPath`), this carries out the rest of a `Resolution` and records what it wrote (our
own writes the cache has not shown yet, the claim's Events, the creation metric). What a failure means
for the claim's status is returned, not raised: the status write still happens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import claim_pool_name
from agent_sandbox.kube import SANDBOX, AlreadyExists, Client, EventSink, KubeError, Object
from agent_sandbox.kube.errors import is_namespace_terminating

from . import execute as ex
from .decide import Bound, Create, Failed, Resolution, SandboxWrite, Snapshot
from .errors import ClaimError, ReconcilerError, SandboxCreatePending
from .observability import ClaimMetrics, template_of
from .observe import sandbox_view
from .store import Freshest, Store

__all__ = ["NamespaceTerminating", "apply_resolution"]


class NamespaceTerminating(Exception):
    """The cold create was refused because the claim's namespace is being deleted (`__cause__`)."""


async def apply_resolution(
    snap: Snapshot,
    resolution: Resolution,
    *,
    api: Client,
    store: Store,
    fresh: Freshest,
    events: EventSink,
    metrics: ClaimMetrics,
) -> tuple[Object | Mapping[str, Any] | None, ClaimError | None, bool]:
    """Execute the resolution's write(s); returns (bound Sandbox, error for status, drop_reference).

    Raises:
        NamespaceTerminating: the cold create was refused because the claim's namespace is being deleted.
    """
    claim = snap.claim
    ns = claim["metadata"]["namespace"]
    if isinstance(resolution, Create):
        try:
            created = await ex.create_sandbox(api, resolution.body)
        except AlreadyExists:
            return None, SandboxCreatePending(), resolution.drop_reference
        except KubeError as exc:
            if is_namespace_terminating(exc):
                raise NamespaceTerminating from exc
            # Ours (upstream says it only in Ready): a ReplicaSet's `FailedCreate` Warning, so `kubectl
            # describe sandboxclaim` says why no Sandbox appears (quota, admission, validation).
            events.event(
                dict(claim), "Warning", c.EVENT_FAILED_CREATE, "Creating", f"sandbox create error: {exc}"
            )
            return None, ReconcilerError(f"sandbox create error: {exc}"), resolution.drop_reference
        fresh.remember(SANDBOX, created)
        fresh.bind(claim["metadata"]["uid"], created["metadata"]["name"])
        events.event(
            dict(claim),
            "Normal",
            c.EVENT_SANDBOX_PROVISIONED,
            "Provisioning",
            f'Created Sandbox "{created["metadata"]["name"]}"',
        )
        metrics.count_creation(
            claim,
            created,
            launch_type=c.LAUNCH_TYPE_COLD,
            pool=claim_pool_name(claim),
            ready=False,
            template=template_of(created),
        )
        return created, None, resolution.drop_reference
    if isinstance(resolution, Failed):
        return None, resolution.error, resolution.drop_reference
    if isinstance(resolution, Bound):
        sandbox: Mapping[str, Any] = resolution.sandbox
        error = resolution.error
        for write in resolution.writes:
            error = await _sandbox_write(api, fresh, ns, write, error)
            if write.patch is not None and write.name == sandbox["metadata"]["name"]:
                sandbox = sandbox_view(store, fresh, ns, write.name) or sandbox
        return sandbox, error, resolution.drop_reference
    raise AssertionError(f"unexpected resolution {resolution!r}")  # NeedCandidate/Adopt/Pending handled


async def _sandbox_write(
    api: Client, fresh: Freshest, ns: str, write: SandboxWrite, error: ClaimError | None
) -> ClaimError | None:
    try:
        if write.delete_uid is not None:
            await ex.delete_sandbox(api, ns, write.name, write.delete_uid)
        elif write.patch is not None:
            fresh.remember(SANDBOX, await ex.patch_sandbox(api, ns, write.name, write.patch))
    except KubeError as exc:
        # The binding stays (status keeps the Sandbox); the error shows and is retried.
        return error or ReconcilerError(f'failed to update sandbox "{write.name}": {exc}')
    return error
