"""`agent-sandbox-controller`: the controller process (controllers spec §5, operations spec §7).

Start-up sequence (§5.3): parse flags -> `--version` -> logging -> validation (exit 1 naming the flag)
-> tracing (10 s) -> API client (QPS/burst, connection sharding, watch connection) -> manager (metrics,
probes, leader election, cache options) -> build info metric -> controllers and runnables
(`setup_controllers`) -> run until SIGTERM/SIGINT, then drain and release the Lease; exit 0.

Adding a controller or runnable is one entry in `SETUPS`: a name, a `setup(mgr, ctx)` function (every
kind package has one; `context.ControllerContext` is what it receives) that wires it with
`Builder(mgr)...complete(...)` / `mgr.add(...)`, and a predicate on the options saying when it is
enabled. The Sandbox controller comes first: it scopes the Pod and Service caches, which must happen
before anything creates those informers.

Exit codes: 0 clean stop or `--version`/`-h`; 2 malformed command line (Go's flag package); 1 validation
failure, configuration error, lost leadership, or a runtime failure.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys
from collections.abc import Sequence

from .. import __version__, glibc_malloc, python_gc
from ..api.errortext import describe_error
from ..interrupts import handle_stop_signals
from ..kube import (
    EXPECTED_ERRORS,
    ApiClient,
    ConfigError,
    LeaderElectionLost,
    Manager,
    ManagerOptions,
    TracingError,
    load_config,
    setup_tracing,
)
from ..kube.flags import FlagError, HelpRequested, configure_logging_from_flags
from . import claim, lifecycle, sandbox, template, warmpool, webhook
from .claim_pressure import ClaimPressure, ClaimPressureCollector
from .context import ControllerContext, Setup
from .options import PROGRAM, Options, flag_set, parse_options, read_allowed_label_domains, validate
from .version import register_build_info, version_text

__all__ = [
    "LEADER_ELECTION_ID",
    "SETUPS",
    "START_UP_ERRORS",
    "ControllerContext",
    "Setup",
    "build_manager",
    "main",
    "run",
]

log = logging.getLogger("agent_sandbox.controllers.main")

LEADER_ELECTION_ID = "a3317529.agent-sandbox.x-k8s.io"

START_UP_ERRORS: tuple[type[BaseException], ...] = (
    *EXPECTED_ERRORS,  # API errors, connection errors, timeouts (e.g. caches that never sync)
    OSError,  # a listener's port in use, an unresolvable host, an unreadable file
    ConfigError,
    TracingError,
    webhook.WebhookError,
    webhook.CertificateError,
)
"""Failures of the manager logged without a traceback: their message names the problem. Any other exception
is a programming error and keeps its traceback."""


SETUPS: list[Setup] = [
    # Conversion webhook: every replica (no leader election), behind --enable-webhook (§5.7).
    Setup("webhook", webhook.setup, lambda o: o.enable_webhook),
    # Sandbox controller, always on:
    Setup("sandbox", sandbox.setup),
    # With --extensions:
    Setup("sandboxwarmpool", warmpool.setup, lambda o: o.extensions),
    Setup("sandboxclaim", claim.setup, lambda o: o.extensions),
    Setup("sandboxtemplate", template.setup, lambda o: o.extensions),
    # Ours (docs/lifecycle.md), with --sandbox-lifecycle:
    Setup("sandboxlifecycle", lifecycle.setup, lambda o: o.sandbox_lifecycle),
]
"""Ordered controller/runnable registry; see the module docstring."""


def setup_controllers(mgr: Manager, ctx: ControllerContext, setups: Sequence[Setup] | None = None) -> None:
    """Run every enabled setup in order."""
    for entry in SETUPS if setups is None else setups:
        if entry.enabled(ctx.options):
            log.info("setting up %s", entry.name)
            entry.setup(mgr, ctx)


def manager_options(opts: Options, pressure: ClaimPressure | None = None) -> ManagerOptions:
    """Map process flags to manager options.

    The Pod/Service cache scoping of §5.5 is the Sandbox controller's (`sandbox.setup`). With claim
    pressure, Events wait behind arriving claims, bounded by the hold, and a graceful stop sends the held
    Events and first-ready stamps before it releases the Lease. The pressure is a held write even with the
    hold off: the claim controller sends its first-ready stamps from background tasks either way.
    """
    return ManagerOptions(
        metrics_bind_address=opts.metrics_bind_address,
        health_probe_bind_address=opts.health_probe_bind_address,
        leader_election=opts.leader_elect,
        leader_election_id=LEADER_ELECTION_ID,
        leader_election_namespace=opts.leader_election_namespace,
        enable_pprof=opts.pprof_enabled,
        enable_pprof_debug=opts.enable_pprof_debug,
        event_hold=pressure.hold_event if pressure is not None and pressure.enabled else None,
        held_writes=(pressure,) if pressure is not None else (),
    )


def build_manager(opts: Options, pressure: ClaimPressure | None = None) -> Manager:
    """API client + manager from the options.

    Raises:
        ConfigError: no usable kubeconfig.
        ValueError: leader election cannot be configured (e.g. no namespace outside a cluster).
    """
    api = ApiClient(
        load_config(opts.kubeconfig or None),
        qps=opts.kube_api_qps,
        burst=opts.kube_api_burst,
        connections=opts.api_connections,
        separate_watch_connection=opts.separate_watch_connection,
        user_agent=f"{PROGRAM}/{__version__}",
    )
    return Manager(api, manager_options(opts, pressure))


async def run(
    opts: Options, *, setups: Sequence[Setup] | None = None, stop: asyncio.Event | None = None
) -> int:
    """Run the controller process until `stop` (default: SIGTERM/SIGINT). Returns the exit code."""
    try:
        # Building the provider does no network I/O; the exporter's own 10 s timeout bounds its calls.
        tracing = setup_tracing(opts.enable_tracing, timeout=10.0)
    except TracingError as exc:
        log.error("unable to initialise tracing: %s", describe_error(exc))
        return 1
    allowed: tuple[str, ...] = ()
    if opts.extensions:
        try:
            allowed = tuple(read_allowed_label_domains())
        except OSError as exc:
            log.error("unable to read allowed label domains: %s", describe_error(exc))
            return 1
    pressure = ClaimPressure(opts.sandbox_claim_priority_hold if opts.extensions else 0.0)
    try:
        mgr = build_manager(opts, pressure)
    except (ConfigError, ValueError, OSError) as exc:
        # One line naming what is wrong (a missing certificate file, a bad flag), exit 1: not a traceback.
        log.error("unable to start manager: %s", describe_error(exc))
        return 1
    stop = stop or _signal_stop()
    try:
        register_build_info()
        if pressure.enabled:
            mgr.options.registry.register(ClaimPressureCollector(pressure))
        if python_gc.tuned():
            mgr.add(python_gc.FullCollections(wait_calm=pressure.wait_calm))
        setup_controllers(mgr, ControllerContext(opts, tracing, allowed, pressure), setups)
        log.info("starting manager")
        await mgr.start(stop)
    except LeaderElectionLost as exc:
        log.error("%s", describe_error(exc))
        return 1
    except START_UP_ERRORS as exc:
        # A known configuration or environment problem (a port in use, a missing certificate, an API error at
        # start-up): the message says it all, as upstream's one-line "problem running manager".
        log.error("problem running manager: %s", describe_error(exc))
        return 1
    except ExceptionGroup as group:
        # Several runnables failed in the same pass (both listeners' ports taken by a second instance): one line
        # naming each when all are known problems; a bug among them keeps the group's traceback.
        known, bugs = group.split(lambda exc: isinstance(exc, START_UP_ERRORS))
        if known is not None and bugs is None:
            log.error("problem running manager: %s", "; ".join(describe_error(e) for e in _leaves(known)))
        else:
            log.error("problem running manager: %s", describe_error(group), exc_info=group)
        return 1
    except Exception as exc:
        log.error("problem running manager: %s", describe_error(exc), exc_info=exc)  # a bug: keep the stack
        return 1
    finally:
        await mgr.api.close()
        tracing.shutdown()
    return 0


def _signal_stop() -> asyncio.Event:
    """An event set by the first SIGTERM/SIGINT; a second signal exits at once (controller-runtime)."""
    stop = asyncio.Event()

    def first(name: str) -> None:
        log.info("received %s, shutting down (a second signal exits at once)", name)
        stop.set()

    def again(name: str) -> None:
        log.warning("received %s again: exiting now", name)

    handle_stop_signals(first, again)
    return stop


def _run_loop(opts: Options) -> int:
    # Probe with find_spec rather than try/except ImportError: running the loop inside the `except`
    # would chain that ImportError onto every later traceback in the controller log.
    if importlib.util.find_spec("uvloop") is None:
        return asyncio.run(run(opts))
    import uvloop  # type: ignore[import-not-found,unused-ignore]

    code: int = uvloop.run(run(opts))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns (and exits with) the process status."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        opts, rest = parse_options(args)
    except HelpRequested:
        print(flag_set().usage(), file=sys.stderr)
        return _exit(0, argv)
    except FlagError as exc:
        print(f"{exc}\n{flag_set().usage()}", file=sys.stderr)
        return _exit(2, argv)
    if opts.version:
        print(version_text(PROGRAM))
        return _exit(0, argv)
    configure_logging_from_flags(opts)
    if tuned := glibc_malloc.tune():
        log.info("glibc malloc thresholds fixed: %s", tuned)
    if python_gc.tune():
        log.info("full garbage collections every %.0f s", python_gc.FULL_COLLECTION_INTERVAL)
    if rest:
        log.warning("ignoring positional arguments: %s", " ".join(rest))
    errors, warnings = validate(opts)
    for warning in warnings:
        log.warning("%s", warning)
    if errors:
        for error in errors:
            log.error("invalid flag: %s", error)
            print(f"{PROGRAM}: invalid flag: {error}", file=sys.stderr)
        return _exit(1, argv)
    return _exit(_run_loop(opts), argv)


def _exit(code: int, argv: Sequence[str] | None) -> int:
    # Called as a console script (argv None) we exit; called from tests we return the code.
    if argv is None:
        sys.exit(code)
    return code


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    return [
        leaf
        for exc in group.exceptions
        for leaf in (_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    ]


if __name__ == "__main__":
    main()
