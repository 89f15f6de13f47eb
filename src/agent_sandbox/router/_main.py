"""`agent-sandbox-router`: parse the configuration, run the router until SIGTERM/SIGINT, drain, exit.

Exit codes (router spec §1.12): 0 clean stop, `--version` or `-h`; 2 invalid configuration (flags,
environment, config file, settings); 1 runtime errors (a listener cannot bind, the Pod cache does not
sync, TLS files unreadable, no Kubernetes configuration, a stop still running a second past
`--shutdown-timeout`).

The process is gone by `--shutdown-timeout` after SIGTERM: at the default 30 s that is the kubelet's default
termination grace period, past which it is SIGKILLed (and its last log lines with it). `Router.shutdown`
keeps a reserve of that time for its own stop; the console script then leaves without the interpreter's
teardown (0.5-1.5 s of garbage collection and module clean-up on a loaded node, for a process about to
vanish anyway), and a watchdog ends a stop that hangs regardless.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from ..api.errortext import describe_error
from ..interrupts import STOP_SIGNALS, exit_now, handle_stop_signals
from ..kube import ConfigError as KubeConfigError
from ..kube import TracingError
from ..kube._stopreport import thread_stacks
from ..kube.buildinfo import version_text
from ..kube.flags import HelpRequested, configure_logging_from_flags
from ._app import Router, StartupError, stop_reserve
from ._config import PROGRAM, ConfigError, RouterConfig, flag_set, load_router_config
from ._fdlimit import raise_open_files_limit
from ._workers import WORKER_ENV, Supervisor, merged_registry, worker_metrics_loop

__all__ = ["main", "run"]

log = logging.getLogger("agent_sandbox.router")

WATCHDOG_SLACK = 1.0
"""Seconds past `--shutdown-timeout` a stop may still run (in the console script) before the process ends
itself: the normal stop is done well before the timeout, so only a hang gets here."""
WATCHDOG_LOG_GRACE = 0.5
"""Seconds the watchdog's stack log and flush may take before the process exits without them (a stop hung
inside a log write holds the handler's lock: the watchdog's own log line would wait for it too)."""


async def run(config: RouterConfig, argv: Sequence[str] = (), *, watchdog: bool = False) -> int:
    """Start the router, serve until the first SIGTERM/SIGINT, drain; returns the exit status.

    With `--workers N` this process supervises N-1 workers started with `argv` plus overrides; in a
    worker (`WORKER_ENV` set) it publishes its metrics for the supervisor instead of serving them.
    `watchdog` (the console script): a stop still running `WATCHDOG_SLACK` seconds past
    `--shutdown-timeout` logs every thread's stack and exits the process (status 1).
    """
    stop = asyncio.Event()
    worker_file = os.environ.get(WORKER_ENV)
    supervisor = Supervisor(config.workers, argv) if config.workers > 1 and not worker_file else None

    def first(name: str) -> None:
        log.info("received %s, draining (a second signal exits at once)", name)
        stop.set()
        if watchdog:
            timer = threading.Timer(config.shutdown_timeout + WATCHDOG_SLACK, _overdue, (config, supervisor))
            timer.daemon = True
            timer.name = "stop-watchdog"
            timer.start()

    def again(name: str) -> None:
        log.warning("received %s again: exiting now", name)
        _abandon_workers(supervisor)  # no orphans: nothing would stop them now

    signals = list(STOP_SIGNALS)
    if worker_file:
        # Ctrl-C in a terminal sends SIGINT to the whole process group: the supervisor relays the stop as
        # SIGTERM, which a worker that took the SIGINT as well would have taken as a second signal (exit
        # at once, no drain).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signals.remove(signal.SIGINT)
    handle_stop_signals(first, again, signals=signals)
    try:
        return await _serve(config, stop, supervisor, worker_file)
    finally:
        if supervisor is not None:
            supervisor.remove_directory()  # the stop removed it; a failed or cancelled start had not


async def _serve(
    config: RouterConfig, stop: asyncio.Event, supervisor: Supervisor | None, worker_file: str | None
) -> int:
    loop = asyncio.get_running_loop()
    router = Router(
        config,
        reuse_port=bool(worker_file),
        metrics_view=(lambda own: merged_registry(own, supervisor)) if supervisor else None,
        extra_ready=supervisor.ready if supervisor else None,
    )
    # A signal while starting (the Pod cache's initial sync can take up to a minute) stops the start: until
    # December 6 it was noticed only after, past a Pod's termination grace period.
    starting = asyncio.ensure_future(router.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()  # start() releases what it had set up
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        log.info("router stopped before it was ready")
        return 0
    stopping.cancel()
    try:
        starting.result()
    except (StartupError, KubeConfigError, TracingError, OSError) as exc:
        log.error("router failed to start", extra={"error": describe_error(exc)})
        print(f"{PROGRAM}: {exc}", file=sys.stderr)
        return 1
    publisher = None
    if worker_file:
        publisher = loop.create_task(worker_metrics_loop(router.metrics.registry, Path(worker_file), stop))
    if supervisor is not None:
        supervisor.start(
            http_address=_bound(config.http_bind_address, router.http_port),
            https_address=_bound(config.https_bind_address, router.https_port),
        )
    await stop.wait()
    if supervisor is not None:
        # The workers got the same timeout and keep the same reserve, so they are gone before half of the
        # reserve is left; one still running then is killed, so the supervisor too is gone by the timeout.
        grace = config.shutdown_timeout - stop_reserve(config.shutdown_timeout) / 2
        await asyncio.gather(router.shutdown(), supervisor.stop(grace))
    else:
        await router.shutdown()
    if publisher is not None:
        await publisher
    log.info("router stopped")
    return 0


def _abandon_workers(supervisor: Supervisor | None) -> None:
    """Before an exit without the stop: kill the workers and remove their metrics directory."""
    if supervisor is None:
        return
    for pid in supervisor.pids():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    supervisor.remove_directory()


def _overdue(config: RouterConfig, supervisor: Supervisor | None) -> None:
    """The watchdog (a timer thread, so it fires even if the event loop is blocked): take the workers along,
    say where the stop hangs, exit."""
    # The exit must not depend on the log: a stop hung inside a log write holds the handler's lock, and the
    # line below would wait for it as well. A bare timer ends the process if the log does not let go.
    backstop = threading.Timer(WATCHDOG_LOG_GRACE, os._exit, (1,))
    backstop.daemon = True
    backstop.name = "stop-watchdog-backstop"
    backstop.start()
    _abandon_workers(supervisor)
    log.error(
        "stop still running %.0f s after the signal (--shutdown-timeout %gs): exiting now; thread stacks follow",
        config.shutdown_timeout + WATCHDOG_SLACK,
        config.shutdown_timeout,
        extra={"stacks": thread_stacks()},
    )
    exit_now(1)


def _bound(address: str, port: int | None) -> str | None:
    """The bind address with the port actually bound (":0" -> ":<port>"); None if the listener is off."""
    if not address or port is None:
        return None
    return f"{address.rpartition(':')[0]}:{port}"


def _run_loop(config: RouterConfig, argv: Sequence[str], *, watchdog: bool = False) -> int:
    # uvloop when installed (the `fast` extra); AGENT_SANDBOX_EVENT_LOOP=asyncio forces the stdlib loop
    # (benchmarks compare both, docs/design/router-performance.md).
    if importlib.util.find_spec("uvloop") is None or os.environ.get("AGENT_SANDBOX_EVENT_LOOP") == "asyncio":
        return asyncio.run(run(config, argv, watchdog=watchdog))
    import uvloop

    code: int = uvloop.run(run(config, argv, watchdog=watchdog))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns (and, as a script, exits with) the process status."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        config, rest = load_router_config(args)
    except HelpRequested:
        print(flag_set().usage(), file=sys.stderr)
        return _exit(0, argv)
    except ConfigError as exc:
        print(f"{PROGRAM}: invalid configuration: {exc}", file=sys.stderr)
        return _exit(2, argv)
    if config.version:
        print(version_text(PROGRAM))
        return _exit(0, argv)
    configure_logging_from_flags(config)
    if rest:
        log.warning("ignoring positional arguments: %s", " ".join(rest))
    # Every proxied connection takes two descriptors: the usual soft limit of 1,024 is ~500 connections.
    # Go's runtime raises the soft limit to the hard one at start (1.19+), so upstream's router runs so too.
    raise_open_files_limit()
    if argv is None:  # the console script: bounded stop, no interpreter teardown
        exit_now(_run_loop(config, args, watchdog=True))
    return _run_loop(config, args)


def _exit(code: int, argv: Sequence[str] | None) -> int:
    if argv is None:
        sys.exit(code)
    return code
