"""`agent-sandbox create|list|get|exec|cp|suspend|resume|delete|pools|logs`: sandboxes from the command line.

Every command is a thin layer over the Python SDK (`agent_sandbox_sdk.SandboxClient`). Common options:
`-o table|json|yaml` (and `name` where it prints claims or pools), `-n/--namespace` (default: the kubeconfig
context's, as kubectl), `--kubeconfig`, `--context`, `--router-url` (default: the `--dev-cluster`'s router,
else `$AGENT_SANDBOX_ROUTER_URL`), `--dev-cluster NAME` (a local dev cluster's kubeconfig and router); all
but `-o` may also come before the command.

Exit codes: 0 success; `exec` exits with the command's own code (124 when it timed out); 1 an error from
the cluster, router or sandbox (one that cannot be reached too); 2 invalid usage or input; 3 not found (said
by the SDK, or answered 404); 4 timed out waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent_sandbox_sdk import (
    CommandEvent,
    CommandExecutor,
    CommandStream,
    ExecutionResult,
    Sandbox,
    SandboxClaimFailedError,
    SandboxClient,
    SandboxdDirectConnectionConfig,
    SandboxDirectConnectionConfig,
    SandboxdPodTunnelConnectionConfig,
    SandboxError,
    SandboxInfo,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxTemplateNotFoundError,
    SandboxTimeoutError,
    SandboxWarmPoolNotFoundError,
    WarmPoolInfo,
)
from agent_sandbox_sdk._claims import MAX_SHUTDOWN_AFTER_SECONDS
from agent_sandbox_sdk._kube import object_not_found
from agent_sandbox_sdk._lifecycle import REASON_SANDBOX_HIBERNATED
from agent_sandbox_sdk._shared import router_token_headers
from agent_sandbox_sdk.constants import ROUTER_URL_ENV
from agent_sandbox_sdk.models import SandboxConnectionConfig

from .arguments import claim_arg, common_options, seconds_arg
from .copy import copy
from .output import (
    CLAIM_RESOURCE,
    FORMATS,
    OBJECT_FORMATS,
    POOL_RESOURCE,
    TEXT_ONLY,
    age,
    progress,
    relay_output,
    render,
)

__all__ = ["EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_TIMEOUT", "EXIT_USAGE", "add_sandbox_commands"]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_TIMEOUT = 4

_DELETES_IN_FLIGHT = 8

Handler = Callable[[argparse.Namespace], int]

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


# ----------------------------------------------------------------------------------------- setup


def _dev_cluster(name: str) -> tuple[str, str | None]:
    """(kubeconfig, router URL or None) of a local dev cluster."""
    from agent_sandbox.devcluster import DevCluster

    cluster = DevCluster.load(name)
    if cluster is None:
        raise ValueError(
            f"no dev cluster named {name!r}; start one with `agent-sandbox dev up --name {name}`"
        )
    from agent_sandbox.devcluster.router import router_url

    url = router_url(cluster)
    return str(cluster.kubeconfig), url


def _router_url(args: argparse.Namespace) -> str | None:
    """--router-url, else the --dev-cluster's router, else $AGENT_SANDBOX_ROUTER_URL.

    `--dev-cluster NAME` is NAME's kubeconfig and router: until December 6 the environment's router (set for
    another cluster, say) took NAME's sandboxes. The environment's serves a dev cluster that runs none."""
    url = args.router_url
    if not url and args.dev_cluster:
        url = _dev_cluster(args.dev_cluster)[1]
    url = url or os.environ.get(ROUTER_URL_ENV)
    return str(url) if url else None


def make_client(args: argparse.Namespace, *, sandboxd: bool = False) -> SandboxClient:
    """The SDK client the common options describe.

    `sandboxd`: reach the sandbox's sandboxd API (gRPC process service: stdin, PTY) - through the router
    (which needs `--enable-h2c`) when there is one, else by a port-forward to the pod - instead of the legacy
    runtime's HTTP API.
    """
    kubeconfig = args.kubeconfig
    if args.dev_cluster:  # looked up even when --kubeconfig is given: a cluster that is not up is an error
        dev_kubeconfig = _dev_cluster(args.dev_cluster)[0]
        kubeconfig = kubeconfig or dev_kubeconfig
    router_url = _router_url(args)
    if not router_url and getattr(args, "router_token_file", None):
        # Without a URL the tunnel to `sandbox-router-svc` carries no headers (upstream's config has none):
        # the token would be dropped and the router answer 401 without a hint.
        raise ValueError(
            "--router-token-file needs the router's URL (--router-url or $AGENT_SANDBOX_ROUTER_URL)"
        )
    config: SandboxConnectionConfig | None = (
        _router_config(router_url, sandboxd, _router_headers(args)) if router_url else None
    )
    if config is None and sandboxd:
        config = SandboxdPodTunnelConnectionConfig()
    client = SandboxClient(config, kubeconfig=kubeconfig, context=args.context)
    if args.namespace is None:  # as kubectl: the context's namespace when -n is not given
        args.namespace = client.context_namespace
    return client


def _router_headers(args: argparse.Namespace) -> dict[str, str]:
    """`Authorization: Bearer <token>` from --router-token-file, else $AGENT_SANDBOX_ROUTER_TOKEN, else none.

    The file is read at each start, so a projected service-account token kubelet rotates keeps working. A
    value written with its scheme (`Bearer v1....`) is taken without it, as the SDK does (`router_token_headers`).
    """
    path = getattr(args, "router_token_file", None)
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as err:
            raise ValueError(f"--router-token-file {path}: {err.strerror or err}") from None
        if not token:
            raise ValueError(f"--router-token-file {path} is empty")
        return router_token_headers(token)
    return router_token_headers(None)


def _router_config(
    url: str, sandboxd: bool = False, headers: dict[str, str] | None = None
) -> SandboxConnectionConfig:
    """The router connection; an unusable URL is a one-line usage error, not pydantic's report."""
    try:
        if sandboxd:
            return SandboxdDirectConnectionConfig(api_url=url, extra_headers=headers or {})
        return SandboxDirectConnectionConfig(api_url=url, extra_headers=headers or {})
    except ValidationError as err:
        reason = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())
        raise ValueError(f"--router-url / ${ROUTER_URL_ENV} {url!r}: {reason}") from None


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


