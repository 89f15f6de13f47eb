"""`agent-sandbox-router`: parse the configuration, run the router until SIGTERM/SIGINT, drain, exit.

Exit codes (router spec §1.12): 0 clean stop, `--version` or `-h`; 2 invalid configuration (flags,
environment, config file, settings); 1 runtime errors (a listener cannot bind, the Pod cache does not
sync, TLS files unreadable, no Kubernetes configuration).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from ..api.errortext import describe_error
from ..kube import ConfigError as KubeConfigError
from ..kube import TracingError
from ..kube.buildinfo import version_text
from ..kube.flags import HelpRequested, configure_logging_from_flags
from ._app import Router, StartupError
from ._config import PROGRAM, ConfigError, RouterConfig, flag_set, load_router_config
from ._fdlimit import raise_open_files_limit
from ._workers import WORKER_ENV, Supervisor, merged_registry, worker_metrics_loop

__all__ = ["main", "run"]

log = logging.getLogger("agent_sandbox.router")


async def run(config: RouterConfig, argv: Sequence[str] = ()) -> int:
    """Start the router, serve until the first SIGTERM/SIGINT, drain; returns the exit status.

    With `--workers N` this process supervises N-1 workers started with `argv` plus overrides; in a
    worker (`WORKER_ENV` set) it publishes its metrics for the supervisor instead of serving them.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            os._exit(1)  # a second signal: stop now (as Go's signal handler)
        log.info("received %s, draining", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal, sig)
    worker_file = os.environ.get(WORKER_ENV)
    supervisor = Supervisor(config.workers, argv) if config.workers > 1 and not worker_file else None
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
        await asyncio.gather(router.shutdown(), supervisor.stop(config.shutdown_timeout + 5))
    else:
        await router.shutdown()
    if publisher is not None:
        await publisher
    log.info("router stopped")
    return 0


def _bound(address: str, port: int | None) -> str | None:
    """The bind address with the port actually bound (":0" -> ":<port>"); None if the listener is off."""
    if not address or port is None:
        return None
    return f"{address.rpartition(':')[0]}:{port}"


def _run_loop(config: RouterConfig, argv: Sequence[str]) -> int:
    # uvloop when installed (the `fast` extra); AGENT_SANDBOX_EVENT_LOOP=asyncio forces the stdlib loop
    # (benchmarks compare both, docs/design/router-performance.md).
    if importlib.util.find_spec("uvloop") is None or os.environ.get("AGENT_SANDBOX_EVENT_LOOP") == "asyncio":
        return asyncio.run(run(config, argv))
    import uvloop

    code: int = uvloop.run(run(config, argv))
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
    return _exit(_run_loop(config, args), argv)


def _exit(code: int, argv: Sequence[str] | None) -> int:
    if argv is None:
        sys.exit(code)
    return code
