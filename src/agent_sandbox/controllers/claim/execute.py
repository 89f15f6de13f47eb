"""SandboxClaim writes: one API call per function, with the wire shape and the error mapping of each.

Owns the exact requests of the claim controller (controllers spec §4.6-§4.10, §4.13):

| function | request | guard |
|---|---|---|
| `take_over` | JSON patch of the Sandbox (metadata + pod template metadata) | `test` ops: UID + ownerReferences |
| `create_sandbox` | POST Sandbox | name = claim name (AlreadyExists = cache lag) |
| `patch_sandbox` | merge patch of the bound Sandbox (labels, pod template metadata) | none (idempotent) |
| `delete_sandbox` | DELETE Sandbox | UID precondition |
| `write_status` | merge patch of the claim's status subresource | resourceVersion |
| `patch_claim_metadata` | merge patch of the claim's annotations/labels | none (additive keys) |
| `delete_claim` | DELETE claim, background or foreground | UID precondition |
| `delete_policy` | DELETE the legacy `<claim>-network-policy` | UID precondition |

No decisions here (see `decide`), and no retries: the reconciler decides what a failure means.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from agent_sandbox.kube import (
    NETWORK_POLICY,
    SANDBOX,
    SANDBOX_CLAIM,
    Client,
    Conflict,
    NotFound,
    Object,
    PatchType,
    PropagationPolicy,
    create_merge_patch,
)

from .status import status_equal

__all__ = [
    "StatusWrite",
    "create_sandbox",
    "delete_claim",
    "delete_policy",
    "delete_sandbox",
    "patch_claim_metadata",
    "patch_sandbox",
    "status_patch",
    "take_over",
    "write_status",
]


def _ns_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


async def take_over(api: Client, sandbox: Mapping[str, Any], ops: Sequence[dict[str, Any]]) -> Object:
    """Re-parent `sandbox` to a claim with the guarded JSON patch `ops`.

    Raises:
        Invalid: a `test` failed (ownership changed since `sandbox` was read) - 422.
        NotFound: the Sandbox is gone.
        KubeError: anything else (the outcome is then unknown).
    """
    ns, name = _ns_name(sandbox)
    return await api.patch(SANDBOX, name, list(ops), namespace=ns, patch_type=PatchType.JSON)


async def create_sandbox(api: Client, body: Mapping[str, Any]) -> Object:
    """Create the cold Sandbox. Raises `AlreadyExists` when the name is taken."""
    ns, _ = _ns_name(body)
    return await api.create(SANDBOX, dict(body), namespace=ns)


async def patch_sandbox(api: Client, namespace: str, name: str, patch: Mapping[str, Any]) -> Object:
    """Merge-patch the bound Sandbox's labels / pod template metadata (no lock: the values are absolute)."""
    return await api.patch(SANDBOX, name, dict(patch), namespace=namespace)


async def delete_sandbox(api: Client, namespace: str, name: str, uid: str) -> None:
    """Delete a Sandbox by name, only if it still has `uid`; NotFound counts as done."""
    with contextlib.suppress(NotFound):
        await api.delete(SANDBOX, name, namespace=namespace, uid=uid)


@dataclass(frozen=True, slots=True)
class StatusWrite:
    """`authoritative`: the server holds this status (written, unchanged, or the claim is gone);
    `claim`: the stored claim after the write (the input when nothing was sent)."""

    authoritative: bool
    claim: Mapping[str, Any]
    sent: bool = False


def status_patch(claim: Mapping[str, Any], new_status: Mapping[str, Any]) -> dict[str, Any]:
    """Merge patch from the claim's current status to `new_status`, locked on its resourceVersion."""
    old = claim.get("status") or {}
    return {
        "metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]},
        "status": create_merge_patch(old, new_status),
    }


async def write_status(api: Client, claim: Mapping[str, Any], new_status: Mapping[str, Any]) -> StatusWrite:
    """Write the claim status if it changed (§4.10).

    A 409 means our view of the claim was stale: dropped silently (not authoritative); the event of the
    write that beat us re-enqueues the claim. NotFound: the claim is gone, nothing left to do.

    Raises:
        KubeError: any other failure.
    """
    if status_equal(claim.get("status") or {}, new_status):
        return StatusWrite(True, claim)
    ns, name = _ns_name(claim)
    try:
        stored = await api.patch_status(SANDBOX_CLAIM, name, status_patch(claim, new_status), namespace=ns)
    except NotFound:
        return StatusWrite(True, claim, sent=True)
    except Conflict:
        return StatusWrite(False, claim, sent=True)
    return StatusWrite(True, stored, sent=True)


async def patch_claim_metadata(
    api: Client, claim: Mapping[str, Any], body: Mapping[str, Any]
) -> Object | None:
    """Merge-patch the claim's annotations/labels; None if the claim is gone."""
    ns, name = _ns_name(claim)
    try:
        return await api.patch(SANDBOX_CLAIM, name, dict(body), namespace=ns)
    except NotFound:
        return None


async def delete_claim(api: Client, claim: Mapping[str, Any], propagation: str) -> None:
    """Delete the claim (expiry with Delete/DeleteForeground); NotFound counts as done."""
    ns, name = _ns_name(claim)
    with contextlib.suppress(NotFound):
        await api.delete(
            SANDBOX_CLAIM,
            name,
            namespace=ns,
            propagation_policy=cast(PropagationPolicy, propagation),
            uid=claim["metadata"].get("uid"),
        )


async def delete_policy(api: Client, policy: Mapping[str, Any]) -> None:
    """Delete the legacy per-claim NetworkPolicy; NotFound counts as done."""
    ns, name = _ns_name(policy)
    with contextlib.suppress(NotFound):
        await api.delete(NETWORK_POLICY, name, namespace=ns, uid=policy["metadata"].get("uid"))
