"""Small helpers shared by tests (polling with a bound, never a fixed sleep)."""

from __future__ import annotations

import time
from typing import Any

import pytest


def wait_for(predicate: Any, *, timeout: float = 30.0, interval: float = 0.1, what: str = "condition") -> Any:
    """Poll `predicate()` until it returns a truthy value; fail the test with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
