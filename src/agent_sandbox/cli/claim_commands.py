"""`agent-sandbox create|list|get|suspend|resume|delete|pools|logs`: the commands that claim sandboxes, show,
suspend, resume and delete the claims, list the warm pools they are claimed from and read a claimed sandbox's
pod log; and the tables they print."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent_sandbox.invocation import cli_command
from agent_sandbox_sdk import (
    SandboxClient,
    SandboxError,
    SandboxInfo,
    SandboxNotFoundError,
    SandboxRequestError,
    WarmPoolInfo,
)
from agent_sandbox_sdk._lifecycle_names import REASON_SANDBOX_HIBERNATED

from .connection import _handle, make_client
from .exit_codes import EXIT_ERROR, EXIT_NOT_FOUND, Handler
from .option_values import _pairs
from .output import CLAIM_RESOURCE, POOL_RESOURCE, age, progress, render

_DELETES_IN_FLIGHT = 8

SANDBOX_COLUMNS: list[tuple[str, Callable[[SandboxInfo], Any]]] = [
    ("CLAIM", lambda i: i.claim_name),
    ("POOL", lambda i: i.warm_pool),
    ("SANDBOX", lambda i: i.sandbox_id),
    ("READY", lambda i: i.ready),
    ("REASON", lambda i: i.reason),
    ("POD IP", lambda i: i.pod_ip),
    ("SUSPENDED", lambda i: i.suspended),
    ("AGE", lambda i: age(i.created)),
]
ALL_NAMESPACES_COLUMNS = [("NAMESPACE", lambda i: i.namespace), *SANDBOX_COLUMNS]  # as `kubectl get -A`
POOL_COLUMNS: list[tuple[str, Callable[[WarmPoolInfo], Any]]] = [
    ("NAME", lambda p: p.name),
    ("TEMPLATE", lambda p: p.template),
    ("READY", lambda p: f"{p.ready_replicas}/{p.replicas}"),
    ("CURRENT", lambda p: p.current_replicas),
    ("REASON", lambda p: p.reason),  # why members are not Ready; the message in -o json|yaml
]
ALL_NAMESPACES_POOL_COLUMNS = [("NAMESPACE", lambda p: p.namespace), *POOL_COLUMNS]


def _render_sandboxes(
    infos: SandboxInfo | list[SandboxInfo],
    fmt: str,
    *,
    columns: list[tuple[str, Callable[[SandboxInfo], Any]]] | None = None,
    namespace: str | None = None,
) -> None:
    rows = infos if isinstance(infos, list) else [infos]
    render(
        infos,
        fmt,
        columns=columns or SANDBOX_COLUMNS,
        name=lambda i: f"{CLAIM_RESOURCE}/{i.claim_name}",
        namespace=namespace,
    )
    if any(i.suspended is None for i in rows):
        # A role that grants claims only (all the SDK needs): say why a column is empty, once.
        print(
            "note: Sandboxes are not readable with these credentials (forbidden): the state shown is the "
            "claim's, and whether a sandbox is suspended is unknown",
            file=sys.stderr,
        )


def _create(args: argparse.Namespace) -> int:
    client = make_client(args)
    labels = dict(_pairs(args.label, "--label"))
    env = dict(_pairs(args.env, "--env"))
    kw: dict[str, Any] = {
        "labels": labels or None,
        "env": env or None,
        "claim_name": args.name,
        "shutdown_after_seconds": args.shutdown_after,
    }
    source = f"template {args.template}" if args.template else f"warm pool {args.pool}"
    with progress(f"creating a sandbox from {source} in {args.namespace}"):
        try:
            if args.template:
                sandbox = client.create_sandbox_from_template(
                    args.template, args.namespace, args.timeout, **kw
                )
            else:
                sandbox = client.create_sandbox(args.pool, args.namespace, args.timeout, **kw)
        except SandboxRequestError as err:
            if err.status_code != 409 or not args.name:
                raise
            # the SDK's message names its keyword (adopt_existing=True), which a CLI user cannot pass
            raise SandboxRequestError(
                f"SandboxClaim {args.namespace}/{args.name} already exists (`{cli_command(f'get {args.name}')}` "
                "shows it; delete it or pick another --name)",
                409,
            ) from None
    claim = sandbox.claim_name or ""
    try:
        info = client.get_sandbox_info(claim, args.namespace)
    except SandboxRequestError as err:
        # The sandbox is created and Ready; a role that may create and watch claims but not `get` them must
        # not make that look like a failure (exit 1 with the claim kept and its name never printed, until
        # December 6).
        print(
            f"warning: SandboxClaim {args.namespace}/{claim} is Ready; reading it failed: {err}",
            file=sys.stderr,
        )
        known = SandboxInfo(
            claim_name=claim,
            namespace=args.namespace,
            sandbox_id=sandbox.sandbox_id,
            ready=True,
            suspended=None,
        )
        _render_sandboxes(known, args.output)  # what the create itself knows, in the format asked for
        return 0
    _render_sandboxes(info, args.output)
    return 0


def _list(args: argparse.Namespace) -> int:
    client = make_client(args)
    namespace = None if args.all_namespaces else args.namespace
    infos = client.list_sandboxes(namespace, args.selector)
    _render_sandboxes(
        infos,
        args.output,
        columns=ALL_NAMESPACES_COLUMNS if args.all_namespaces else None,
        namespace=namespace,
    )
    return 0


def _get(args: argparse.Namespace) -> int:
    client = make_client(args)
    _render_sandboxes(client.get_sandbox_info(args.claim, args.namespace), args.output)
    return 0


def _suspend_resume(suspend: bool) -> Handler:
    def handler(args: argparse.Namespace) -> int:
        # --timeout past 30 days is refused by its parser (`seconds_arg`, exit 2) before this runs: until
        # December 7 `suspend --timeout 1e10` suspended the sandbox, then failed with an OverflowError traceback.
        client = make_client(args)
        sandbox = _handle(client, args)
        verb = "suspending" if suspend else "resuming"
        with progress(f"{verb} {args.namespace}/{args.claim}"):
            if suspend:
                sandbox.suspend(wait=not args.no_wait, timeout=args.timeout)
            else:
                sandbox.resume(wait=not args.no_wait, timeout=args.timeout)
        _render_sandboxes(client.get_sandbox_info(args.claim, args.namespace), args.output)
        return 0

    return handler


def _delete(args: argparse.Namespace) -> int:
    chosen = [bool(args.claims), args.selector is not None, args.all]
    if sum(chosen) != 1:
        raise ValueError("delete needs claim names, -l SELECTOR or --all (exactly one of them)")
    if args.selector is not None and not args.selector.strip():
        raise ValueError("-l needs a label selector (--all deletes every claim)")
    client = make_client(args)
    claims = list(args.claims)
    if not claims:
        # As `kubectl delete -l` / `--all`: the claims that match now, each deleted by name (the `delete` verb,
        # all a role that grants claims needs; a claim gone meanwhile is not an error).
        claims = client.list_all_sandboxes(args.namespace, args.selector or None)
        if not claims:
            print(f"No sandbox claims found in {args.namespace}.", file=sys.stderr)
            return 0

    def delete(claim: str) -> bool | SandboxError:
        try:
            return client.delete_claim(claim, args.namespace)
        except SandboxError as err:  # said with the others: every claim's outcome is reported
            return err

    missing = failed = 0
    # A few DELETEs in flight (each waits ~35 ms on a busy API server; 200 one by one took 6.9 s), each
    # reported in the order given, as kubectl reports them.
    with ThreadPoolExecutor(max_workers=min(_DELETES_IN_FLIGHT, len(claims))) as pool:
        for claim, outcome in zip(claims, pool.map(delete, claims), strict=True):
            if isinstance(outcome, SandboxError):
                print(f"error: sandboxclaim {args.namespace}/{claim}: {outcome}", file=sys.stderr)
                failed += 1
                continue
            print(
                f"sandboxclaim {args.namespace}/{claim} {'deleted' if outcome else 'not found'}",
                file=sys.stderr,
            )
            missing += not outcome
    if failed:
        return EXIT_ERROR
    return EXIT_NOT_FOUND if missing and args.claims and not args.ignore_not_found else 0


def _pools(args: argparse.Namespace) -> int:
    client = make_client(args)  # sets args.namespace to the context's when -n is not given: before it is read
    namespace = None if args.all_namespaces else args.namespace
    pools = client.list_warm_pools(namespace)
    render(
        pools,
        args.output,
        columns=ALL_NAMESPACES_POOL_COLUMNS if args.all_namespaces else POOL_COLUMNS,
        name=lambda p: f"{POOL_RESOURCE}/{p.name}",
        namespace=namespace,
    )
    return 0


def _logs(args: argparse.Namespace) -> int:
    if args.follow and args.previous:
        raise ValueError(
            "--follow and --previous cannot be combined (the previous container no longer writes)"
        )
    client = make_client(args)
    sandbox = _handle(client, args)
    try:
        if args.follow:
            for text in sandbox.follow_logs(container=args.container, tail_lines=args.tail):
                sys.stdout.write(text)
                sys.stdout.flush()
            return 0
        log = sandbox.get_logs(container=args.container, tail_lines=args.tail, previous=args.previous)
    except SandboxRequestError as err:
        why = _without_a_pod(client, args) if err.status_code == 404 else None
        if why is None:
            raise
        raise why from err
    sys.stdout.write(log)
    return 0


def _without_a_pod(client: SandboxClient, args: argparse.Namespace) -> SandboxNotFoundError | None:
    """Why `logs` found no pod, when the claim says: its sandbox is hibernated or suspended (until December 6:
    `HTTP 404: pods "..." not found`, exit 1). None when it says neither, or cannot be read."""
    try:
        info = client.get_sandbox_info(args.claim, args.namespace)
    except SandboxError:
        return None
    where = f"sandbox {args.namespace}/{args.claim}"
    if info.reason == REASON_SANDBOX_HIBERNATED:
        state = "hibernated: it has no pod, so no log"
    elif info.suspended:
        state = "suspended: its pod is gone, and the pod's log with it"
    else:
        return None
    return SandboxNotFoundError(f"{where} is {state}; `{cli_command(f'resume {args.claim}')}` first")