# ----------------------------------------------------------------------------------------- commands


def _shutdown_after_arg(value: str) -> int:
    """`--shutdown-after`: whole seconds, 1 to 100 years. Checked by argparse (exit 2 naming the option):
    until December 6 the SDK refused it, naming its own parameter `shutdown_after_seconds`."""
    try:
        seconds = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {value!r}") from None
    if not 0 < seconds <= MAX_SHUTDOWN_AFTER_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds up to {MAX_SHUTDOWN_AFTER_SECONDS} (100 years), got {value!r}"
        )
    return seconds


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
                f"SandboxClaim {args.namespace}/{args.name} already exists (`agent-sandbox get {args.name}` "
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


def _handle(client: SandboxClient, args: argparse.Namespace) -> Sandbox:
    return client.get_sandbox(args.claim, args.namespace)


def _exec(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0].startswith("-"):  # `exec CLAIM -n ns -- cmd`: options after the claim
        if "--" not in argv:
            # `exec CLAIM -n ns ls` ran `-n ns ls` in CLAIM of the *default* namespace (or failed naming it),
            # until December 6; kubectl too wants `--` before the command
            raise ValueError(
                f"options after the claim need -- before the command: agent-sandbox exec CLAIM "
                f"{' '.join(argv[:2])} -- COMMAND [ARGS...]"
            )
        cut = argv.index("--")
        args.exec_parser.parse_args([*argv[:cut], args.claim], namespace=args)
        argv = argv[cut + 1 :]
    if not argv:
        raise ValueError("exec needs a command: agent-sandbox exec CLAIM -- COMMAND [ARGS...]")
    command = argv[0] if len(argv) == 1 else shlex.join(argv)
    env = dict(_pairs(args.env, "--env"))
    if args.stdin or args.tty:
        if args.output != "table":
            raise ValueError(
                "-o json|yaml cannot be combined with -i / -t (their output is the command's own)"
            )
        from .interactive import run_interactive

        commands = _handle(make_client(args, sandboxd=True), args).commands
        assert commands is not None
        return _exit_of(
            run_interactive(
                lambda pty: commands.stream(
                    command, timeout=args.timeout, env=env or None, cwd=args.cwd, pty=pty
                ),
                stdin=args.stdin,
                want_tty=args.tty,
            ),
            args.timeout,
        )
    sandbox = _handle(make_client(args), args)
    assert sandbox.commands is not None
    # Without --timeout the runtime's own limit ends the command (300 s by default), as kubectl exec waits for
    # as long as it runs; a router or sandbox that stops answering is given up after the SDK's idle limit for
    # streams (90 s: the runtime writes a keep-alive line after 30 s of silence).
    stream = sandbox.commands.stream(command, timeout=args.timeout, env=env or None, cwd=args.cwd)
    if args.output != "table":
        result = _collected(stream, sandbox.commands, command, args, env)
        if result.timed_out:
            print(_timed_out(args.timeout), file=sys.stderr)
        render(result, args.output)
        return _exit_code(result)
    return _exit_of(relay_output(stream), args.timeout)


