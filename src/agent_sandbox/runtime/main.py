"""`agent-sandbox-runtime`: serve one sandbox until SIGTERM/SIGINT, then drain (spec §2.2)."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from importlib import metadata

from ..api.errortext import describe_error
from ..interrupts import handle_stop_signals
from .config import RuntimeConfig, parse_args
from .server import RuntimeServer

__all__ = ["LOG_FORMAT", "main", "serve"]

log = logging.getLogger("agent_sandbox.runtime")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


async def serve(config: RuntimeConfig) -> None:
    """Run one server until SIGTERM or SIGINT, then stop it within the shutdown timeout.

    A second signal while it drains exits at once, status 1 (as the router, Go's signal handling and
    controller-runtime do): every command's process group is SIGKILLed first, so none is left behind.
    """
    server = RuntimeServer(config)
    await server.start()
    stop = asyncio.Event()

    def first(name: str) -> None:
        log.info("received %s, draining (a second signal exits at once)", name)
        stop.set()

    def again(name: str) -> None:
        log.warning("received %s again: killing every command and exiting now", name)
        server.kill_children()

    handle_stop_signals(first, again)
    await stop.wait()
    await server.stop()


def _version() -> str:
    try:
        return metadata.version("agent-sandbox")
    except metadata.PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    config, ns = parse_args(sys.argv[1:] if argv is None else argv)
    if ns.version:
        print(f"agent-sandbox-runtime {_version()}")
        return 0
    logging.basicConfig(level=ns.log_level.upper(), format=LOG_FORMAT)
    try:
        asyncio.run(serve(config))
    except OSError as err:
        log.error("cannot serve: %s", describe_error(err))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
