"""Run a command to completion with a time limit and bounded output (legacy /execute, gRPC Execute)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .process import BoundedOutput
from .processes import Supervisor

__all__ = ["CommandResult", "run_command"]


@dataclass(frozen=True, slots=True)
class CommandResult:
    exit_code: int  # negative signal number when killed
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool  # some output was dropped (the kept part ends with a marker line)


async def run_command(
    supervisor: Supervisor,
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str] | None,
    time_limit: float | None,
    output_limit: int,
) -> CommandResult:
    """Run `argv` without stdin; past `time_limit` (or when the caller is cancelled) kill its process group.

    Raises SpawnError / TooManyProcesses when it cannot start.
    """
    proc = await supervisor.spawn(argv, cwd=cwd, env=env, stdin=False)
    out, err = BoundedOutput(output_limit), BoundedOutput(output_limit)
    timed_out = False
    try:
        try:
            async with asyncio.timeout(time_limit):
                async for event in proc.events():
                    (out if event.stream == "stdout" else err).add(event.data)
                code = await proc.wait()
        except TimeoutError:
            timed_out = True
            proc.kill_group()
            code = await proc.wait()
    except BaseException:
        proc.kill_group()  # cancelled by the client: nothing of it may survive
        raise
    finally:
        await proc.close()
    return CommandResult(code, out.value(), err.value(), timed_out, bool(out.dropped or err.dropped))