def _collected(
    stream: CommandStream,
    commands: CommandExecutor,
    command: str,
    args: argparse.Namespace,
    env: dict[str, str],
) -> ExecutionResult:
    """`exec -o json|yaml`'s result: the stream, collected, else (upstream's runtime) one `/execute`.

    The stream, not `run`: one request answered only when the command ends could not tell a quiet command from a
    router that stopped answering (it waited up to a day for one, until December 6) and met a router's
    --proxy-timeout (180 s) however long the command was let run. A timed-out command's exit code is 124, as
    sandboxd's `run` and the table output report it (the stream says how it was killed: -9). Upstream's
    python-runtime has no `/execute/stream` (404): there the command runs through `/execute` as before.
    """
    try:
        with stream:
            result: ExecutionResult = stream.result()
    except SandboxRequestError as err:
        if err.status_code != 404:
            raise
        return commands.run(
            command,
            # Without --timeout the runtime's own limit ends the command (300 s by default); a router bounds
            # the wait by its --proxy-timeout, and says so.
            timeout=args.timeout + 10 if args.timeout else _WAIT_FOR_THE_RUNTIME,
            command_timeout=args.timeout,
            env=env or None,
            cwd=args.cwd,
        )
    if result.timed_out:
        result = result.model_copy(update={"exit_code": TIMED_OUT_EXIT_CODE})
    return result


#: How long `exec -o json` waits for upstream's runtime's answer (`/execute`, no stream) without --timeout: the
#: runtime's own limit ends the command first (its largest is a day).
_WAIT_FOR_THE_RUNTIME = 24 * 3600.0
#: What a command the runtime killed for its time limit exits with (GNU timeout's, sandboxd's).
TIMED_OUT_EXIT_CODE = 124


def _exit_of(exit_event: CommandEvent | None, timeout: float | None) -> int:
    """exec's exit status: the command's, 124 when it timed out."""
    if exit_event is None:
        raise SandboxError("the command stream ended without an exit code")
    if exit_event.timed_out:
        print(_timed_out(timeout), file=sys.stderr)
    return _exit_code(ExecutionResult(exit_code=exit_event.exit_code or 0, timed_out=exit_event.timed_out))


def _timed_out(timeout: float | None) -> str:
    """What exec says of a command killed for its time limit: --timeout's, else the runtime's own (until
    December 6 that case formatted the missing --timeout: a TypeError traceback and exit 1, not 124)."""
    if timeout is None:
        return (
            "error: the command timed out: the runtime's time limit ended it (300 s unless the runtime sets "
            "another; --timeout N sets one)"
        )
    return f"error: the command timed out after {timeout:g} s"


def _exit_code(result: ExecutionResult) -> int:
    """The command's exit status as a shell reports it: 124 for a timeout, 128 + N for a death by signal N
    (runtimes report -N, Python's convention), anything else out of range EXIT_ERROR."""
    if result.timed_out:
        return 124
    if -127 <= result.exit_code < 0:
        return 128 - result.exit_code
    return result.exit_code if 0 <= result.exit_code <= 255 else EXIT_ERROR


def _cp(args: argparse.Namespace) -> int:
    return copy(make_client(args), args)


