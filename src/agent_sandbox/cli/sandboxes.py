"""`agent-sandbox create|list|get|exec|cp|suspend|resume|delete|pools|logs`: sandboxes from the command line.

Every command is a thin layer over the Python SDK (`agent_sandbox_sdk.SandboxClient`). Common options:
`-o table|json|yaml` (and `name` where it prints claims or pools), `-n/--namespace` (default: the kubeconfig
context's, as kubectl), `--kubeconfig`, `--context`, `--router-url` (default: the `--dev-cluster`'s router,
else `$AGENT_SANDBOX_ROUTER_URL`), `--dev-cluster NAME` (a local dev cluster's kubeconfig and router); all
but `-o` may also come before the command.

Exit codes: 0 success; `exec` exits with the command's own code (124 when it timed out); 1 an error from
the cluster, router or sandbox (one that cannot be reached too); 2 invalid usage or input; 3 not found (said
by the SDK, or answered 404); 4 timed out waiting.

Here the commands are registered, and `cp` and `proxy` handed to `copy` and `proxy`; the other commands are
`claim_commands`' and `exec_command`'s, the client is `connection`'s, the exit codes are `exit_codes`'.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from agent_sandbox_sdk.constants import ROUTER_URL_ENV

from .arguments import claim_arg, common_options, seconds_arg, tail_lines_arg
from .claim_commands import _create, _delete, _get, _list, _logs, _pools, _suspend_resume
from .connection import _router_headers, _router_url, make_client
from .copy import copy
from .exec_command import _exec
from .exit_codes import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_TIMEOUT, EXIT_USAGE, Handler, _guard
from .interruptible import interruptible
from .option_values import _shutdown_after_arg
from .output import FORMATS, OBJECT_FORMATS, TEXT_ONLY

__all__ = ["EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_TIMEOUT", "EXIT_USAGE", "add_sandbox_commands"]


def _cp(args: argparse.Namespace) -> int:
    return copy(make_client(args), args)


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


def add_sandbox_commands(sub: Any) -> None:
    """Register the sandbox commands on the top-level subparsers."""
    parents: dict[tuple[str, ...], argparse.ArgumentParser] = {
        f: common_options(f) for f in (FORMATS, OBJECT_FORMATS, TEXT_ONLY)
    }

    def add(
        name: str,
        handler: Handler,
        help_text: str,
        formats: tuple[str, ...] = FORMATS,
        *,
        main_thread: bool = False,
    ) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(
            name, parents=[parents[formats]], help=help_text, description=help_text
        )
        # In a worker thread, so that a signal stops it within a second (interruptible.py); `main_thread`: a
        # command that needs the main thread (asyncio, SIGWINCH) and wakes itself.
        parser.set_defaults(handler=_guard(handler if main_thread else interruptible(handler)))
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

    exe = add(  # its -i/-t sessions need the main thread: the rest runs as `interruptible` (exec_command.py)
        "exec",
        _exec,
        "run a command in a sandbox, streaming its output; exits with its exit code",
        main_thread=True,
    )
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

    pools = add("pools", _pools, "warm pools with ready/desired members", OBJECT_FORMATS)
    pools.add_argument(
        "-A", "--all-namespaces", action="store_true", help="pools of every namespace (a NAMESPACE column)"
    )

    proxy = add(
        "proxy",
        _proxy,
        "a local HTTP address for a port inside a sandbox, through the router (Ctrl-C stops)",
        TEXT_ONLY,
        main_thread=True,  # an asyncio loop that wakes every second (proxy.py)
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
    logs.add_argument(
        "--tail", type=tail_lines_arg, help="last N lines (a negative N: all of them, as kubectl's -1)"
    )
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing the log as it is written (until Ctrl-C)"
    )
    logs.add_argument(
        "-p", "--previous", action="store_true", help="the log of the container before its last restart"
    )
