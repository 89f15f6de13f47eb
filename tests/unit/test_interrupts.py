"""`raise_where_safe`: at once in plain code, between two callbacks of a running asyncio loop."""

from __future__ import annotations

import asyncio

import pytest

from agent_sandbox.interrupts import raise_where_safe

pytestmark = pytest.mark.unit


def test_without_a_running_loop_it_raises_at_once() -> None:
    with pytest.raises(KeyboardInterrupt, match="now"):
        raise_where_safe(KeyboardInterrupt("now"))


def test_in_a_running_loop_it_raises_as_the_next_callback_and_tasks_are_cancelled_cleanly() -> None:
    steps: list[str] = []

    async def main() -> None:
        try:
            raise_where_safe(KeyboardInterrupt("later"))
            steps.append("went on")  # the code the signal interrupted finishes its step
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            steps.append("cancelled")
            raise

    with pytest.raises(KeyboardInterrupt, match="later"):
        asyncio.run(main())
    assert steps == ["went on", "cancelled"]
