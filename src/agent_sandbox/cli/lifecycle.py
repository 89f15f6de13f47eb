"""`agent-sandbox lifecycle resume|suspend|hibernate SANDBOX`: a Sandbox's lifecycle by name (ours, docs/lifecycle.md).

Works on Sandbox names (claimed or not; `agent-sandbox resume CLAIM` does the same for a claim through the
SDK).
`resume` works whatever state the Sandbox is in: a suspended Sandbox is set Running (recording
`resume-reason: Manual`), a hibernated one (only its SandboxArchive exists) gets a restore request that the
lifecycle controller carries out, a running one is left alone. With `wait`, it returns once the Sandbox is
Ready. Every write is a merge patch of our own keys plus `spec.operatingMode`, exactly what a user could
write with kubectl.

A Sandbox created under a hibernated Sandbox's name (while its SandboxArchive exists) is not the hibernated
one: `resume` refuses (until December 7 it said "already running" while the archive stayed hibernated),
saying to delete it to restore the hibernated one - or, when that has expired, only that the archive is to
be deleted (`Retain`), or nothing but a warning when the controller deletes it (`Delete`, claim expired).
A restore whose archived volume was deleted meanwhile goes ahead, with a warning (`on_warning`).
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.constants import (
    CONDITION_FINISHED,
    REASON_SANDBOX_EXPIRED,
    OperatingMode,
    ShutdownPolicy,
)
from agent_sandbox.api.kinds import SANDBOX_WARM_POOL
from agent_sandbox.api.meta import (
    controlled_by,
    controller_name,
    is_ready,
    parse_time,
    sandbox_pod_name,
    status_condition,
)
from agent_sandbox.cli.arguments import add_connection_options, seconds_arg
from agent_sandbox.invocation import cli_command
from agent_sandbox.kube import (
    POD,
    PVC,
    SANDBOX,
    SANDBOX_CLAIM,
    ApiClient,
    ConfigError,
    Conflict,
    Forbidden,
    KubeError,
    NotFound,
    Object,
    ResourceKind,
    load_config,
)

__all__ = [
    "Hibernated",
    "NoSuchSandbox",
    "Refused",
    "ResumeOutcome",
    "add_lifecycle_commands",
    "hibernate",
    "resume",
    "suspend",
]


class NoSuchSandbox(LookupError):
    """Neither a Sandbox nor a hibernated Sandbox has that name."""


class Refused(RuntimeError):
    """The Sandbox is in no state for this (being deleted, expired, a warm-pool member, hibernated): said at
    once. Until December 6 a resume of an expired or deleted Sandbox waited out its whole timeout, and a
    hibernation of a pool member was accepted and then hit whoever claimed it."""


class Hibernated(Refused):
    """`suspend` or `hibernate` of a hibernated Sandbox: there is no Sandbox object (only its archive), so,
    as `agent-sandbox suspend CLAIM` says it, not found (exit 3)."""


def _expired(spec: Mapping[str, Any], now: datetime, ready: Mapping[str, Any] | None = None) -> bool:
    deadline = parse_time(spec.get("shutdownTime"))
    marked = (
        ready is not None and ready.get("status") == "False" and ready.get("reason") == REASON_SANDBOX_EXPIRED
    )
    return (deadline is not None and now >= deadline) or marked


def _refusal(sandbox: Object, doing: str, now: datetime) -> str:
    """Why `sandbox` will never be `doing` ("" when nothing says so)."""
    meta = sandbox["metadata"]
    where = f"Sandbox {meta.get('namespace')}/{meta['name']}"
    if meta.get("deletionTimestamp"):
        return f"{where} is being deleted: it cannot be {doing}"
    if _expired(sandbox.get("spec") or {}, now, status_condition(sandbox, "Ready")):
        return f"{where} has expired (its shutdownTime passed): it cannot be {doing}"
    return ""


async def _finished(api: ApiClient, sandbox: Object) -> str:
    """Why a Running `sandbox` will never be Ready: its Pod completed (`Finished=True`, a Pod of
    restartPolicy Never or OnFailure that ran to its end, or one evicted, is never restarted, and the Sandbox
    controller does not replace a Pod it still has). Only a condition written for the current generation
    counts: a resume from Suspended bumps it, so a stale one from before the suspend does not.

    The Pod itself is read to confirm it stays: a Pod that had finished and is now being deleted (a suspend
    just before this resume) keeps the Sandbox's `Finished=True`, rewritten for the new generation, yet the
    controller creates a new Pod once it is gone. (A Pod that only reached its terminal phase because it was
    being deleted sets no `Finished` at all, docs/design/sandbox-quirks.md #19.) A Pod gone, being deleted,
    not finished or not readable (no `get pods` grant) is no refusal: the wait goes on. "" then. Until
    December 6 a resume waited out its whole timeout for a finished Sandbox; the first refusal of that day
    also refused one resumed while its old Pod was terminating."""
    meta = sandbox["metadata"]
    finished = status_condition(sandbox, CONDITION_FINISHED)
    if finished is None or finished.get("status") != "True":
        return ""
    if (sandbox.get("spec") or {}).get("operatingMode", OperatingMode.RUNNING) != OperatingMode.RUNNING:
        return ""
    if int(finished.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
        return ""
    try:
        pod = await api.get(POD, sandbox_pod_name(sandbox), namespace=str(meta.get("namespace") or ""))
    except (NotFound, Forbidden):
        return ""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return ""
    if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
        return ""
    return (
        f"Sandbox {meta.get('namespace')}/{meta['name']} has finished ({finished.get('reason')}: "
        f"{finished.get('message')}): its Pod will not run again, so it will not become Ready"
    )


def _pool_member(sandbox: Object, doing: str) -> str:
    """Why an unclaimed warm-pool member is not `doing` ("" for any other Sandbox)."""
    pool = controller_name(sandbox, SANDBOX_WARM_POOL)
    if not pool:
        return ""
    meta = sandbox["metadata"]
    return (
        f"Sandbox {meta.get('namespace')}/{meta['name']} is an unclaimed member of warm pool {pool!r}: pool "
        f"members are never suspended or hibernated (the pool owns them); {doing} the Sandbox of a claim instead"
    )


async def _expired_claim(api: ApiClient, owned: Object, what: str, doing: str) -> str:
    """Why `owned` (a Sandbox, or an archive: it carries the Sandbox's owners) is not `doing` because its
    claim expired ("" when it has no claim, or the claim cannot be read). The claim controller deletes a
    claimed Sandbox at its claim's expiry, and the lifecycle controller an archived one: until December 6 a
    restore under an expired claim was accepted (then deleted again, or left Ready under the claim)."""
    name = controller_name(owned, SANDBOX_CLAIM)
    if not name:
        return ""
    namespace = str(owned["metadata"].get("namespace") or "")
    try:
        claim = await _get(api, SANDBOX_CLAIM, name, namespace)
    except Forbidden:
        return ""  # a role without claims: the lifecycle controller still refuses the restore
    if claim is None or not controlled_by(owned, SANDBOX_CLAIM, str(claim["metadata"].get("uid") or "")):
        return ""  # gone, or a new claim under the name: not the one whose expiry ends this Sandbox
    if not lc.claim_expired(claim, datetime.now(UTC))[0]:
        return ""
    return f"{what} {namespace}/{owned['metadata']['name']}: its SandboxClaim {name!r} has expired: it cannot be {doing}"


class ResumeOutcome(enum.StrEnum):
    RESUMED = "resumed"
    RESTORING = "restoring"
    ALREADY_RUNNING = "already running"


async def _get(api: ApiClient, kind: ResourceKind, name: str, namespace: str) -> Object | None:
    try:
        return await api.get(kind, name, namespace=namespace)
    except NotFound:
        return None


async def resume(
    api: ApiClient,
    name: str,
    namespace: str,
    *,
    wait: float | None = None,
    poll: float = 0.25,
    on_warning: Callable[[str], None] | None = None,
) -> ResumeOutcome:
    """Resume (or restore) Sandbox `namespace/name`; with `wait` seconds, until it is Ready.

    Any resume cancels a pending hibernation (`hibernate` removed), of a running Sandbox too.

    Args:
        on_warning: called with each thing the caller should know that does not stop the resume (a restore
            whose archived volume was deleted: it comes back with a new, empty one; a Sandbox created under
            the name of a hibernated Sandbox that has expired: it gets new volumes once the archive is gone).

    Raises:
        NoSuchSandbox: no Sandbox and no archive of that name (also: deleted while `wait` waited for it).
        Refused: it (or its archive) is being deleted, or expired, or its claim expired; or the Sandbox of
            that name is not the hibernated one (created under the name while it is hibernated), and the
            archive is not being deleted by the controller.
        TimeoutError: not Ready within `wait`.
    """
    outcome = await _resume_once(api, name, namespace, on_warning or (lambda _note: None))
    if wait is not None:
        await _wait_ready(api, name, namespace, wait, poll)
    return outcome


async def _resume_once(
    api: ApiClient, name: str, namespace: str, warn: Callable[[str], None]
) -> ResumeOutcome:
    warned: set[str] = set()
    for _attempt in range(3):
        now = datetime.now(UTC)
        sandbox = await _get(api, SANDBOX, name, namespace)
        if await _being_archived(api, sandbox, name, namespace):
            sandbox = None  # deleted to be archived (volumes orphaned to the archive): restore it
        if sandbox is not None:
            if why := _refusal(sandbox, "resumed", now) or await _expired_claim(
                api, sandbox, "Sandbox", "resumed"
            ):
                raise Refused(why)
            why, note = await _newcomer(api, sandbox, now)
            if why:
                raise Refused(why)
            if note and note not in warned:  # once, also when a conflict makes us look again
                warned.add(note)
                warn(note)
            rv = sandbox["metadata"].get("resourceVersion")
            annotations = sandbox["metadata"].get("annotations") or {}
            try:
                if (sandbox.get("spec") or {}).get("operatingMode") == OperatingMode.SUSPENDED:
                    patch = lc.resume_patch(lc.Cause.MANUAL, now, rv)
                    await api.patch(SANDBOX, name, patch, namespace=namespace)
                    return ResumeOutcome.RESUMED
                if lc.ANNOTATION_HIBERNATE in annotations:  # Running, about to be suspended to be archived
                    cancel = {
                        "metadata": {"resourceVersion": rv, "annotations": {lc.ANNOTATION_HIBERNATE: None}}
                    }
                    await api.patch(SANDBOX, name, cancel, namespace=namespace)
            except Conflict:
                continue  # the lifecycle controller (or a router) wrote first: look again
            return ResumeOutcome.ALREADY_RUNNING
        archive = await _get(api, lc.ARCHIVE, name, namespace)
        if archive is None:
            raise NoSuchSandbox(f"no Sandbox or hibernated Sandbox named {namespace}/{name}")
        where = f"hibernated Sandbox {namespace}/{name}"
        if archive["metadata"].get("deletionTimestamp"):
            raise Refused(f"{where} is being deleted: it cannot be restored")
        if _expired(((archive.get("spec") or {}).get("sandbox") or {}).get("spec") or {}, now):
            raise Refused(f"{where} has expired (its shutdownTime passed): it is not restored")
        if why := await _expired_claim(api, archive, "hibernated Sandbox", "restored"):
            raise Refused(why)
        missing = await _missing_volumes(api, archive)
        try:
            await api.patch(
                lc.ARCHIVE, name, lc.restore_request_patch(lc.Cause.MANUAL, now), namespace=namespace
            )
        except NotFound:
            continue  # restored (or deleted) meanwhile: look again
        for pvc in missing:
            warn(
                f"the volume PersistentVolumeClaim {pvc!r} of {where} was deleted while it was hibernated: "
                "it is restored without that data, with a new, empty volume in its place"
            )
        return ResumeOutcome.RESTORING
    raise Refused(f"Sandbox {namespace}/{name} kept changing while resuming; try again")


async def _newcomer(api: ApiClient, sandbox: Object, now: datetime) -> tuple[str, str]:
    """(why `sandbox` is refused, a warning) when it is not the hibernated Sandbox its name's SandboxArchive
    keeps; ("", "") when there is no archive, or `sandbox` is the archived one or its restore (also one an
    older controller created, of an archive not expired: `owners.legacy_restore`), or archives cannot be
    read (the controllers still keep the archived volumes from it).

    A Sandbox created under the name while it is hibernated does not get the archived volumes (the Sandbox
    controller refuses them). While the hibernated one can be restored, it is refused: delete it and resume
    again to restore, or delete the archive to keep it. An archive that has expired is never restored: one
    the lifecycle controller deletes (`shutdownPolicy: Delete`, or its claim expired) is no refusal, only a
    warning (the newcomer gets new volumes once the old ones are gone); one kept (`Retain`) is refused with
    "delete the archive" (until December 7 both were refused with "delete it ... to restore the hibernated
    one", which never happens). Until December 7 `resume` said "already running" of a newcomer, exit 0,
    with the archive left hibernated."""
    # Here, not at the top: the controllers' lifecycle package (its metrics, profiling) is a good part of the
    # CLI's start-up, and only this check needs it.
    from agent_sandbox.controllers.lifecycle.owners import legacy_restore, restores

    meta = sandbox["metadata"]
    namespace, name = str(meta.get("namespace") or ""), str(meta["name"])
    try:
        archive = await _get(api, lc.ARCHIVE, name, namespace)
    except Forbidden:
        return "", ""
    if archive is None or archive["metadata"].get("deletionTimestamp"):
        return "", ""
    spec = archive.get("spec") or {}
    archive_meta = archive["metadata"]
    restored_uid = (archive_meta.get("annotations") or {}).get(lc.ANNOTATION_RESTORED_UID)
    if meta.get("uid") == spec.get("sandboxUID") or restores(
        sandbox, str(archive_meta.get("uid") or ""), restored_uid
    ):
        return "", ""
    archived = (spec.get("sandbox") or {}).get("spec") or {}
    kept = f"SandboxArchive {namespace}/{name}"
    newcomer = (
        f"Sandbox {namespace}/{name} is not the hibernated one: it was created under the name while {kept} "
        f"keeps the Sandbox hibernated at {spec.get('archivedAt') or '?'} and its volumes, which this one "
        "does not get"
    )
    delete_archive = f"kubectl delete sandboxarchive -n {namespace} {name}; its volumes go with it"
    expired = _expired(archived, now)
    if (expired and archived.get("shutdownPolicy") == ShutdownPolicy.DELETE) or await _expired_claim(
        api, archive, "hibernated Sandbox", "restored"
    ):
        return "", (
            f"Sandbox {namespace}/{name} was created under the name while {kept} keeps a hibernated Sandbox "
            "that has expired: the lifecycle controller deletes that archive and its volumes, and this "
            "Sandbox gets new, empty volumes once they are gone"
        )
    if expired or (archive_meta.get("annotations") or {}).get(lc.ANNOTATION_EXPIRED_AT):
        # An older controller's restore too: the lifecycle controller takes an expired archive's Sandbox for
        # a newcomer (`decide._with_archive`), and gives it none of the archived volumes.
        return (
            f"{newcomer}. The hibernated one has expired (its shutdownTime passed; shutdownPolicy Retain): it "
            f"is never restored. Delete the archive ({delete_archive}) for this one to get new volumes"
        ), ""
    if legacy_restore(sandbox, archive):
        return "", ""  # an older controller's restore (of an archive not expired): finished by the controller
    return (
        f"{newcomer}. Delete it (kubectl delete sandbox -n {namespace} {name}) and run this again to "
        f"restore the hibernated one, or delete the archive ({delete_archive}) to keep this one"
    ), ""


async def _missing_volumes(api: ApiClient, archive: Object) -> list[str]:
    """The archive's PVCs (`spec.children`) that are gone; none said when PVCs cannot be read."""
    namespace = str(archive["metadata"].get("namespace") or "")
    missing = []
    for child in (archive.get("spec") or {}).get("children") or []:
        if child.get("kind") != "PersistentVolumeClaim":
            continue
        try:
            if await _get(api, PVC, str(child.get("name")), namespace) is None:
                missing.append(str(child.get("name")))
        except Forbidden:
            return []
    return missing


async def _being_archived(api: ApiClient, sandbox: Object | None, name: str, namespace: str) -> bool:
    """`sandbox` is being deleted by its hibernation (its archive exists): a restore follows, not the end."""
    if sandbox is None or not sandbox["metadata"].get("deletionTimestamp"):
        return False
    return await _get(api, lc.ARCHIVE, name, namespace) is not None


async def _deleted(api: ApiClient, name: str, namespace: str) -> bool:
    """After a read found no Sandbox: nothing will come back, neither a restore (its archive exists until the
    restored Sandbox does) nor a hibernation under way (it creates the archive before deleting the Sandbox).
    The Sandbox is read again after the archive, so a restore that created it and deleted its archive between
    the reads is seen. Archives that cannot be read (no grant) tell nothing: waited for, as before."""
    try:
        if await _get(api, lc.ARCHIVE, name, namespace) is not None:
            return False
    except Forbidden:
        return False
    return await _get(api, SANDBOX, name, namespace) is None


async def _wait_ready(api: ApiClient, name: str, namespace: str, within: float, poll: float) -> None:
    deadline = time.monotonic() + within
    while True:
        sandbox = await _get(api, SANDBOX, name, namespace)
        if sandbox is not None and is_ready(sandbox):
            return
        if sandbox is None and await _deleted(api, name, namespace):
            # Until December 7 a Sandbox deleted while it started (one without a finalizer is gone in one
            # step, never seen being deleted) was waited for until --timeout, then "not Ready" (exit 4).
            raise NoSuchSandbox(f"Sandbox {namespace}/{name} was deleted while it started")
        why = (
            (_refusal(sandbox, "Ready", datetime.now(UTC)) or await _finished(api, sandbox))
            if sandbox is not None
            else ""
        )
        # The archived object going away before its restore is no reason to give up.
        if why and not await _being_archived(api, sandbox, name, namespace):
            raise Refused(why)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"Sandbox {namespace}/{name} not Ready within {within:g}s")
        await asyncio.sleep(poll)


async def _missing(api: ApiClient, name: str, namespace: str) -> Exception:
    if await _get(api, lc.ARCHIVE, name, namespace) is not None:
        return Hibernated(
            f"Sandbox {namespace}/{name} is hibernated already (archived, volumes kept); "
            f"`{cli_command(f'lifecycle resume -n {namespace} {name}')}` restores it"
        )
    return NoSuchSandbox(f"no Sandbox named {namespace}/{name}")


async def suspend(api: ApiClient, name: str, namespace: str) -> None:
    """Suspend Sandbox `namespace/name` (as `kubectl patch ... operatingMode: Suspended` would).

    Raises:
        NoSuchSandbox: no Sandbox of that name.
        Refused: hibernated already, being deleted, expired, or an unclaimed warm-pool member.
    """
    sandbox = await _get(api, SANDBOX, name, namespace)
    if sandbox is None:
        raise await _missing(api, name, namespace)
    now = datetime.now(UTC)
    if why := _refusal(sandbox, "suspended", now) or _pool_member(sandbox, "suspend"):
        # A pool member suspended stays in the pool, counted as warm: until December 6 it was accepted
        # (`hibernate` refused it), leaving the pool one Ready member short for good.
        raise Refused(why)
    patch = lc.suspend_patch(lc.Cause.MANUAL, now, sandbox["metadata"]["resourceVersion"])
    await api.patch(SANDBOX, name, patch, namespace=namespace)


async def hibernate(api: ApiClient, name: str, namespace: str) -> None:
    """Ask the lifecycle controller to hibernate Sandbox `namespace/name` now (suspending it first).

    Raises:
        NoSuchSandbox: no Sandbox of that name.
        Refused: hibernated already, being deleted, expired, or an unclaimed warm-pool member (the lifecycle
            controller never touches those; the request would wait for whoever claims it).
    """
    sandbox = await _get(api, SANDBOX, name, namespace)
    if sandbox is None:
        raise await _missing(api, name, namespace)
    if why := _refusal(sandbox, "hibernated", datetime.now(UTC)) or _pool_member(sandbox, "hibernate"):
        raise Refused(why)
    patch = {
        "metadata": {
            # Guarded: a claim adopting the member meanwhile makes this fail rather than hit the claimer.
            "resourceVersion": sandbox["metadata"].get("resourceVersion"),
            "annotations": {lc.ANNOTATION_HIBERNATE: "true"},
        }
    }
    try:
        await api.patch(SANDBOX, name, patch, namespace=namespace)
    except NotFound:
        raise NoSuchSandbox(f"no Sandbox named {namespace}/{name}") from None
    except Conflict:
        raise Refused(f"Sandbox {namespace}/{name} changed meanwhile; try again") from None


# --------------------------------------------------------------------------- command line


def _kubeconfig(args: argparse.Namespace) -> str | None:
    if args.kubeconfig:
        return str(args.kubeconfig)
    if args.dev_cluster:
        from agent_sandbox.devcluster import DevCluster

        cluster = DevCluster.load(args.dev_cluster)
        if cluster is None:
            # Said as the sandbox commands say it (cli/sandboxes.py), with the same exit code.
            raise ConfigError(
                f"no dev cluster named {args.dev_cluster!r}; start one with "
                f"`{cli_command(f'dev up --name {shlex.quote(args.dev_cluster)}')}`"
            )
        return str(cluster.kubeconfig)
    return None


async def _run(args: argparse.Namespace) -> str:
    api = ApiClient(load_config(_kubeconfig(args), context=args.context))
    if args.namespace is None:  # as kubectl: the context's namespace when -n is not given
        args.namespace = api.config.namespace
    try:
        if args.lifecycle_command == "resume":
            outcome = await resume(
                api,
                args.sandbox,
                args.namespace,
                wait=None if args.no_wait else args.timeout,
                on_warning=lambda note: print(f"warning: {note}", file=sys.stderr),
            )
            return f"sandbox {args.namespace}/{args.sandbox}: {outcome}" + ("" if args.no_wait else ", Ready")
        if args.lifecycle_command == "suspend":
            await suspend(api, args.sandbox, args.namespace)
            return f"sandbox {args.namespace}/{args.sandbox}: suspending"
        await hibernate(api, args.sandbox, args.namespace)
        return f"sandbox {args.namespace}/{args.sandbox}: hibernation requested"
    finally:
        await api.close()


#: Exit codes, as the sandbox commands' (cli/sandboxes.py): an error from the cluster or a refusal, unusable
#: input, not found, timed out waiting. Until December 6 not found and timed out were 1 here (3 and 4 there).
_EXIT_ERROR, _EXIT_USAGE, _EXIT_NOT_FOUND, _EXIT_TIMEOUT = 1, 2, 3, 4


def _handler(args: argparse.Namespace) -> int:
    try:
        print(asyncio.run(_run(args)), file=sys.stderr)
    except (NoSuchSandbox, Hibernated, NotFound) as err:  # NotFound: gone between a read and a write
        print(f"error: {err}", file=sys.stderr)
        return _EXIT_NOT_FOUND
    except TimeoutError as err:  # not Ready within --timeout (the API client's own timeouts are KubeErrors)
        print(f"error: {err}", file=sys.stderr)
        return _EXIT_TIMEOUT
    except (Refused, KubeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return _EXIT_ERROR
    except ConfigError as err:
        # No kubeconfig, a missing file, an unknown context or dev cluster: one line and exit 2, as `list`
        # says it (until December 6 a traceback, or `error: RuntimeError: ...` for the dev cluster).
        print(f"error: {err}", file=sys.stderr)
        return _EXIT_USAGE
    return 0


def add_lifecycle_commands(sub: Any) -> None:
    """Register `agent-sandbox lifecycle ...` on the top-level subparsers."""
    parser = sub.add_parser(
        "lifecycle", help="resume (or restore), suspend or hibernate a Sandbox by name (docs/lifecycle.md)"
    )
    cmds = parser.add_subparsers(dest="lifecycle_command", required=True)
    for name, text in (
        ("resume", "resume a suspended Sandbox, or restore a hibernated one, and wait until Ready"),
        ("suspend", "suspend a Sandbox (its pod goes, volumes stay)"),
        ("hibernate", "hibernate a Sandbox now: suspend it, then archive it (volumes stay)"),
    ):
        cmd = cmds.add_parser(name, help=text, description=text)
        cmd.add_argument("sandbox", help="Sandbox name")
        add_connection_options(cmd)  # --router-url is accepted and unused: these calls need no router
        cmd.set_defaults(connection_options=True)
        if name == "resume":
            # A positive number, as every --timeout (`nan` waited for good, until December 6).
            cmd.add_argument(
                "--timeout", type=seconds_arg, default=120, help="seconds to wait for Ready (default 120)"
            )
            cmd.add_argument("--no-wait", action="store_true", help="return once the resume is requested")
        cmd.set_defaults(handler=_handler)
