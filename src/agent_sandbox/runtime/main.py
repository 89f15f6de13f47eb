"""`agent-sandbox-runtime`: serve one sandbox until SIGTERM/SIGINT, then drain (spec §2.2)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from importlib import metadata

from ..api.errortext import describe_error
from .config import RuntimeConfig, parse_args
from .server import RuntimeServer

__all__ = ["LOG_FORMAT", "main", "serve"]

log = logging.getLogger("agent_sandbox.runtime")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


async def serve(config: RuntimeConfig) -> None:
    """Run one server until SIGTERM or SIGINT, then stop it within the shutdown timeout."""
    server = RuntimeServer(config)
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
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
