"""Claim lifecycle flows: create + wait for Ready, resolve an existing claim, delete (spec §3.7).

Waiting is a watch on the one claim (field selector on its name) from the create response's
resourceVersion, so the Ready event arrives as soon as the controller writes it. A wait that runs out
raises `SandboxTimeoutError` naming the claim's last Ready condition (reason and message); terminal
reasons raise at once (`ClaimView.failure`). An auto-named claim is deleted (UID precondition) when
creation fails after the POST; explicit names are never rolled back. A Sandbox's own state (status,
suspend/resume) is `_sandbox_state.py`'s.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _kube
from ._claims import ClaimView, SandboxView, build_claim, check_adoption, new_claim_name
from ._hibernation import archived, claim_says_hibernated
from ._lifecycle_names import REASON_CLAIM_EXPIRED
from ._steps import Flow, HttpResponse, Trace
from .constants import OPERATING_MODE_SUSPENDED, TRACE_CONTEXT_ANNOTATION
from .exceptions import (
    SandboxClaimFailedError,
    SandboxError,
    SandboxMetadataError,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxTemplateNotFoundError,
    SandboxTimeoutError,
    SandboxWarmPoolNotFoundError,
)

log = logging.getLogger("agent_sandbox_sdk")

__all__ = [
    "CreatedClaim",
    "create_and_wait",
    "delete_claim",
    "resolve_claim",
    "wait_claim_ready",
]


# `resolve_claim` (so `get_sandbox`) raises a claim's failure at once, as `create_sandbox` does; upstream's contract
# for `get_sandbox` is that every failure is a `SandboxNotFoundError`, so what it raises is both: code written for
# upstream that catches `SandboxNotFoundError` still does, and `except SandboxClaimFailedError` works too.
class _ClaimFailedNotFound(SandboxClaimFailedError, SandboxNotFoundError):
    """`SandboxClaimFailedError` of an existing claim (`get_sandbox`), also a `SandboxNotFoundError`."""


class _TemplateMissingNotFound(SandboxTemplateNotFoundError, SandboxNotFoundError):
    """`SandboxTemplateNotFoundError` of an existing claim (`get_sandbox`), also a `SandboxNotFoundError`."""


class _WarmPoolMissingNotFound(SandboxWarmPoolNotFoundError, SandboxNotFoundError):
    """`SandboxWarmPoolNotFoundError` of an existing claim (`get_sandbox`), also a `SandboxNotFoundError`."""


_ALSO_NOT_FOUND: dict[type[SandboxError], type[SandboxError]] = {
    SandboxClaimFailedError: _ClaimFailedNotFound,
    SandboxTemplateNotFoundError: _TemplateMissingNotFound,
    SandboxWarmPoolNotFoundError: _WarmPoolMissingNotFound,
}
#: What `ClaimView.failure()` raises: a claim that will not become Ready (nor be bound) without user action.
_CLAIM_FAILURES = tuple(_ALSO_NOT_FOUND)


def _also_not_found(err: SandboxError) -> SandboxError:
    """`err` as its class's variant that is also a `SandboxNotFoundError` (itself when it is one already)."""
    if isinstance(err, SandboxNotFoundError):
        return err
    variant = _ALSO_NOT_FOUND[type(err)]
    return variant(str(err), reason=err.reason, condition_message=err.condition_message)


@dataclass(frozen=True)
class CreatedClaim:
    """A claim that is bound and Ready."""

    view: ClaimView
    auto_named: bool


