"""Claim and Sandbox lifecycle flows: create + wait for Ready, resolve, delete, suspend/resume (spec §3.7).

Waiting is a watch on the one claim (field selector on its name) from the create response's
resourceVersion, so the Ready event arrives as soon as the controller writes it. A wait that runs out
raises `SandboxTimeoutError` naming the claim's last Ready condition (reason and message); terminal
reasons raise at once (`ClaimView.failure`). An auto-named claim is deleted (UID precondition) when
creation fails after the POST; explicit names are never rolled back.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from . import _kube
from ._claims import ClaimView, SandboxView, build_claim, check_adoption, new_claim_name
from ._steps import Flow, HttpResponse, Trace
from .constants import (
    AUTO_RESUME_ANNOTATION,
    HIBERNATED_SANDBOX_ANNOTATION,
    OPERATING_MODE_RUNNING,
    OPERATING_MODE_SUSPENDED,
    RESUME_REASON_ANNOTATION,
    RESUMED_AT_ANNOTATION,
    TRACE_CONTEXT_ANNOTATION,
)
from .exceptions import (
    SandboxClaimFailedError,
    SandboxError,
    SandboxMetadataError,
    SandboxModeChangedError,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxTemplateNotFoundError,
    SandboxTimeoutError,
    SandboxWarmPoolNotFoundError,
)

log = logging.getLogger("agent_sandbox_sdk")

__all__ = [
    "CreatedClaim",
    "claim_says_hibernated",
    "create_and_wait",
    "delete_claim",
    "resolve_claim",
    "sandbox_status",
    "set_operating_mode",
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


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def _claim_is_expired(claim: Mapping[str, Any], now: datetime) -> bool:
    """As the claim controller reckons it: the earliest of `spec.lifecycle.shutdownTime` and `Finished` +
    `ttlSecondsAfterFinished` has passed. A `Ready=False/ClaimExpired` condition is not read: it lags
    behind a `shutdownTime` moved later (the lifecycle controller does not read it either)."""
    lifecycle = (claim.get("spec") or {}).get("lifecycle") or {}
    deadlines = [t for t in (_parse_time(lifecycle.get("shutdownTime")),) if t is not None]
    ttl = lifecycle.get("ttlSecondsAfterFinished")
    finished = _condition(claim, "Finished") or {}
    if isinstance(ttl, int) and finished.get("status") == "True":
        at = _parse_time(finished.get("lastTransitionTime"))
        if at is not None and at.timestamp() > 0 and (due := _deadline_after(at, ttl)) is not None:
            deadlines.append(due)
    return bool(deadlines) and min(deadlines) <= now


# kube-apiserver's `format: date-time` check (k8s.io/kube-openapi strfmt `IsDateTime`), as the control plane's
# `agent_sandbox.api.meta.parse_time` reads it (this SDK installs alone; tests keep the two in step): the value
# split at every "t"/"T", a `2006-01-02` date, then this with hour <= 23, minute/second <= 59, where the
# unescaped "." admits any one character before the fraction and the offset any two-digit hh:mm ("+24:00").
_APISERVER_TIME_RE = re.compile(
    r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?([zZ]|([+-])([0-9]{2}):([0-9]{2}))\Z"
)
_APISERVER_DATE_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})\Z")
_CANONICAL_TIME_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?Z\Z")
_UTC_MIN = datetime.min.replace(tzinfo=UTC)
_UTC_MAX = datetime.max.replace(tzinfo=UTC)


def _parse_apiserver_time(value: str) -> datetime | None:
    pieces = re.split("[tT]", value)
    if len(pieces) < 2:
        return None
    date, clock = _APISERVER_DATE_RE.match(pieces[0]), _APISERVER_TIME_RE.match(pieces[1])
    if date is None or clock is None:
        return None
    year, month, day = (int(g) for g in date.groups())
    hour, minute, second = int(clock[1]), int(clock[2]), int(clock[3])
    if hour > 23 or minute > 59 or second > 59:
        return None
    try:  # Go's calendar check; year 0000 (a leap year) has 2000's month lengths
        datetime(year or 2000, month, day)
    except ValueError:
        return None
    if year == 0:
        return _UTC_MIN
    micros = int(clock[4][1:7].ljust(6, "0")) if clock[4] else 0
    local = datetime(year, month, day, hour, minute, second, micros, tzinfo=UTC)
    offset = 0 if clock[5] in "zZ" else int(clock[7]) * 60 + int(clock[8])
    try:
        return local - timedelta(minutes=offset if clock[6] != "-" else -offset)
    except OverflowError:  # past years 1-9999: clamped, comparisons with a real `now` stay right
        return _UTC_MIN if clock[6] != "-" else _UTC_MAX


def _parse_time(value: object) -> datetime | None:
    """Every value the apiserver admits as `format: date-time` (above), else what `fromisoformat` reads."""
    if not isinstance(value, str) or not value:
        return None
    if _CANONICAL_TIME_RE.match(value):
        # Fast path (~0.4 us instead of ~4 us) for the form the apiserver writes; for this shape
        # `fromisoformat` reads exactly what the check admits (year 0000 aside: refused, the slow path clamps it).
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    admitted = _parse_apiserver_time(value)
    if admitted is not None:
        return admitted
    text = value.strip().replace("z", "Z")
    if "." in text:  # Python parses at most 6 fractional digits; Go writes up to 9.
        head, _, rest = text.partition(".")
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _deadline_after(start: datetime, seconds: float) -> datetime | None:
    """`start` + `seconds`, or None ("never") past `datetime.max` (a TTL above int32: the apiserver does not
    range-check the CRD's int32); as the control plane's `agent_sandbox.api.meta.deadline_after`."""
    try:
        return start + timedelta(seconds=seconds)
    except OverflowError:
        return None if seconds > 0 else _UTC_MIN


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
    if _claim_is_expired(claim, datetime.now(UTC)):
        raise SandboxClaimFailedError(
            f"Sandbox {namespace}/{sandbox} is hibernated under SandboxClaim {namespace}/{claim_name}, which "
            "has expired: it will not be restored",
            reason=REASON_CLAIM_EXPIRED,
        )


def _restore(namespace: str, sandbox: str) -> Flow[dict[str, Any]]:
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
    _final(namespace, sandbox, seen, 0, "restored")
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


# Ours (docs/lifecycle.md): the annotations `agent-sandbox lifecycle suspend|resume` write, copied from
# `agent_sandbox.api.lifecycle.suspend_patch` / `resume_patch` (this SDK is standalone and cannot import the
# main package; keep them in step). Until December 6 a suspend left a previous `suspend-reason: Idle` and its
# `suspended-at` in place, and a resume left a pending `hibernate: "true"`, so the lifecycle controller
# suspended and archived the Sandbox again right after it was resumed.
_PREFIX = "lifecycle.agents.x-k8s.io/"
SUSPEND_REASON_ANNOTATION = _PREFIX + "suspend-reason"
SUSPENDED_AT_ANNOTATION = _PREFIX + "suspended-at"
HIBERNATE_ANNOTATION = _PREFIX + "hibernate"
#: On a SandboxArchive: the lifecycle controller found it expired (`shutdownPolicy: Retain`): kept, never
#: restored (`agent_sandbox.api.lifecycle.ANNOTATION_EXPIRED_AT`).
EXPIRED_AT_ANNOTATION = _PREFIX + "expired-at"
REASON_SANDBOX_EXPIRED = "SandboxExpired"
REASON_SANDBOX_HIBERNATED = "SandboxHibernated"
REASON_CLAIM_EXPIRED = "ClaimExpired"


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


def archived(namespace: str, sandbox: str) -> Flow[bool]:
    """Whether a SandboxArchive of that name exists (False too when it cannot be read, e.g. no lifecycle)."""
    try:
        obj = yield from _kube.get(_kube.ARCHIVES, namespace, sandbox)
    except SandboxError:
        return False
    return obj is not None


def _final(namespace: str, sandbox: str, obj: Mapping[str, Any], generation: int, mode: str) -> None:
    """Raise when the Sandbox will never reach `mode`: it is being deleted, or it expired (its controller
    only tears it down). Until December 6 the wait ran out its whole timeout, then named a wrong reason."""
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        raise SandboxNotFoundError(f"Sandbox {namespace}/{sandbox} is being deleted: it will not be {mode}")
    ready = _condition(obj, "Ready") or {}
    deadline = (obj.get("spec") or {}).get("shutdownTime")
    at = _parse_time(deadline)
    passed = at is not None and at <= datetime.now(UTC)
    marked = (
        ready.get("reason") == REASON_SANDBOX_EXPIRED
        and int(ready.get("observedGeneration") or 0) >= generation
    )
    if passed or marked:
        raise SandboxClaimFailedError(
            f"Sandbox {namespace}/{sandbox} has expired (its shutdownTime {deadline} passed): it will not be {mode}",
            reason=REASON_SANDBOX_EXPIRED,
            condition_message=ready.get("message"),
        )


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
        short = reason_key.removeprefix(_PREFIX)
        message = f"{head}, by a writer that recorded no {short} (kubectl?)"
    else:
        at = annotations.get(at_key)
        why = (_RESUMED_BY if resumed else _SUSPENDED_BY).get(str(reason), "")
        message = f"{head}: {reason_key}: {reason}"
        message += f" ({at_key.removeprefix(_PREFIX)} {at})" if at else ""
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
        patched = yield from _restore(namespace, sandbox)
    generation = int((patched.get("metadata") or {}).get("generation") or 0)
    if not wait:
        return SandboxView.of(patched)
    want = "Suspended" if suspended else "Ready"
    last: list[Mapping[str, Any]] = [patched]

    def decide(event_type: str, obj: dict[str, Any]) -> SandboxView | None:
        if event_type == "DELETED":
            raise SandboxNotFoundError(f"Sandbox {namespace}/{sandbox} was deleted")
        last[:] = [obj]
        cond = _condition(obj, want)
        if cond and cond.get("status") == "True" and int(cond.get("observedGeneration") or 0) >= generation:
            return SandboxView.of(obj)
        _final(namespace, sandbox, obj, generation, mode)
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
        cond = _condition(last[0], want) or {}
        raise SandboxTimeoutError(
            f"Sandbox {namespace}/{sandbox} not {mode} within {timeout:g} s: "
            f"{want}={cond.get('status', 'unknown')}, reason {cond.get('reason')}: {cond.get('message')}",
            reason=cond.get("reason"),
            condition_message=cond.get("message"),
        )
    return found  # type: ignore[no-any-return]
