"""Fixtures of the lifecycle tests: the real controller with `--sandbox-lifecycle` (one per module)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import aiohttp
import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.devcluster.router import router_kubeconfig
from agent_sandbox.router import Router, load_router_config


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    """The controller with the lifecycle controller on (installs the SandboxArchive CRD and grants)."""
    started = start_controller(cluster, extra=("--sandbox-lifecycle",))
    try:
        yield started
    finally:
        stop(started)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


@pytest.fixture
async def start_router(
    cluster: DevCluster, controller: Started, caplog: pytest.LogCaptureFixture
) -> AsyncIterator[Callable[..., Awaitable[Router]]]:
    """In-process routers with the Pod cache and `--sandbox-lifecycle` (unless `lifecycle=False`), on ephemeral
    loopback ports. Their INFO records (held requests and their outcome, failed dials) are captured, so a
    failing test's report says which way each request went."""
    caplog.set_level(logging.INFO, logger="agent_sandbox.router")
    routers: list[Router] = []

    async def start(*flags: str, lifecycle: bool = True) -> Router:
        args = [
            "--http-bind-address=127.0.0.1:0",
            "--metrics-bind-address=127.0.0.1:0",
            "--health-probe-bind-address=127.0.0.1:0",
            "--allow-loopback-pod-ip",
            "--cache-enabled",
            *(["--sandbox-lifecycle"] if lifecycle else []),
            "--upstream-retry-initial-delay=50ms",
            "--upstream-retry-max-delay=100ms",
            *flags,
        ]
        # The admin, or (AGENT_SANDBOX_CONTROLLER_IDENTITY=serviceaccount, as CI runs) the install's
        # `sandbox-router` ServiceAccount with the grants of k8s/router (+ k8s/router/lifecycle).
        args.append(f"--kubeconfig={router_kubeconfig(cluster, args)}")
        config, _ = load_router_config(args, {})
        router = Router(config)
        await router.start()
        routers.append(router)
        return router

    yield start
    for router in routers:
        await router.shutdown()
