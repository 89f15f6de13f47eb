"""The real controller for the local-runner tests (one process per test module, stopped by PID)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    started = start_controller(cluster)
    try:
        yield started
    finally:
        stop(started)
