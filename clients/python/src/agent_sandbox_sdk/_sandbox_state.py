"""A Sandbox's state as its handle reads and changes it: `status()`, and suspend/resume (`spec.operatingMode`).

A suspend or resume waits for the controller to confirm the patched generation, and raises at once when the
answer can never come: the Sandbox is being deleted or has expired (`_expiry.py`), or another writer set the
mode back meanwhile. A resume of a hibernated Sandbox restores its archive (`_hibernation.py`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from . import _kube
from ._claims import SandboxView
from ._expiry import condition, raise_if_final
from ._hibernation import archived, claim_says_hibernated, hibernated_hint, restore
from ._lifecycle_names import (
    ANNOTATION_PREFIX,
    HIBERNATE_ANNOTATION,
    REASON_SANDBOX_HIBERNATED,
    SUSPEND_REASON_ANNOTATION,
    SUSPENDED_AT_ANNOTATION,
)
from ._steps import Flow
from .constants import (
    AUTO_RESUME_ANNOTATION,
    OPERATING_MODE_RUNNING,
    OPERATING_MODE_SUSPENDED,
    RESUME_REASON_ANNOTATION,
    RESUMED_AT_ANNOTATION,
)
from .exceptions import (
    SandboxError,
    SandboxModeChangedError,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxTimeoutError,
)

__all__ = ["operating_mode_patch", "sandbox_status", "set_operating_mode"]


#: `Sandbox.status()` of a Sandbox that does not exist (upstream's words, spec §3.4).
_STATUS_NOT_FOUND = ("SandboxNotFound", "Sandbox object not found in Kubernetes.")


def sandbox_status(namespace: str, sandbox: str, claim: str | None) -> Flow[tuple[str, str]]:
    """`Sandbox.status()`: (`SandboxReady`|`SandboxNotReady`|`SandboxNotFound`, message) from the Sandbox.

    Ours: a hibernated Sandbox - its SandboxArchive exists, or its claim says so (a role that may not read
    archives) - is `SandboxNotReady` with how to restore it; until December 6 it was `SandboxNotFound`, as a
    deleted one. Upstream's shape and words stay, `_STATUS_NOT_FOUND` for one that is really gone."""
    obj = yield from _kube.get(_kube.SANDBOXES, namespace, sandbox)
    if obj is not None:
        return SandboxView.of(obj).status_pair()
    hibernated = yield from archived(namespace, sandbox)
    if not hibernated and claim:
        try:
            owner = yield from _kube.get(_kube.CLAIMS, namespace, claim)
        except SandboxError:
            owner = None
        hibernated = owner is not None and claim_says_hibernated(owner, sandbox)
    if hibernated:
        return "SandboxNotReady", hibernated_hint(namespace, sandbox)
    return _STATUS_NOT_FOUND


