"""agent_sandbox.router: the Sandbox Router, an HTTP reverse proxy to sandboxes (router spec §1).

Wire-compatible with upstream's Go router (flags, environment, config file, headers, errors, metrics)
and stricter about where it proxies (docs/router.md). Run it as `agent-sandbox-router`, or in-process:

    router = Router(load_router_config(["--http-bind-address=127.0.0.1:0"])[0])
    await router.start()
    ...
    await router.shutdown()
"""

from __future__ import annotations

from ._app import Router, StartupError
from ._authz import bearer_token, mint_scoped_token
from ._config import FLAGS, PROGRAM, ConfigError, RouterConfig, load_router_config
from ._main import main, run
from ._routing import Route, RouteError, parse_route

__all__ = [
    "FLAGS",
    "PROGRAM",
    "ConfigError",
    "Route",
    "RouteError",
    "Router",
    "RouterConfig",
    "StartupError",
    "bearer_token",
    "load_router_config",
    "main",
    "mint_scoped_token",
    "parse_route",
    "run",
]
