"""`agent-sandbox lifecycle resume|suspend|hibernate SANDBOX`: a Sandbox's lifecycle by name (ours, docs/lifecycle.md).

Works on Sandbox names (claimed or not; `agent-sandbox resume CLAIM` does the same for a claim through the
SDK).
`resume` works whatever state the Sandbox is in: a suspended Sandbox is set Running (recording
`resume-reason: Manual`), a hibernated one (only its SandboxArchive exists) gets a restore request that the
lifecycle controller carries out, a running one is left alone. With `wait`, it returns once the Sandbox is
Ready. Every write is a merge patch of our own keys plus `spec.operatingMode`, exactly what a user could
write with kubectl.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import sys
import time
from datetime import UTC, datetime
from typing import Any

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.constants import OperatingMode
from agent_sandbox.api.meta import is_ready
from agent_sandbox.cli.arguments import add_connection_options
from agent_sandbox.kube import SANDBOX, ApiClient, KubeError, NotFound, Object, ResourceKind, load_config

__all__ = ["NoSuchSandbox", "ResumeOutcome", "add_lifecycle_commands", "hibernate", "resume", "suspend"]


class NoSuchSandbox(LookupError):
    """Neither a Sandbox nor a hibernated Sandbox has that name."""


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
    api: ApiClient, name: str, namespace: str, *, wait: float | None = None, poll: float = 0.25
) -> ResumeOutcome:
    """Resume (or restore) Sandbox `namespace/name`; with `wait` seconds, until it is Ready.

    Raises:
        NoSuchSandbox: no Sandbox and no archive of that name.
        TimeoutError: not Ready within `wait`.
    """
    now = datetime.now(UTC)
    sandbox = await _get(api, SANDBOX, name, namespace)
    if sandbox is not None:
        if (sandbox.get("spec") or {}).get("operatingMode") == OperatingMode.SUSPENDED:
            await api.patch(SANDBOX, name, lc.resume_patch(lc.Cause.MANUAL, now), namespace=namespace)
            outcome = ResumeOutcome.RESUMED
        else:
            outcome = ResumeOutcome.ALREADY_RUNNING
    else:
        try:
            await api.patch(
                lc.ARCHIVE, name, lc.restore_request_patch(lc.Cause.MANUAL, now), namespace=namespace
            )
        except NotFound:
            raise NoSuchSandbox(f"no Sandbox or hibernated Sandbox named {namespace}/{name}") from None
        outcome = ResumeOutcome.RESTORING
    if wait is not None:
        await _wait_ready(api, name, namespace, wait, poll)
    return outcome


async def _wait_ready(api: ApiClient, name: str, namespace: str, within: float, poll: float) -> None:
    deadline = time.monotonic() + within
    while True:
        sandbox = await _get(api, SANDBOX, name, namespace)
        if sandbox is not None and is_ready(sandbox):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"Sandbox {namespace}/{name} not Ready within {within:g}s")
        await asyncio.sleep(poll)


async def suspend(api: ApiClient, name: str, namespace: str) -> None:
    """Suspend Sandbox `namespace/name` (as `kubectl patch ... operatingMode: Suspended` would)."""
    sandbox = await _get(api, SANDBOX, name, namespace)
    if sandbox is None:
        raise NoSuchSandbox(f"no Sandbox named {namespace}/{name}")
    patch = lc.suspend_patch(lc.Cause.MANUAL, datetime.now(UTC), sandbox["metadata"]["resourceVersion"])
    await api.patch(SANDBOX, name, patch, namespace=namespace)


async def hibernate(api: ApiClient, name: str, namespace: str) -> None:
    """Ask the lifecycle controller to hibernate Sandbox `namespace/name` now (suspending it first)."""
    try:
        await api.patch(
            SANDBOX,
            name,
            {"metadata": {"annotations": {lc.ANNOTATION_HIBERNATE: "true"}}},
            namespace=namespace,
        )
    except NotFound:
        raise NoSuchSandbox(f"no Sandbox named {namespace}/{name}") from None


# --------------------------------------------------------------------------- command line


def _kubeconfig(args: argparse.Namespace) -> str | None:
    if args.kubeconfig:
        return str(args.kubeconfig)
    if args.dev_cluster:
        from agent_sandbox.devcluster import DevCluster

        cluster = DevCluster.load(args.dev_cluster)
        if cluster is None:
            raise RuntimeError(f"no dev cluster named {args.dev_cluster!r}")
        return str(cluster.kubeconfig)
    return None


async def _run(args: argparse.Namespace) -> str:
    api = ApiClient(load_config(_kubeconfig(args), context=args.context))
    if args.namespace is None:  # as kubectl: the context's namespace when -n is not given
        args.namespace = api.config.namespace
    try:
        if args.lifecycle_command == "resume":
            outcome = await resume(
                api, args.sandbox, args.namespace, wait=None if args.no_wait else args.timeout
            )
            return f"sandbox {args.namespace}/{args.sandbox}: {outcome}" + ("" if args.no_wait else ", Ready")
        if args.lifecycle_command == "suspend":
            await suspend(api, args.sandbox, args.namespace)
            return f"sandbox {args.namespace}/{args.sandbox}: suspending"
        await hibernate(api, args.sandbox, args.namespace)
        return f"sandbox {args.namespace}/{args.sandbox}: hibernation requested"
    finally:
        await api.close()


def _handler(args: argparse.Namespace) -> int:
    try:
        print(asyncio.run(_run(args)), file=sys.stderr)
    except NoSuchSandbox as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (KubeError, TimeoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
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
            cmd.add_argument(
                "--timeout", type=float, default=120, help="seconds to wait for Ready (default 120)"
            )
            cmd.add_argument("--no-wait", action="store_true", help="return once the resume is requested")
        cmd.set_defaults(handler=_handler)