def _claim_decider(
    namespace: str, name: str, expect_uid: str | None, last: list[ClaimView], *, need_ready: bool
) -> Any:
    def decide(event_type: str, obj: dict[str, Any]) -> ClaimView | None:
        if event_type == "DELETED":
            raise SandboxMetadataError(f"SandboxClaim {namespace}/{name} was deleted while waiting for it")
        view = ClaimView.of(obj)
        last[:] = [view]
        if expect_uid and view.uid and view.uid != expect_uid:
            raise SandboxNotFoundError(f"SandboxClaim {namespace}/{name} was replaced (uid changed)")
        if view.deleting:
            raise SandboxNotFoundError(f"SandboxClaim {namespace}/{name} is being deleted")
        if need_ready:
            if (failure := view.failure()) is not None:
                raise failure
            return view if view.bound_and_ready else None
        if view.sandbox_name:
            return view
        # Not bound, and never will be: the failure create_sandbox raises, at once. Until December 6 a claim
        # the controller had refused (EnvVarsInjectionRejected, ...) was waited for until the timeout.
        if (failure := view.failure()) is not None:
            raise failure
        return None

    return decide


def wait_claim_ready(
    namespace: str,
    name: str,
    *,
    timeout: float,
    resource_version: str | None,
    initial: dict[str, Any] | None = None,
    expect_uid: str | None = None,
    need_ready: bool = True,
) -> Flow[ClaimView]:
    """Wait until the claim is bound and Ready (or, with `need_ready=False`, only bound)."""
    deadline = time.monotonic() + timeout
    last: list[ClaimView] = []
    decide = _claim_decider(namespace, name, expect_uid, last, need_ready=need_ready)
    if initial is not None and (early := decide("ADDED", initial)) is not None:
        return early  # type: ignore[no-any-return]
    found, _rv = yield from _kube.watch_one(
        _kube.CLAIMS, namespace, name, resource_version=resource_version, deadline=deadline, decide=decide
    )
    if found is not None:
        return found  # type: ignore[no-any-return]
    state = last[0] if last else None
    what = "Ready" if need_ready else "bound to a Sandbox"
    detail = state.describe() if state else "no status seen"
    if state is None or state.untouched:
        # the controller answers a claim it sees at once (a condition, even "pool empty"): nothing did
        detail += " - nothing wrote its status: is the agent-sandbox controller running, and watching this namespace?"
    raise SandboxTimeoutError(
        f"SandboxClaim {namespace}/{name} was not {what} within {timeout:g} s: {detail}",
        reason=state.reason if state else None,
        condition_message=state.message if state else None,
    )


def create_and_wait(
    *,
    warmpool: str,
    namespace: str,
    timeout: float,
    labels: Mapping[str, str] | None,
    shutdown_after_seconds: int | None,
    volume_claim_templates: Sequence[Mapping[str, Any]] | None,
    pod_labels: Mapping[str, str] | None,
    pod_annotations: Mapping[str, str] | None,
    env: Mapping[str, str] | None,
    claim_name: str | None,
    adopt_existing: bool,
) -> Flow[CreatedClaim]:
    """POST a claim (or adopt an existing one), then wait for it to be Ready (spec §3.7 steps 2-9)."""
    auto = claim_name is None
    name = claim_name or new_claim_name()
    body = build_claim(
        name=name,
        warmpool=warmpool,
        labels=labels,
        shutdown_after_seconds=shutdown_after_seconds,
        volume_claim_templates=volume_claim_templates,
        pod_labels=pod_labels,
        pod_annotations=pod_annotations,
        env=env,
    )
    span = {"sandbox.claim.name": name}
    if lifecycle := body["spec"].get("lifecycle"):
        span["sandbox.lifecycle.shutdown_time"] = lifecycle["shutdownTime"]
        span["sandbox.lifecycle.shutdown_policy"] = lifecycle["shutdownPolicy"]
    # The create span's trace context goes on the claim (upstream: JSON of traceparent/tracestate).
    if trace_context := (yield Trace("create_claim", span)):
        body["metadata"]["annotations"][TRACE_CONTEXT_ANNOTATION] = json.dumps(trace_context)
    try:
        resp: HttpResponse = yield from _kube.create(_kube.CLAIMS, namespace, body)
    except BaseException as err:
        # Interrupted (task cancelled, Ctrl-C) or no answer after the request went out: the claim may exist.
        if auto and (not isinstance(err, Exception) or getattr(err, "request_sent", False)):
            yield from _rollback(namespace, name, uid=None, cause=err)
        raise
    if resp.status_code == 409:
        if not adopt_existing:
            raise SandboxRequestError(
                f"SandboxClaim {namespace}/{name} already exists; pass adopt_existing=True to use it",
                409,
                resp,
            )
        existing = yield from _kube.get(_kube.CLAIMS, namespace, name)
        view = check_adoption(existing, name, warmpool)
        yield Trace("wait_for_claim_ready")
        ready = yield from wait_claim_ready(
            namespace,
            name,
            timeout=timeout,
            resource_version=view.resource_version,
            initial=existing,
            expect_uid=view.uid,
        )
        return CreatedClaim(ready, auto_named=False)
    created = _kube.check_kube(resp, f"create sandboxclaims {namespace}/{name}")
    uid = (created.get("metadata") or {}).get("uid")
    # A failed wait's rollback DELETE stays in this span, which records the failure.
    yield Trace("wait_for_claim_ready")
    try:
        ready = yield from wait_claim_ready(
            namespace,
            name,
            timeout=timeout,
            resource_version=(created.get("metadata") or {}).get("resourceVersion"),
            initial=None if auto else created,
            expect_uid=uid if not auto else None,
        )
    except BaseException as err:
        if auto:
            yield from _rollback(namespace, name, uid=uid, cause=err)
        raise
    return CreatedClaim(ready, auto_named=auto)


