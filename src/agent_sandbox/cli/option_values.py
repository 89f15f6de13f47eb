"""Values of the sandbox commands' options that a handler or argparse checks: `KEY=VALUE` pairs (`--label`,
`--env`) and `--shutdown-after`'s seconds."""

from __future__ import annotations

import argparse

from agent_sandbox_sdk._claims import MAX_SHUTDOWN_AFTER_SECONDS


def _shutdown_after_arg(value: str) -> int:
    """`--shutdown-after`: whole seconds, 1 to 100 years. Checked by argparse (exit 2 naming the option):
    until December 6 the SDK refused it, naming its own parameter `shutdown_after_seconds`."""
    try:
        seconds = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {value!r}") from None
    if not 0 < seconds <= MAX_SHUTDOWN_AFTER_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds up to {MAX_SHUTDOWN_AFTER_SECONDS} (100 years), got {value!r}"
        )
    return seconds


def _pairs(values: list[str] | None, flag: str) -> list[tuple[str, str]]:
    out = []
    for value in values or []:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {value!r}: expected KEY=VALUE")
        out.append((key, val))
    return out
