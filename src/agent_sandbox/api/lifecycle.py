"""The vocabulary of the lifecycle features that go beyond upstream (docs/lifecycle.md).

Idle auto-suspend, resume on request, deep hibernation and warm claims that keep per-claim env live
entirely under our own keys, which upstream controllers and clients ignore:

* `lifecycle.agents.x-k8s.io/*` annotations on Sandboxes, SandboxTemplates and SandboxClaims (settings,
  the activity record, why and when a Sandbox was suspended or resumed);
* the `SandboxArchive` kind (group `lifecycle.agents.x-k8s.io`), a hibernated Sandbox's spec and identity;
* `runtime.agents.x-k8s.io/claim-env`, the pod annotation through which a claim's env reaches the runtime.

Owns: those wire strings, the settings as read from a Sandbox and its template (`LifecyclePolicy`), the
claim-env encoding, the resume / restore-request patches every caller (router, CLI, SDK) sends, and the
archive <-> Sandbox mapping. Pure: no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import enum
import math
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import orjson

from .constants import (
    ANNOTATION_POD_NAME,
    ANNOTATION_SANDBOX_TEMPLATE_REF,
    ANNOTATION_V1ALPHA1_SANDBOX_STATE,
    CONDITION_FINISHED,
    SANDBOX_API_VERSION,
    ConditionStatus,
    OperatingMode,
)
from .kinds import ResourceKind
from .meta import (
    ReadOnlyObject,
    deadline_after,
    format_rfc3339nano,
    parse_duration,
    parse_time,
    status_condition,
)

__all__ = [
    "ANNOTATION_AUTO_RESUME",
    "ANNOTATION_CLAIM_ENV",
    "ANNOTATION_EXPIRED_AT",
    "ANNOTATION_HIBERNATE",
    "ANNOTATION_HIBERNATED_SANDBOX",
    "ANNOTATION_HIBERNATE_AFTER",
    "ANNOTATION_IDLE_TIMEOUT",
    "ANNOTATION_LAST_ACTIVITY",
    "ANNOTATION_RESTORED_UID",
    "ANNOTATION_RESUMED_AT",
    "ANNOTATION_RESUME_REASON",
    "ANNOTATION_SUSPENDED_AT",
    "ANNOTATION_SUSPEND_REASON",
    "ANNOTATION_TEMPLATE_AUTO_RESUME",
    "ARCHIVE",
    "CLAIM_ENV_FIELD_PATH",
    "DEFAULT_CLAIM_ENV_FILE",
    "HEADER_NOT_STARTED",
    "LIFECYCLE_GROUP",
    "MAX_GO_DURATION_SECONDS",
    "Cause",
    "LifecyclePolicy",
    "archive_body",
    "archived_sandbox",
    "archived_template_settings",
    "claim_env_annotation",
    "claim_env_containers",
    "claim_expired",
    "decode_claim_env",
    "encode_claim_env",
    "lifecycle_policy",
    "projects_claim_env",
    "restore_request_patch",
    "restore_requested",
    "resume_patch",
    "suspend_patch",
    "template_auto_resume_record",
    "template_name_of",
]

LIFECYCLE_GROUP: Final = "lifecycle.agents.x-k8s.io"
_PREFIX: Final = f"{LIFECYCLE_GROUP}/"

# Settings: on a Sandbox, or on its SandboxTemplate (the Sandbox's own value wins).
ANNOTATION_IDLE_TIMEOUT: Final = f"{_PREFIX}idle-timeout"
"""Go duration ("15m"): suspend a Running Sandbox after this long without activity; "0" or absent: never."""
ANNOTATION_HIBERNATE_AFTER: Final = f"{_PREFIX}hibernate-after"
"""Go duration ("24h"): archive a Sandbox that has been suspended this long; absent: never."""
ANNOTATION_AUTO_RESUME: Final = f"{_PREFIX}auto-resume"
""""true": a request through a lifecycle-enabled router resumes (or restores) the Sandbox."""

# Requests and records on a Sandbox.
ANNOTATION_HIBERNATE: Final = f"{_PREFIX}hibernate"
""""true": hibernate now (suspend first if Running). Set by `agent-sandbox lifecycle hibernate`."""
ANNOTATION_LAST_ACTIVITY: Final = f"{_PREFIX}last-activity"
"""RFC 3339 time of the latest request a router proxied (written at most once per interval)."""
ANNOTATION_SUSPEND_REASON: Final = f"{_PREFIX}suspend-reason"
ANNOTATION_SUSPENDED_AT: Final = f"{_PREFIX}suspended-at"
ANNOTATION_RESUME_REASON: Final = f"{_PREFIX}resume-reason"
ANNOTATION_RESUMED_AT: Final = f"{_PREFIX}resumed-at"

# On a SandboxClaim while its Sandbox is archived: the claim controller neither replaces it nor reports
# it missing (Ready=False, reason SandboxHibernated).
ANNOTATION_HIBERNATED_SANDBOX: Final = f"{_PREFIX}hibernated-sandbox"

# Records on a SandboxArchive (metadata: the kind has no status subresource, and its spec schema would
# prune unknown fields). Written by the lifecycle controller; `expired-at` is also read by routers and the
# Go SDK (an archive marked so is never restored) and shown by `kubectl get sbarchive` (column Expired).
ANNOTATION_RESTORED_UID: Final = f"{_PREFIX}restored-uid"
"""The UID of the Sandbox a restore created: once that Sandbox is gone, it was deleted (by a user, by its
claim's expiry), and the restore is over, not to be done again. Until December 6 a Sandbox deleted during
its restore was created again from the archive."""
ANNOTATION_EXPIRED_AT: Final = f"{_PREFIX}expired-at"
"""When the controller found a hibernated Sandbox expired with `shutdownPolicy: Retain`: kept, never
restored (`kubectl get sbarchive` tells it from a restorable one)."""
ANNOTATION_TEMPLATE_AUTO_RESUME: Final = f"{_PREFIX}template-auto-resume"
"""The archived Sandbox's SandboxTemplate's `auto-resume` when it was archived (absent: the template set none,
or an older controller archived it). Read by routers only once that template is gone: a hibernated claim
whose template was deleted is still restored on request, as its `SandboxHibernated` condition says. Until
December 7 such a request got upstream's 502 and nothing was restored."""

# A draining runtime's refusal of a command it did not start (docs/router.md, "unanswered").
HEADER_NOT_STARTED: Final = "X-Sandbox-Not-Started"
"""On a runtime's `503`: the request was read but nothing of it was run (the runtime is draining). A router
running `--sandbox-lifecycle` holds such a request and sends it whole to the pod that replaces this one;
without it the answer is relayed as it is. A connection closed without any answer may have run its request."""

# Warm claims that keep per-claim env (docs/lifecycle.md "Warm claims with env").
ANNOTATION_CLAIM_ENV: Final = "runtime.agents.x-k8s.io/claim-env"
"""Pod (template) annotation: the claim's env as a JSON object, delivered to the runtime by a file."""
CLAIM_ENV_FIELD_PATH: Final = f"metadata.annotations['{ANNOTATION_CLAIM_ENV}']"
"""The downward API `fieldRef.fieldPath` a template projects to opt in."""
DEFAULT_CLAIM_ENV_FILE: Final = "/var/run/agent-sandbox/claim-env"
"""Where the runtime reads it by default (`--claim-env-file`)."""

ARCHIVE: Final = ResourceKind(
    LIFECYCLE_GROUP,
    "v1alpha1",
    "SandboxArchive",
    "sandboxarchives",
    singular="sandboxarchive",
    list_kind="SandboxArchiveList",
    short_names=("sbarchive",),
)
"""A hibernated Sandbox (named like it, same namespace)."""


class Cause(enum.StrEnum):
    """Why a Sandbox was suspended, resumed, hibernated or restored (annotation values, metric labels)."""

    IDLE = "Idle"
    """No activity for the idle timeout (suspend)."""
    HIBERNATE = "Hibernate"
    """Suspended to be archived (on-demand hibernation of a Running Sandbox)."""
    AFTER = "HibernateAfter"
    """Archived after `hibernate-after` in the suspended state."""
    REQUESTED = "Requested"
    """Archived on demand (the `hibernate` annotation)."""
    REQUEST = "Request"
    """Resumed or restored by a request through the router."""
    MANUAL = "Manual"
    """By the CLI / SDK: resumed or restored (`resume` by name), or suspended (`suspend`)."""
    OTHER = "Other"
    """Resumed by someone else (operatingMode flipped without our annotation)."""


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class LifecyclePolicy:
    """A Sandbox's effective lifecycle settings; None / False when not asked for."""

    idle_timeout: float | None = None
    hibernate_after: float | None = None
    auto_resume: bool = False
    problems: tuple[str, ...] = ()
    """Unusable annotation values (the setting is then off), each naming the annotation and object."""

    @property
    def any(self) -> bool:
        return self.idle_timeout is not None or self.hibernate_after is not None or self.auto_resume


_OFF: Final = LifecyclePolicy()


def template_name_of(sandbox: ReadOnlyObject) -> str | None:
    """The SandboxTemplate a Sandbox was built from (`agents.x-k8s.io/sandbox-template-ref`), if any."""
    ref = ((sandbox.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SANDBOX_TEMPLATE_REF)
    return str(ref) if ref else None


MAX_GO_DURATION_SECONDS = (2**63 - 1) / 1e9
"""The longest Go `time.Duration` (2562047h47m16.854775807s), in seconds."""


def _duration(
    key: str, own: Mapping[str, str], inherited: Mapping[str, str], problems: list[str]
) -> float | None:
    source, text = ("Sandbox", own[key]) if key in own else ("SandboxTemplate", inherited.get(key))
    if text is None:
        return None
    try:
        seconds = parse_duration(str(text))
    except ValueError:
        problems.append(f'{source} annotation {key}="{text}": want a duration such as "15m" or "0"')
        return None
    if not math.isfinite(seconds) or seconds < 0:
        problems.append(f'{source} annotation {key}="{text}": must not be negative')
        return None
    if seconds > MAX_GO_DURATION_SECONDS:  # Go's ParseDuration rejects it too (upstream's controllers)
        problems.append(f'{source} annotation {key}="{text}": longer than a Go duration can be (2562047h)')
        return None
    return seconds or None


def lifecycle_policy(
    sandbox_annotations: Mapping[str, str] | None, template_annotations: Mapping[str, str] | None = None
) -> LifecyclePolicy:
    """The settings of a Sandbox: its own annotations, else its template's (docs/lifecycle.md)."""
    own = sandbox_annotations or {}
    inherited = template_annotations or {}
    if not any(k.startswith(_PREFIX) for k in own) and not any(k.startswith(_PREFIX) for k in inherited):
        return _OFF
    problems: list[str] = []
    idle = _duration(ANNOTATION_IDLE_TIMEOUT, own, inherited, problems)
    hibernate = _duration(ANNOTATION_HIBERNATE_AFTER, own, inherited, problems)
    source, text = (
        ("Sandbox", own[ANNOTATION_AUTO_RESUME])
        if ANNOTATION_AUTO_RESUME in own
        else ("SandboxTemplate", inherited.get(ANNOTATION_AUTO_RESUME))
    )
    auto = False
    if text is not None:
        if str(text).lower() in ("true", "false"):
            auto = str(text).lower() == "true"
        else:
            problems.append(f'{source} annotation {ANNOTATION_AUTO_RESUME}="{text}": want "true" or "false"')
    return LifecyclePolicy(idle, hibernate, auto, tuple(problems))


# --------------------------------------------------------------------------- claim env


def encode_claim_env(env: Mapping[str, str]) -> str:
    """The annotation value: a JSON object of names to values, keys sorted (stable: no spurious diffs)."""
    return orjson.dumps(dict(env), option=orjson.OPT_SORT_KEYS).decode()


def decode_claim_env(text: str | bytes) -> dict[str, str]:
    """Parse an annotation value (or the file the runtime reads).

    Raises:
        ValueError: not a JSON object of non-empty names (no '=' or NUL) to strings.
    """
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise ValueError("want a JSON object of names to values")
    for name, item in value.items():
        if not name or "=" in name or "\x00" in name:
            raise ValueError(f"invalid variable name {name!r}")
        if not isinstance(item, str) or "\x00" in item:
            raise ValueError(f"variable {name!r}: want a string value")
    return value


def _downward_items(volume: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The downward API items of a `downwardAPI` or `projected` volume."""
    items = list((volume.get("downwardAPI") or {}).get("items") or [])
    for source in (volume.get("projected") or {}).get("sources") or []:
        items += (source.get("downwardAPI") or {}).get("items") or []
    return items


def _claim_env_files(pod_spec: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
    """Paths (inside `container`) of files projecting the claim env annotation."""
    volumes = {str(v.get("name")): v for v in pod_spec.get("volumes") or []}
    paths = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(str(mount.get("name")))
        if volume is None:
            continue
        base = posixpath.join(str(mount.get("mountPath", "")), str(mount.get("subPath") or ""))
        for item in _downward_items(volume):
            if (item.get("fieldRef") or {}).get("fieldPath") == CLAIM_ENV_FIELD_PATH:
                paths.append(posixpath.normpath(posixpath.join(base, str(item.get("path", "")))))
    return paths


def projects_claim_env(pod_spec: Mapping[str, Any], container: Mapping[str, Any], path: str) -> bool:
    """`path` inside `container` is a downward API file of the claim env annotation."""
    return bool(path) and posixpath.normpath(path) in _claim_env_files(pod_spec, container)


def claim_env_containers(pod_spec: Mapping[str, Any]) -> frozenset[str]:
    """Names of the (regular) containers that see the claim env annotation through a downward API file.

    A template opts into warm claims with env by projecting it (docs/lifecycle.md).
    """
    return frozenset(
        str(c.get("name", "")) for c in pod_spec.get("containers") or [] if _claim_env_files(pod_spec, c)
    )


def claim_env_annotation(env: list[Mapping[str, Any]], pod_spec: Mapping[str, Any]) -> str | None:
    """The claim env annotation of a claimed Sandbox's pod template, or None when its template does not
    project it (then the claim's env goes into the pod spec, upstream's cold start).

    Written for every claim of an opted-in template, `{}` when the claim has no env, so the runtime can tell
    "delivered, empty" from "not delivered yet".
    """
    if not claim_env_containers(pod_spec):
        return None
    return encode_claim_env({str(e["name"]): str(e.get("value") or "") for e in env})


# --------------------------------------------------------------------------- patches every caller sends


def suspend_patch(cause: Cause, now: datetime, resource_version: str) -> dict[str, Any]:
    """Merge patch that suspends a Sandbox, recording why; fails with 409 if the Sandbox changed since."""
    return {
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": {
                ANNOTATION_SUSPEND_REASON: str(cause),
                ANNOTATION_SUSPENDED_AT: format_rfc3339nano(now),
            },
        },
        "spec": {"operatingMode": str(OperatingMode.SUSPENDED)},
    }


def resume_patch(cause: Cause, now: datetime, resource_version: str | None = None) -> dict[str, Any]:
    """Merge patch that resumes a Sandbox, recording why (and counting the resume as activity).

    It cancels a pending hibernation (`hibernate` removed): until December 6 the lifecycle controller
    suspended and archived a Sandbox again right after an explicit resume. With `resource_version`, a second
    resumer (another router) gets 409 instead of writing again.
    """
    stamp = format_rfc3339nano(now)
    meta: dict[str, Any] = {
        "annotations": {
            ANNOTATION_RESUME_REASON: str(cause),
            ANNOTATION_RESUMED_AT: stamp,
            ANNOTATION_LAST_ACTIVITY: stamp,
            ANNOTATION_HIBERNATE: None,
        }
    }
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta, "spec": {"operatingMode": str(OperatingMode.RUNNING)}}


def restore_request_patch(cause: Cause, now: datetime) -> dict[str, Any]:
    """Merge patch on a SandboxArchive asking the controller to restore it."""
    return {"spec": {"restore": {"cause": str(cause), "requestedAt": format_rfc3339nano(now)}}}


# --------------------------------------------------------------------------- archive <-> Sandbox

# Annotations that describe the old object, not the Sandbox: dropped when archiving.
_DROPPED_ANNOTATIONS: Final = frozenset(
    {
        ANNOTATION_POD_NAME,
        ANNOTATION_HIBERNATE,
        ANNOTATION_V1ALPHA1_SANDBOX_STATE,
        "kubectl.kubernetes.io/last-applied-configuration",
    }
)


def archive_body(
    sandbox: ReadOnlyObject, *, cause: Cause, now: datetime, children: list[dict[str, str]]
) -> dict[str, Any]:
    """The SandboxArchive keeping `sandbox`: its identity (name, labels, annotations, owners) and spec.

    Args:
        sandbox: the Suspended Sandbox as stored.
        cause: why it is archived (`AFTER` or `REQUESTED`).
        now: archive time.
        children: `{"kind", "name"}` of the PVCs and Service the archive keeps alive while the Sandbox is
            gone (they carry an owner reference to the archive).
    """
    meta = sandbox["metadata"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _DROPPED_ANNOTATIONS}
    kept_meta: dict[str, Any] = {"labels": dict(meta.get("labels") or {}), "annotations": annotations}
    owners = [dict(o) for o in meta.get("ownerReferences") or []]
    if owners:
        kept_meta["ownerReferences"] = owners
    if meta.get("finalizers"):
        kept_meta["finalizers"] = list(meta["finalizers"])
    archive_meta: dict[str, Any] = {
        "name": meta["name"],
        "namespace": meta["namespace"],
        "labels": dict(meta.get("labels") or {}),
    }
    # The claim (or other controller) that owns the Sandbox owns its archive: deleting the claim deletes
    # the archive and, through it, the volumes (as deleting the claim of a live Sandbox would).
    if owners:
        archive_meta["ownerReferences"] = owners
    return {
        "apiVersion": ARCHIVE.api_version,
        "kind": ARCHIVE.kind,
        "metadata": archive_meta,
        "spec": {
            "sandbox": {"metadata": kept_meta, "spec": dict(sandbox.get("spec") or {})},
            "sandboxUID": meta.get("uid", ""),
            "archivedAt": format_rfc3339nano(now),
            "reason": str(cause),
            "children": children,
        },
    }


def archived_sandbox(archive: ReadOnlyObject, *, cause: Cause, now: datetime) -> dict[str, Any]:
    """The Sandbox a restore creates: same name, namespace, labels, annotations and owners; Running."""
    kept = (archive.get("spec") or {}).get("sandbox") or {}
    kept_meta = kept.get("metadata") or {}
    annotations = dict(kept_meta.get("annotations") or {})
    stamp = format_rfc3339nano(now)
    annotations.update(
        {ANNOTATION_RESUME_REASON: str(cause), ANNOTATION_RESUMED_AT: stamp, ANNOTATION_LAST_ACTIVITY: stamp}
    )
    for key in (ANNOTATION_SUSPEND_REASON, ANNOTATION_SUSPENDED_AT):
        annotations.pop(key, None)
    meta: dict[str, Any] = {
        "name": archive["metadata"]["name"],
        "namespace": archive["metadata"]["namespace"],
        "labels": dict(kept_meta.get("labels") or {}),
        "annotations": annotations,
    }
    if kept_meta.get("ownerReferences"):
        meta["ownerReferences"] = [dict(o) for o in kept_meta["ownerReferences"]]
    if kept_meta.get("finalizers"):
        meta["finalizers"] = list(kept_meta["finalizers"])
    spec = dict(kept.get("spec") or {})
    spec["operatingMode"] = str(OperatingMode.RUNNING)
    return {"apiVersion": SANDBOX_API_VERSION, "kind": "Sandbox", "metadata": meta, "spec": spec}


def restore_requested(archive: ReadOnlyObject | None) -> tuple[Cause, datetime | None] | None:
    """(cause, requested at) when a restore was asked for, else None."""
    if archive is None:
        return None
    restore = (archive.get("spec") or {}).get("restore")
    if not isinstance(restore, Mapping):
        return None
    try:
        cause = Cause(str(restore.get("cause") or Cause.MANUAL))
    except ValueError:
        cause = Cause.OTHER
    return cause, parse_time(restore.get("requestedAt"))


def claim_expired(claim: ReadOnlyObject | None, now: datetime) -> tuple[bool, float | None]:
    """(expired, seconds left) of a SandboxClaim, exactly as the claim controller reckons it (its
    `status.expiry` is this): the earliest of `lifecycle.shutdownTime` and Finished +
    `ttlSecondsAfterFinished`. No claim: not expired. A `Ready=False/ClaimExpired` condition is not read:
    it lags behind a `shutdownTime` moved later (until December 6 it counted, and such a claim's hibernated
    Sandbox was deleted before the claim controller rewrote the condition).

    The lifecycle controller ends a hibernated Sandbox's archive by it; the CLI, the Python SDK and routers
    refuse a restore under an expired claim by it (the controller would never carry it out).
    """
    if claim is None:
        return False, None
    lifecycle = (claim.get("spec") or {}).get("lifecycle") or {}
    deadlines = []
    if (shutdown := parse_time(lifecycle.get("shutdownTime"))) is not None:
        deadlines.append(shutdown)
    ttl = lifecycle.get("ttlSecondsAfterFinished")
    finished = status_condition(claim, CONDITION_FINISHED)
    if ttl is not None and finished is not None and finished.get("status") == ConditionStatus.TRUE:
        at = parse_time(finished.get("lastTransitionTime"))
        # Past datetime's range (a TTL above int32: the apiserver does not check the CRD's int32): never.
        if at is not None and at.timestamp() > 0 and (due := deadline_after(at, int(ttl))) is not None:
            deadlines.append(due)
    left = (min(deadlines) - now).total_seconds() if deadlines else None
    return left is not None and left <= 0, left


def archived_template_settings(
    template_annotations: Mapping[str, str] | None, recorded: str | None
) -> Mapping[str, str] | None:
    """The template settings a hibernated Sandbox goes by: its SandboxTemplate's as they are now, or, once the
    template is gone (`template_annotations` None), the `auto-resume` it had when the Sandbox was archived
    (`ANNOTATION_TEMPLATE_AUTO_RESUME`, `recorded`)."""
    if template_annotations is not None:
        return template_annotations
    return {ANNOTATION_AUTO_RESUME: recorded} if recorded is not None else None


def template_auto_resume_record(template_annotations: Mapping[str, str] | None) -> dict[str, str]:
    """The archive annotation recording the template's `auto-resume` at archive time (none when it sets none)."""
    value = (template_annotations or {}).get(ANNOTATION_AUTO_RESUME)
    return {ANNOTATION_TEMPLATE_AUTO_RESUME: str(value)} if value is not None else {}
