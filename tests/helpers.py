"""Small helpers shared by tests (polling with a bound, never a fixed sleep)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

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


T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T | None]], what: str, within: float = 60.0, *, interval: float = 0.2
) -> T:
    """Await `probe()` until it returns a truthy value; fail the test with `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


def is_ready(obj: Mapping[str, Any]) -> bool:
    """True when the object's status carries condition Ready=True."""
    return any(
        cd["type"] == "Ready" and cd["status"] == "True"
        for cd in (obj.get("status") or {}).get("conditions") or ()
    )
