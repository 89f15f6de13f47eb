"""`agent-sandbox` command line: dev cluster, code generation, demo, benchmarks.

Owns: argument parsing and turning errors into one clear message + non-zero exit. The work lives in the
packages it calls (devcluster, api, ...). argparse (stdlib) is enough for this surface: no extra dependency.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent_sandbox.invocation import cli_command

# The SDK, the API models and aiohttp take about half a second to load, before `main` can handle Ctrl-C: one
# then exits 130 as it does later, not with a KeyboardInterrupt traceback from an import (until December 7).
try:
    from agent_sandbox.api.errortext import describe_error
    from agent_sandbox.cli.arguments import CONNECTION_OPTIONS, add_connection_options
    from agent_sandbox.cli.lifecycle import add_lifecycle_commands
    from agent_sandbox.cli.output import StdoutClosedError, open_missing_streams
    from agent_sandbox.cli.release import release_command
    from agent_sandbox.cli.sandboxes import add_sandbox_commands
    from agent_sandbox.devcluster import (
        BuildError,
        ClusterConfig,
        ClusterError,
        ComponentError,
        DevCluster,
    )
    from agent_sandbox.interrupts import raise_where_safe
except KeyboardInterrupt:
    raise SystemExit(130) from None

Handler = Callable[[argparse.Namespace], int]
_DEFAULTS = ClusterConfig()


def _dev_up(args: argparse.Namespace) -> int:
    cfg = ClusterConfig(
        name=args.name,
        nodes=args.nodes,
        max_requests_inflight=args.max_requests_inflight,
        max_mutating_requests_inflight=args.max_mutating_requests_inflight,
        etcd_unsafe_no_fsync=not args.etcd_fsync,
        scheduler_qps=args.scheduler_qps,
        scheduler_burst=args.scheduler_burst,
        runner=not args.no_runner,
    )
    cluster = DevCluster.up(cfg)
    lifecycle = ("--sandbox-lifecycle",) if args.lifecycle else ()
    if args.controller:
        from agent_sandbox.devcluster.controller import start_controller

        started = start_controller(cluster, extensions=True, extra=lifecycle)
        print(f"controller running (pid {started.pid}), log: {started.log}", file=sys.stderr)
    if args.router:
        from agent_sandbox.devcluster.router import DEV_ROUTER_FLAGS, router_url, start_router

        routed = start_router(cluster, extra=(*DEV_ROUTER_FLAGS, *lifecycle))
        print(f"router at {router_url(cluster)} (pid {routed.pid}), log: {routed.log}", file=sys.stderr)
        _expose_router(cluster)
    print(cluster.describe(), file=sys.stderr)
    print(f"\nuse it:  KUBECONFIG={cluster.kubeconfig} kubectl get nodes", file=sys.stderr)
    from agent_sandbox.devcluster.cluster import down_command

    print(f"stop it: {down_command(cluster.name)}", file=sys.stderr)
    return 0


def _expose_router(cluster: DevCluster) -> None:
    """Also behind `sandbox-router-svc`, for clients that port-forward to the router (upstream's default)."""
    from agent_sandbox.devcluster.router_service import expose_router_report

    exposed, line = expose_router_report(cluster)
    print(line if exposed else f"warning: {line}", file=sys.stderr)


def _dev_down(args: argparse.Namespace) -> int:
    targets = DevCluster.list() if args.all else [c for c in [DevCluster.load(args.name)] if c]
    if not targets:
        print(f"no dev cluster named {args.name!r}", file=sys.stderr)
        return 0
    for cluster in targets:
        cluster.down()
        print(f"cluster {cluster.name!r} stopped and removed", file=sys.stderr)
    return 0


def _dev_kubeconfig(args: argparse.Namespace) -> int:
    cluster = DevCluster.load(args.name)
    if cluster is None:
        raise ClusterError(f"no dev cluster named {args.name!r}; start one with `{cli_command('dev up')}`")
    print(cluster.kubeconfig)
    return 0


def _dev_router_url(args: argparse.Namespace) -> int:
    from agent_sandbox.devcluster.router import router_url

    cluster = DevCluster.load(args.name)
    if cluster is None:
        raise ClusterError(
            f"no dev cluster named {args.name!r}; start one with `{cli_command('dev up --router')}`"
        )
    url = router_url(cluster)
    if url is None:
        raise ClusterError(
            f"dev cluster {args.name!r} runs no router; start one with `{cli_command('dev up --router')}`"
        )
    print(url)
    return 0


def _dev_status(args: argparse.Namespace) -> int:
    if args.name is not None:
        one = DevCluster.load(args.name)
        if one is None:
            raise ClusterError(
                f"no dev cluster named {args.name!r}; start one with `{cli_command('dev up')}`"
            )
        clusters = [one]
    else:
        clusters = DevCluster.list()
    if not clusters:
        print("no dev clusters")
    for cluster in clusters:
        print(cluster.describe())
        for name, rss in cluster.memory().items():
            print(f"    {name:<24} rss {rss / 2**20:7.1f} MiB")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from agent_sandbox.manifests.generated import main as generate_main

    return generate_main(["--check"] if args.check else [])


def _demo(args: argparse.Namespace) -> int:
    from agent_sandbox.cli.demo import run_demo

    return run_demo(name=args.name)


def find_checkout(start: Path) -> Path | None:
    """The agent-sandbox source checkout containing `start` (it has `benchmarks/` and `pyproject.toml`)."""
    for directory in (start, *start.parents):
        if (directory / "benchmarks" / "__main__.py").is_file() and (directory / "pyproject.toml").is_file():
            return directory
    return None


def _bench(args: argparse.Namespace) -> int:
    """Become `python -m benchmarks ARGS` in the source checkout around the current directory.

    The benchmarks are not part of the installed package (they write results and docs into the checkout),
    so the CLI neither imports them nor puts the checkout on its own `sys.path`: outside a checkout it
    says so and exits 2. `exec` (not a child process) keeps Ctrl-C handling, and so the benchmark's
    cluster teardown, exactly as when run directly.
    """
    root = find_checkout(Path.cwd())
    if root is None:
        print(
            "error: the benchmarks live in the agent-sandbox source checkout, not in the installed package: "
            f"run `{cli_command('bench ...')}` (or `python -m benchmarks ...`) from inside a checkout",
            file=sys.stderr,
        )
        return 2
    os.chdir(root)
    os.execv(sys.executable, [sys.executable, "-m", "benchmarks", *args.bench_args])


class _Parser(argparse.ArgumentParser):
    """No abbreviations, in every command's parser too (subparsers are made of the parser's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    # No abbreviations (as kubectl): argparse matches a prefix against the top-level options across the
    # whole command line, so `dev up --router` became ambiguous between --router-url and
    # --router-token-file (until December 6, with the second one added).
    parser = _Parser(prog="agent-sandbox", description=__doc__.splitlines()[0])
    add_connection_options(parser, before_the_command=True)
    sub = parser.add_subparsers(dest="command", required=True)

    dev = sub.add_parser(
        "dev", help="local control plane (etcd, apiserver, controller-manager, scheduler, kwok)"
    )
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)

    up = dev_sub.add_parser("up", help="build (once, cached) and start a local cluster")
    up.add_argument("--name", default="default")
    up.add_argument("--nodes", type=int, default=1, help="number of kwok nodes (default 1)")
    up.add_argument("--controller", action="store_true", help="install CRDs and run agent-sandbox-controller")
    up.add_argument(
        "--router", action="store_true", help="run agent-sandbox-router (Pod cache on) on a loopback port"
    )
    up.add_argument(
        "--lifecycle",
        action="store_true",
        help="with --controller/--router: idle suspend, hibernation, resume on request (docs/lifecycle.md)",
    )
    up.add_argument(
        "--no-runner",
        action="store_true",
        help="leave the local runner out (pods with a runtime image then stay not Ready)",
    )
    up.add_argument("--max-requests-inflight", type=int, default=_DEFAULTS.max_requests_inflight)
    up.add_argument(
        "--max-mutating-requests-inflight", type=int, default=_DEFAULTS.max_mutating_requests_inflight
    )
    up.add_argument(
        "--etcd-fsync", action="store_true", help="keep etcd fsync on (default: --unsafe-no-fsync)"
    )
    up.add_argument("--scheduler-qps", type=float, default=_DEFAULTS.scheduler_qps)
    up.add_argument("--scheduler-burst", type=int, default=_DEFAULTS.scheduler_burst)
    up.set_defaults(handler=_dev_up)

    down = dev_sub.add_parser("down", help="stop a cluster's processes and remove its data")
    down.add_argument("--name", default="default")
    down.add_argument("--all", action="store_true", help="every recorded dev cluster")
    down.set_defaults(handler=_dev_down)

    kc = dev_sub.add_parser("kubeconfig", help="print the admin kubeconfig path")
    kc.add_argument("--name", default="default")
    kc.set_defaults(handler=_dev_kubeconfig)

    router_url = dev_sub.add_parser("router-url", help="print the URL of the cluster's router")
    router_url.add_argument("--name", default="default")
    router_url.set_defaults(handler=_dev_router_url)

    status = dev_sub.add_parser("status", help="list dev clusters, their processes and memory")
    status.add_argument("--name", help="only this cluster (default: every recorded one)")
    status.set_defaults(handler=_dev_status)

    gen = sub.add_parser(
        "generate", help="regenerate the CRDs and the controller RBAC in k8s/ and helm/ from their sources"
    )
    gen.add_argument("--check", action="store_true", help="fail if the checked-in files differ")
    gen.set_defaults(handler=_generate)

    rel = sub.add_parser("release", help="render the release assets (sandbox.yaml, extensions.yaml, ...)")
    rel.add_argument("--tag", default="", help="release tag, e.g. v0.1.0 (the image tag)")
    rel.add_argument("--registry", default="registry.k8s.io/agent-sandbox", help="image registry prefix")
    rel.add_argument("--out", default="release_assets", help="output directory (default release_assets/)")
    rel.add_argument("--check", action="store_true", help="only the kustomization drift guard")
    rel.set_defaults(handler=release_command)

    demo = sub.add_parser("demo", help="the README journey on a local cluster")
    demo.add_argument("--name", default="demo")
    demo.set_defaults(handler=_demo)

    bench = sub.add_parser(
        "bench",
        help="performance scenarios on a local cluster (burst, sustained, refill, cold, scale, all, report)",
        add_help=False,
    )
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(handler=_bench)

    add_sandbox_commands(
        sub
    )  # create, list, get, exec, cp, suspend, resume, delete, pools (cli/sandboxes.py)
    add_lifecycle_commands(sub)  # lifecycle resume|suspend|hibernate SANDBOX (cli/lifecycle.py)
    return parser


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C's KeyboardInterrupt would be, so that the same cleanup runs: a
    `create` deletes the auto-named claim it made, `exec -t` restores the terminal. Until December 6 SIGTERM
    (`timeout`, CI runners, systemd) killed the CLI mid-create and left a running sandbox behind whose name
    was never printed, and SIGHUP (a closed terminal window, a dropped SSH session) left the terminal raw."""

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum


def _raise_terminated(signum: int, frame: object) -> None:
    raise_where_safe(_Terminated(signum))


#: Signals that stop the CLI as Ctrl-C does.
_STOPPING = (signal.SIGTERM, signal.SIGHUP)


def main(argv: Sequence[str] | None = None) -> int:
    open_missing_streams()  # `>&-`, `2>&-`: no None sys.stdout / sys.stderr for anything to meet
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        # An ignored signal stays ignored: `nohup agent-sandbox ...` must survive a hangup.
        previous = {
            sig: signal.signal(sig, _raise_terminated)
            for sig in _STOPPING
            if signal.getsignal(sig) is not signal.SIG_IGN
        }
    try:
        return _main(argv)
    except KeyboardInterrupt as interrupt:
        # 128 + the signal, as a shell reports it
        return 128 + interrupt.signum if isinstance(interrupt, _Terminated) else 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "bench":  # options belong to the benchmarks' own parser (benchmarks/cli.py)
        args.bench_args = [*unknown, *args.bench_args]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "connection_options", False):
        given = [flag for flag, dest in CONNECTION_OPTIONS if getattr(args, dest, None) is not None]
        if given:
            parser.error(
                f"{given[0]} applies to the sandbox commands (list, exec, ...), not to {args.command}"
            )
    handler: Handler = args.handler
    try:
        return handler(args)
    except (BuildError, ComponentError, ClusterError, FileNotFoundError, RuntimeError) as err:
        print(f"error: {describe_error(err)}", file=sys.stderr)
        return 1
    except StdoutClosedError as err:  # `dev kubeconfig >&-` (the sandbox commands' guard says it too)
        print(f"error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader of our output went away (`... | head`): stop quietly, as other command-line tools do,
        # and keep Python's shutdown from writing a traceback about the unflushable stdout.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a program killed by it


if __name__ == "__main__":
    sys.exit(main())