def _rollback(namespace: str, name: str, *, uid: str | None, cause: BaseException) -> Flow[None]:
    """Delete the auto-named claim a failed or interrupted create leaves behind (its random name is ours alone).

    An interruption (task cancelled, `asyncio.timeout`, Ctrl-C) that lands while the DELETE is in flight does not
    stop the cleanup: the DELETE is sent once more, to its end, and then the interruption goes on. Until
    December 6 it stopped it, and the claim - with the Sandbox it may hold - was left behind. A second
    interruption stops it (the user insists).
    """
    interrupted: BaseException | None = None
    while True:
        try:
            yield from _kube.delete(_kube.CLAIMS, namespace, name, uid=uid)
        except SandboxRequestError as failed:
            # The original failure is what is raised; the claim left behind is said, not hidden (a role
            # without `delete sandboxclaims` left it silently until December 6).
            if failed.status_code != 404:
                left = f"SandboxClaim {namespace}/{name} was left behind: deleting it failed: {failed}"
                cause.add_note(left)
                log.warning("%s", left)
        except GeneratorExit:
            raise  # the flow is being closed: no step can be run any more
        except BaseException as err:
            if interrupted is None:
                interrupted = err
                continue
            raise
        if interrupted is not None:
            raise interrupted
        return


def _not_a_claim(namespace: str, name: str) -> Flow[str]:
    """Ours: a hint when `name` is a Sandbox's (or a hibernated Sandbox's) name rather than a claim's; until
    December 6 `agent-sandbox suspend SANDBOX` only said the claim was not found. Best effort."""
    try:
        sandbox = yield from _kube.get(_kube.SANDBOXES, namespace, name)
    except SandboxError:
        sandbox = None
    if sandbox is None and not (yield from archived(namespace, name)):
        return ""
    return (
        f"; {namespace}/{name} is a Sandbox, not a claim: "
        f"`agent-sandbox lifecycle suspend|resume|hibernate -n {namespace} {name}` work on Sandboxes by name"
    )


