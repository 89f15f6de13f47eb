"""Hibernated Sandboxes (docs/lifecycle.md): only their SandboxArchive exists; how one is recognised, named
to the user, and restored.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from . import _kube
from ._claims import ClaimView
from ._expiry import claim_is_expired, raise_if_final
from ._lifecycle_names import (
    EXPIRED_AT_ANNOTATION,
    REASON_CLAIM_EXPIRED,
    REASON_SANDBOX_EXPIRED,
    REASON_SANDBOX_HIBERNATED,
)
from ._steps import Flow
from .constants import HIBERNATED_SANDBOX_ANNOTATION, OPERATING_MODE_RUNNING
from .exceptions import SandboxClaimFailedError, SandboxError, SandboxNotFoundError, SandboxRequestError

__all__ = ["archived", "claim_says_hibernated", "hibernated_hint", "restore"]


def archived(namespace: str, sandbox: str) -> Flow[bool]:
    """Whether a SandboxArchive of that name exists (False too when it cannot be read, e.g. no lifecycle)."""
    try:
        obj = yield from _kube.get(_kube.ARCHIVES, namespace, sandbox)
    except SandboxError:
        return False
    return obj is not None


def hibernated_hint(namespace: str, sandbox: str) -> str:
    """What to say of a Sandbox that is hibernated (only its SandboxArchive exists)."""
    return (
        f"Sandbox {namespace}/{sandbox} is hibernated (archived, volumes kept): restore it with the handle's "
        f"resume(), `agent-sandbox resume CLAIM` or `agent-sandbox lifecycle resume -n {namespace} {sandbox}`"
    )


def claim_says_hibernated(claim: Mapping[str, Any], sandbox: str) -> bool:
    """Whether the claim says its Sandbox `sandbox` is hibernated: the lifecycle controller's mark
    (`hibernated-sandbox`) or the claim controller's `Ready=False/SandboxHibernated` (either may lag)."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    if annotations.get(HIBERNATED_SANDBOX_ANNOTATION) == sandbox:
        return True
    view = ClaimView.of(claim)
    return view.sandbox_name == sandbox and not view.ready and view.reason == REASON_SANDBOX_HIBERNATED


def _refuse_under_expired_claim(namespace: str, sandbox: str, archive: Mapping[str, Any]) -> Flow[None]:
    """Ours: raise when the hibernated Sandbox's claim (the archive's controller) has expired: the lifecycle
    controller deletes the archive at the claim's expiry and never restores it. Until December 6 the
    restore went ahead (a Ready Sandbox under an expired claim, or one the claim controller deleted again)."""
    owners = (archive.get("metadata") or {}).get("ownerReferences") or []
    owner = next((o for o in owners if o.get("controller") and o.get("kind") == "SandboxClaim"), None)
    claim_name = (owner or {}).get("name")
    if not claim_name:
        return
    try:
        claim = yield from _kube.get(_kube.CLAIMS, namespace, str(claim_name))
    except SandboxError:
        return  # cannot be read (a role without claims): the controller still refuses the restore
    if claim is None or (claim.get("metadata") or {}).get("uid") != (owner or {}).get("uid"):
        return  # gone, or a new claim under the name: not the one whose expiry ends this archive
    if claim_is_expired(claim, datetime.now(UTC)):
        raise SandboxClaimFailedError(
            f"Sandbox {namespace}/{sandbox} is hibernated under SandboxClaim {namespace}/{claim_name}, which "
            "has expired: it will not be restored",
            reason=REASON_CLAIM_EXPIRED,
        )


def restore(namespace: str, sandbox: str) -> Flow[dict[str, Any]]:
    """Ours: ask the lifecycle controller to restore a hibernated Sandbox (its SandboxArchive).

    The archive is read, and refused, before the request is written: one being deleted, expired (its
    shutdownTime passed, or marked `expired-at`), or under an expired claim is never restored. Until
    December 6 `spec.restore` was written first, and an archive this then refused showed a restore request
    (`kubectl get sbarchive`: RESTORE Manual) that nothing would carry out; the CLI and a lifecycle router
    refuse before any write too (the Go SDK does not restore)."""
    missing = f"no Sandbox or hibernated Sandbox named {namespace}/{sandbox}"
    try:
        archive = yield from _kube.get(_kube.ARCHIVES, namespace, sandbox)
    except SandboxRequestError as err:
        if err.status_code == 404:  # no archive API (lifecycle not installed): nothing to restore
            raise SandboxNotFoundError(missing) from err
        raise
    if archive is None:
        raise SandboxNotFoundError(missing)
    # An expired one is never restored (the lifecycle controller deletes or keeps it by its shutdownPolicy),
    # nor one being deleted.
    kept = ((archive.get("spec") or {}).get("sandbox") or {}).get("spec") or {}
    seen = {"metadata": archive.get("metadata") or {}, "spec": {"shutdownTime": kept.get("shutdownTime")}}
    raise_if_final(namespace, sandbox, seen, 0, "restored")
    # The controller's mark (its clock), as the router and the Go SDK read it: final even where this clock
    # says the shutdownTime has not passed.
    if mark := ((archive.get("metadata") or {}).get("annotations") or {}).get(EXPIRED_AT_ANNOTATION):
        raise SandboxClaimFailedError(
            f"Sandbox {namespace}/{sandbox} is hibernated and has expired (its SandboxArchive is marked "
            f"{EXPIRED_AT_ANNOTATION}={mark}): it will not be restored",
            reason=REASON_SANDBOX_EXPIRED,
        )
    yield from _refuse_under_expired_claim(namespace, sandbox, archive)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    try:
        yield from _kube.merge_patch(
            _kube.ARCHIVES,
            namespace,
            sandbox,
            {"spec": {"restore": {"cause": "Manual", "requestedAt": stamp}}},
        )
    except SandboxRequestError as err:
        if err.status_code == 404:  # gone since it was read: restored or deleted meanwhile
            raise SandboxNotFoundError(missing) from err
        raise
    # Until the controller recreates it, the Sandbox is absent: wait from "nothing" (generation 0).
    return {"metadata": {"name": sandbox, "generation": 0}, "spec": {"operatingMode": OPERATING_MODE_RUNNING}}
