"""agent_sandbox.runtime: the server inside a sandbox (legacy :8888, sandboxd REST :8080 and gRPC :9090).

`RuntimeServer(RuntimeConfig(...))` serves one sandbox on one event loop; `agent-sandbox-runtime` runs one
from the command line; the dev cluster's local runner runs many in one process. See docs/runtime.md.
"""

from __future__ import annotations

from .config import RuntimeConfig, parse_args
from .main import main, serve
from .server import RuntimeServer

__all__ = ["RuntimeConfig", "RuntimeServer", "main", "parse_args", "serve"]