def resolve_claim(
    namespace: str, name: str, *, timeout: float, warmpool: str | None = None
) -> Flow[tuple[ClaimView, SandboxView]]:
    """An existing claim's bound Sandbox (no Ready requirement); a failure -> `SandboxNotFoundError`, except:

    - an unbound claim that failed for good raises at once what `create_sandbox` raises for it
      (`SandboxClaimFailedError`, `SandboxTemplateNotFoundError`, `SandboxWarmPoolNotFoundError`; ours:
      upstream waits out `timeout`, then says not found);
    - `warmpool`: refuse (`ValueError`) a claim that draws from another pool.
    """
    where = f"SandboxClaim {namespace}/{name}"
    try:
        obj = yield from _kube.get(_kube.CLAIMS, namespace, name)
        if obj is None:
            hint = yield from _not_a_claim(namespace, name)
            raise SandboxNotFoundError(f"{where} not found{hint}")
        view = ClaimView.of(obj)
        if warmpool is not None and view.warmpool != warmpool:
            raise ValueError(
                f"{where} uses warm pool {view.warmpool!r}, not {warmpool!r}; refusing to attach"
            )
        if not view.sandbox_name:
            if view.reason == REASON_CLAIM_EXPIRED:
                # Ours: an expired claim is never bound again (its Sandbox, or hibernated archive, is deleted
                # at expiry); until December 6 this waited out `resolve_timeout`, then said "not bound".
                raise SandboxClaimFailedError(
                    f"{where} has expired: it has no Sandbox ({view.describe()})",
                    reason=REASON_CLAIM_EXPIRED,
                    condition_message=view.message,
                )
            # Raises the claim's terminal failure (ClaimView.failure) as soon as it is seen, the current
            # state's included.
            view = yield from wait_claim_ready(
                namespace,
                name,
                timeout=timeout,
                resource_version=view.resource_version,
                initial=obj,
                need_ready=False,
            )
        try:
            sandbox = yield from _kube.get(_kube.SANDBOXES, namespace, view.sandbox_name or "")
        except SandboxRequestError as err:
            if err.status_code != 403:
                raise
            # Ours: a role that grants claims only (all `create_sandbox` needs) may still attach; the claim's
            # status stands in for its Sandbox (upstream's SDK needs `get sandboxes` here).
            return view, SandboxView.from_claim(view)
        if sandbox is None and view.sandbox_name and claim_says_hibernated(obj, view.sandbox_name):
            # Ours: hibernated (docs/lifecycle.md); presented as suspended, `resume()` restores it.
            sandbox = {
                "metadata": {"name": view.sandbox_name},
                "spec": {"operatingMode": OPERATING_MODE_SUSPENDED},
            }
    except SandboxNotFoundError:
        raise
    except _CLAIM_FAILURES as err:
        raise _also_not_found(err) from err
    except SandboxError as err:
        # Upstream's contract: any other failure is "not found". The claim is named once: a wait that ran out
        # names it already (until December 6: "SandboxClaim ns/x: SandboxClaim ns/x was not bound ...").
        text = str(err)
        raise SandboxNotFoundError(
            text if text.startswith(where) else f"{where}: {text}",
            reason=err.reason,
            condition_message=err.condition_message,
        ) from err
    if sandbox is None:
        raise SandboxNotFoundError(f"Sandbox {namespace}/{view.sandbox_name} of claim {name} not found")
    return view, SandboxView.of(sandbox)


def delete_claim(namespace: str, name: str, *, uid: str | None = None) -> Flow[bool]:
    """DELETE the claim; True if it existed (404 is success: terminate is idempotent). Span `delete_claim`.

    `uid`: only the claim with that UID (a DeleteOptions precondition). The API server refuses the DELETE of
    a claim of that name with another UID - one made again since, by someone else - with a 409, which is
    False here: that claim is not the one meant, and it is left alone."""
    yield Trace("delete_claim", {"sandbox.claim.name": name})
    try:
        existed: bool = yield from _kube.delete(_kube.CLAIMS, namespace, name, uid=uid)
    except SandboxRequestError as err:
        if uid is None or err.status_code != 409:
            raise
        log.debug("SandboxClaim %s/%s is no longer the one with uid %s: left alone", namespace, name, uid)
        return False
    return existed
