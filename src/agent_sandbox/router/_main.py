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

from ..kube import ConfigError as KubeConfigError
from ..kube import TracingError, configure_logging
from ..kube.buildinfo import version_text
from ..kube.flags import HelpRequested
from ._app import Router, StartupError
from ._config import PROGRAM, ConfigError, RouterConfig, flag_set, load_router_config

__all__ = ["main", "run"]

log = logging.getLogger("agent_sandbox.router")


async def run(config: RouterConfig) -> int:
    """Start the router, serve until the first SIGTERM/SIGINT, drain; returns the exit status."""
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
    router = Router(config)
    try:
        await router.start()
    except (StartupError, KubeConfigError, TracingError, OSError) as exc:
        log.error("router failed to start", extra={"error": str(exc)})
        print(f"{PROGRAM}: {exc}", file=sys.stderr)
        return 1
    await stop.wait()
    await router.shutdown()
    log.info("router stopped")
    return 0


def _run_loop(config: RouterConfig) -> int:
    if importlib.util.find_spec("uvloop") is None:
        return asyncio.run(run(config))
    import uvloop

    code: int = uvloop.run(run(config))
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
    configure_logging(
        devel=config.zap_devel,
        encoder=config.zap_encoder or None,
        level=config.zap_log_level or None,
        stacktrace_level=config.zap_stacktrace_level or None,
        time_encoding=config.zap_time_encoding or None,
    )
    if rest:
        log.warning("ignoring positional arguments: %s", " ".join(rest))
    return _exit(_run_loop(config), argv)


def _exit(code: int, argv: Sequence[str] | None) -> int:
    if argv is None:
        sys.exit(code)
    return code