def operating_mode_patch(*, suspended: bool, now: datetime) -> dict[str, Any]:
    """Merge patch of `spec.operatingMode` with who and when (`Manual`); a resume cancels a pending
    hibernation (`hibernate` removed)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    annotations: dict[str, Any]
    if suspended:
        annotations = {SUSPEND_REASON_ANNOTATION: "Manual", SUSPENDED_AT_ANNOTATION: stamp}
    else:
        annotations = {
            RESUME_REASON_ANNOTATION: "Manual",
            RESUMED_AT_ANNOTATION: stamp,
            HIBERNATE_ANNOTATION: None,
        }
    mode = OPERATING_MODE_SUSPENDED if suspended else OPERATING_MODE_RUNNING
    return {"metadata": {"annotations": annotations}, "spec": {"operatingMode": mode}}


#: Who set `spec.operatingMode` as its recorded reason says (docs/lifecycle.md), for `SandboxModeChangedError`.
_RESUMED_BY = {
    "Request": (
        "a lifecycle router resumed it for a request - it asks for auto-resume "
        f"({AUTO_RESUME_ANNOTATION}) and is still in use: suspend it once nothing uses it"
    ),
    "Manual": "it was resumed by hand (`agent-sandbox resume`, `agent-sandbox lifecycle resume`, resume())",
    "Other": "the lifecycle controller saw it set Running by a writer that recorded no reason (kubectl?)",
}
_SUSPENDED_BY = {
    "Idle": "the lifecycle controller suspended it as idle (its idle-timeout passed without activity)",
    "Hibernate": "the lifecycle controller suspended it to hibernate it",
    "Manual": "it was suspended by hand (`agent-sandbox suspend`, `agent-sandbox lifecycle suspend`, suspend())",
}


def _overtaken(
    namespace: str, sandbox: str, obj: Mapping[str, Any], ours: Mapping[str, Any], generation: int, mode: str
) -> None:
    """Raise `SandboxModeChangedError` when a write after ours (a later generation) set `spec.operatingMode`
    to something else: the controller will never confirm `mode`. Who did it is what its reason annotation
    says, when that annotation changed after our write (a stale one, from an earlier resume, is not cited)."""
    meta = obj.get("metadata") or {}
    now = (obj.get("spec") or {}).get("operatingMode") or OPERATING_MODE_RUNNING
    if int(meta.get("generation") or 0) <= generation or now == mode:
        return
    resumed = now == OPERATING_MODE_RUNNING
    reason_key, at_key = (
        (RESUME_REASON_ANNOTATION, RESUMED_AT_ANNOTATION)
        if resumed
        else (SUSPEND_REASON_ANNOTATION, SUSPENDED_AT_ANNOTATION)
    )
    annotations = meta.get("annotations") or {}
    before = (ours.get("metadata") or {}).get("annotations") or {}
    recorded = [annotations.get(k) for k in (reason_key, at_key)] != [
        before.get(k) for k in (reason_key, at_key)
    ]
    reason = annotations.get(reason_key) if recorded else None
    head = f"Sandbox {namespace}/{sandbox} was set back to {now} before it was {mode}"
    if reason is None:
        short = reason_key.removeprefix(ANNOTATION_PREFIX)
        message = f"{head}, by a writer that recorded no {short} (kubectl?)"
    else:
        at = annotations.get(at_key)
        why = (_RESUMED_BY if resumed else _SUSPENDED_BY).get(str(reason), "")
        message = f"{head}: {reason_key}: {reason}"
        message += f" ({at_key.removeprefix(ANNOTATION_PREFIX)} {at})" if at else ""
        message += f": {why}" if why else ""
    raise SandboxModeChangedError(message, operating_mode=str(now), changed_by=reason)


def set_operating_mode(
    namespace: str, sandbox: str, *, suspended: bool, wait: bool, timeout: float
) -> Flow[SandboxView]:
    """Patch `spec.operatingMode`; with `wait`, return once the controller confirms the new state.

    Suspended = condition `Suspended=True` (the pod is gone; volumes stay). Running = `Ready=True`. Both
    must be observed for the patched generation, so a stale condition is never mistaken for the answer.
    A Sandbox being deleted or expired raises at once (`SandboxNotFoundError`, `SandboxClaimFailedError`),
    and so does one whose mode another writer set back meanwhile (`SandboxModeChangedError`).
    """
    mode = OPERATING_MODE_SUSPENDED if suspended else OPERATING_MODE_RUNNING
    body = operating_mode_patch(suspended=suspended, now=datetime.now(UTC))
    try:
        patched = yield from _kube.merge_patch(_kube.SANDBOXES, namespace, sandbox, body)
    except SandboxRequestError as err:
        if err.response is None or not _kube.object_not_found(err.response):
            raise
        if suspended:  # spec §3.10: a missing or deleted sandbox is SandboxNotFoundError (resume said so too)
            if (yield from archived(namespace, sandbox)):
                # Ours: hibernated is more than suspended; until December 6 this said "not found (deleted?)".
                raise SandboxNotFoundError(
                    f"{hibernated_hint(namespace, sandbox)}; it is not running, there is nothing to suspend",
                    reason=REASON_SANDBOX_HIBERNATED,
                ) from err
            raise SandboxNotFoundError(f"Sandbox {namespace}/{sandbox} not found (deleted?)") from err
        patched = yield from restore(namespace, sandbox)
    generation = int((patched.get("metadata") or {}).get("generation") or 0)
    if not wait:
        return SandboxView.of(patched)
    want = "Suspended" if suspended else "Ready"
    last: list[Mapping[str, Any]] = [patched]

    def decide(event_type: str, obj: dict[str, Any]) -> SandboxView | None:
        if event_type == "DELETED":
            raise SandboxNotFoundError(f"Sandbox {namespace}/{sandbox} was deleted")
        last[:] = [obj]
        cond = condition(obj, want)
        if cond and cond.get("status") == "True" and int(cond.get("observedGeneration") or 0) >= generation:
            return SandboxView.of(obj)
        raise_if_final(namespace, sandbox, obj, generation, mode)
        # Ours: undone (an auto-resume Sandbox in use is resumed by the router within a second of a suspend);
        # until December 6 the wait ran out its timeout, then named the stale condition (`NotSuspended`).
        _overtaken(namespace, sandbox, obj, patched, generation, mode)
        return None

    if (done := decide("MODIFIED", patched)) is not None:
        return done
    try:
        found, _ = yield from _kube.watch_one(
            _kube.SANDBOXES,
            namespace,
            sandbox,
            resource_version=(patched.get("metadata") or {}).get("resourceVersion"),
            deadline=time.monotonic() + timeout,
            decide=decide,
        )
    except SandboxRequestError as err:
        if err.status_code not in (401, 403):
            raise
        # The change is made; only watching it take effect was refused (a role with `patch` but not `watch`
        # on sandboxes). Said so: until December 6 it read as if nothing had been done.
        raise SandboxRequestError(
            f"Sandbox {namespace}/{sandbox}: operatingMode is set to {mode}, but watching it take effect "
            f"was refused: {err}",
            err.status_code,
            err.response,
        ) from err
    if found is None:
        cond = condition(last[0], want) or {}
        raise SandboxTimeoutError(
            f"Sandbox {namespace}/{sandbox} not {mode} within {timeout:g} s: "
            f"{want}={cond.get('status', 'unknown')}, reason {cond.get('reason')}: {cond.get('message')}",
            reason=cond.get("reason"),
            condition_message=cond.get("message"),
        )
    return found  # type: ignore[no-any-return]
