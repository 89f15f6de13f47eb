"""Fixtures shared by the integration tests (the `cluster`, `namespace` and `kube` fixtures: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    """The real controller process (all controllers, default flags), one per test module, stopped by PID.

    A module that needs other flags defines its own `controller` fixture, which takes precedence.
    """
    started = start_controller(cluster)
    try:
        yield started
    finally:
        stop(started)