def _suspend_resume(suspend: bool) -> Handler:
    def handler(args: argparse.Namespace) -> int:
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
    pools = make_client(args).list_warm_pools(args.namespace)
    render(
        pools,
        args.output,
        columns=POOL_COLUMNS,
        name=lambda p: f"{POOL_RESOURCE}/{p.name}",
        namespace=args.namespace,
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
    return SandboxNotFoundError(f"{where} is {state}; `agent-sandbox resume {args.claim}` first")


def _proxy(args: argparse.Namespace) -> int:
    router = _router_url(args)
    if not router:
        raise ValueError(f"proxy needs the router: --router-url, ${ROUTER_URL_ENV} or --dev-cluster")
    if not 0 < args.port < 65536 or not 0 <= args.local_port < 65536:
        raise ValueError("ports are 1-65535 (--local-port 0: any free one)")
    info = make_client(args).get_sandbox_info(args.claim, args.namespace)
    if not info.sandbox_id:
        raise ValueError(
            f"SandboxClaim {args.namespace}/{args.claim} has no Sandbox yet (reason: {info.reason})"
        )
    from .proxy import ListenError, serve_proxy  # aiohttp's server, only for this command

    routing = {
        "X-Sandbox-ID": info.sandbox_id,
        "X-Sandbox-Namespace": args.namespace,
        "X-Sandbox-Port": str(args.port),
        **_router_headers(args),  # checks the token file now; the proxy reads it again when it changes
    }
    describe = f"port {args.port} of {args.namespace}/{args.claim} (Sandbox {info.sandbox_id})"
    serve = serve_proxy(
        router,
        routing,
        address=args.address,
        port=args.local_port,
        describe=describe,
        token_file=getattr(args, "router_token_file", None),
    )
    try:
        asyncio.run(serve)
    except ListenError as err:  # a port in use: one line, not aiohttp's traceback
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def _pairs(values: list[str] | None, flag: str) -> list[tuple[str, str]]:
    out = []
    for value in values or []:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {value!r}: expected KEY=VALUE")
        out.append((key, val))
    return out


def _guard(handler: Handler) -> Handler:
    """Errors -> one `error:` line and the exit codes of the module docstring."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except SandboxClaimFailedError as err:
            # Before "not found": what `get_sandbox` raises for a claim that failed is also a
            # `SandboxNotFoundError` (upstream's contract), but it exists - exit 1, as `create`'s.
            _report(err)
            return EXIT_ERROR
        except (SandboxNotFoundError, SandboxWarmPoolNotFoundError, SandboxTemplateNotFoundError) as err:
            _report(err)
            # `get_sandbox` reports every failure as not found (upstream's contract): it is one only when the
            # SDK said so itself or something answered 404. A refusal is not one, nor a request that got no
            # answer (status None: an unreachable API server was exit 3 until December 6, where `get` said 1).
            cause = err.__cause__
            missing = not isinstance(cause, SandboxRequestError) or cause.status_code == 404
            return EXIT_NOT_FOUND if missing else EXIT_ERROR
        except SandboxTimeoutError as err:
            _report(err)
            return EXIT_TIMEOUT
        except SandboxRequestError as err:
            # The API server's own "not there" (a namespace `create -n` names, a pod that is gone): not found,
            # as the docstring says; until December 6 exit 1. Not a 404 for an API it does not serve (no CRDs),
            # nor a router's or runtime's own 404 (cp and exec say those themselves).
            _report(err)
            return EXIT_NOT_FOUND if _object_missing(err) else EXIT_ERROR
        except SandboxError as err:
            _report(err)
            return EXIT_ERROR
        except (ValueError, FileNotFoundError, IsADirectoryError, NotImplementedError) as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_USAGE
        except BrokenPipeError:
            raise  # stdout closed by a reader (`| head`): the entry point's exit 141, as a shell's SIGPIPE
        except OSError as err:
            # The local file system (`cp`: a file where the tree has a directory, one the user cannot read,
            # a full disk): exit 1 as cp's, one line (until December 7 a traceback).
            print(f"error: {err}", file=sys.stderr)
            return EXIT_ERROR

    return run


def _object_missing(err: SandboxRequestError) -> bool:
    """The Kubernetes API server answered 404 for an object (a `Status` body)."""
    return err.status_code == 404 and err.response is not None and object_not_found(err.response)


def _report(err: SandboxError) -> None:
    """The error, and what the SDK noted on it (a claim a failed create could not delete)."""
    print(f"error: {err}", file=sys.stderr)
    for note in getattr(err, "__notes__", ()):
        print(f"note: {note}", file=sys.stderr)


# ----------------------------------------------------------------------------------------- parser


def add_sandbox_commands(sub: Any) -> None:
    """Register the sandbox commands on the top-level subparsers."""
    parents: dict[tuple[str, ...], argparse.ArgumentParser] = {
        f: common_options(f) for f in (FORMATS, OBJECT_FORMATS, TEXT_ONLY)
    }

    def add(
        name: str, handler: Handler, help_text: str, formats: tuple[str, ...] = FORMATS
    ) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(
            name, parents=[parents[formats]], help=help_text, description=help_text
        )
        parser.set_defaults(handler=_guard(handler))
        return parser

    create = add(
        "create",
        _create,
        "claim a sandbox from a warm pool (or cold from a template) and wait until Ready",
        OBJECT_FORMATS,
    )
    source = create.add_mutually_exclusive_group(required=True)
    source.add_argument("pool", nargs="?", help="warm pool name")
    source.add_argument("--template", help="cold start from this SandboxTemplate (via a replicas-0 pool)")
    create.add_argument("--name", help="claim name (default: sandbox-claim-<8 hex>)")
    create.add_argument(
        "--timeout", type=seconds_arg, default=180, help="seconds to wait for Ready (default 180)"
    )
    create.add_argument("--label", action="append", metavar="KEY=VALUE", help="claim label (repeatable)")
    create.add_argument(
        "--env", action="append", metavar="KEY=VALUE", help="environment variable (repeatable)"
    )
    create.add_argument(
        "--shutdown-after",
        type=_shutdown_after_arg,
        metavar="SECONDS",
        help="delete the claim after this long (whole seconds, up to 100 years)",
    )

    lst = add("list", _list, "list claimed sandboxes", OBJECT_FORMATS)
    lst.add_argument("-l", "--selector", help="label selector on claims")
    lst.add_argument(
        "-A", "--all-namespaces", action="store_true", help="claims of every namespace (a NAMESPACE column)"
    )

    get = add("get", _get, "show one claimed sandbox", OBJECT_FORMATS)
    get.add_argument("claim", type=claim_arg)

    exe = add("exec", _exec, "run a command in a sandbox, streaming its output; exits with its exit code")
    exe.add_argument("claim", type=claim_arg)
    exe.add_argument("argv", nargs=argparse.REMAINDER, metavar="[OPTIONS] -- COMMAND [ARGS...]")
    exe.add_argument(
        "--timeout",
        type=seconds_arg,
        help="kill the command after this many seconds (exit 124); default: the runtime's limit (300 s; "
        "-i/-t sessions have none, as `kubectl exec -it`)",
    )
    exe.add_argument("--env", action="append", metavar="KEY=VALUE", help="environment variable (repeatable)")
    exe.add_argument("--cwd", help="working directory, relative to the sandbox root")
    exe.add_argument(
        "-i",
        "--stdin",
        action="store_true",
        help="pass standard input to the command (sandboxd's process API)",
    )
    exe.add_argument(
        "-t",
        "--tty",
        action="store_true",
        help="run the command under a terminal (with -i: interactive, as kubectl)",
    )
    exe.set_defaults(exec_parser=exe)

    cp = add(
        "cp",
        _cp,
        "copy a file or directory to or from a sandbox (CLAIM:PATH on one side; - is stdin / stdout)",
        TEXT_ONLY,
    )
    cp.add_argument("src")
    cp.add_argument("dst")
    cp.add_argument("--timeout", type=seconds_arg, default=300, help="seconds (default 300)")

    for name, suspend in (("suspend", True), ("resume", False)):
        what = "suspend a sandbox (its pod goes, volumes stay)" if suspend else "resume a suspended sandbox"
        p = add(name, _suspend_resume(suspend), what, OBJECT_FORMATS)
        p.add_argument("claim", type=claim_arg)
        p.add_argument("--timeout", type=seconds_arg, default=120, help="seconds to wait (default 120)")
        p.add_argument("--no-wait", action="store_true", help="return once the change is requested")

    delete = add(
        "delete", _delete, "delete claimed sandboxes (the controller then deletes the sandbox)", TEXT_ONLY
    )
    delete.add_argument("claims", nargs="*", metavar="CLAIM", type=claim_arg)
    delete.add_argument("-l", "--selector", help="delete the claims with these labels (kubectl's syntax)")
    delete.add_argument("--all", action="store_true", help="delete every claim in the namespace")
    delete.add_argument("--ignore-not-found", action="store_true", help="exit 0 when a claim does not exist")

    add("pools", _pools, "warm pools with ready/desired members", OBJECT_FORMATS)

    proxy = add(
        "proxy",
        _proxy,
        "a local HTTP address for a port inside a sandbox, through the router (Ctrl-C stops)",
        TEXT_ONLY,
    )
    proxy.add_argument("claim", type=claim_arg)
    proxy.add_argument("port", type=int, help="the port inside the sandbox (a web app, a notebook)")
    proxy.add_argument(
        "--address", default="127.0.0.1", help="local address to listen on (default 127.0.0.1)"
    )
    proxy.add_argument(
        "--local-port", type=int, default=0, help="local port (default: any free one, printed)"
    )

    logs = add("logs", _logs, "the sandbox pod's log (where the cluster serves pod logs)", TEXT_ONLY)
    logs.add_argument("claim", type=claim_arg)
    logs.add_argument("-c", "--container", help="container name (default: the pod's only one)")
    logs.add_argument("--tail", type=int, help="last N lines")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing the log as it is written (until Ctrl-C)"
    )
    logs.add_argument(
        "-p", "--previous", action="store_true", help="the log of the container before its last restart"
    )
