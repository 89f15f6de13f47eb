"""Starting a command's OS process: fork+exec in a session of its own, and its pipes onto the event loop.

Synchronous and cheap on purpose (vfork+exec, no Python code between fork and exec); exec errors surface
as OSError for the supervisor to report. A command given a PTY is started through a tiny /bin/sh wrapper
that makes the terminal its controlling one.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

__all__ = ["pipe_reader", "pipe_writer", "popen_in_session"]

_READ_LIMIT = 1 << 16  # StreamReader buffer before the pipe is paused (backpressure on a slow client)


# With a PTY the program must lead a session whose controlling terminal is the PTY (job control, ^C, SIGWINCH).
# A session leader without one acquires it by opening the terminal; /bin/sh does that open and then execs the
# program, so no Python code runs between fork and exec (grpcio's fork handlers can crash such a child, and
# a plain vfork+exec stays cheap in a large runner process).
_CTTY_WRAPPER = 'exec "$@" <>"$0" >&0 2>&0'


def _resolve_program(argv0: str, cwd: str, env: Mapping[str, str]) -> None:
    """Raise the OSError exec would (missing or not executable), since the PTY wrapper hides it."""
    if "/" in argv0:
        path = os.path.join(cwd, argv0)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", argv0)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, "Permission denied", argv0)
    elif shutil.which(argv0, path=env.get("PATH", os.defpath)) is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", argv0)


def popen_in_session(
    argv: Sequence[str], cwd: str, env: Mapping[str, str], *, stdio: tuple[int, int, int], tty: str | None
) -> subprocess.Popen[bytes]:
    """fork+exec in a new session (own process group). Synchronous on purpose: vfork makes it cheap, and
    exec errors (missing program, denied, bad cwd) surface here as OSError."""
    args = list(argv)
    if tty is not None:
        if not os.path.isdir(cwd):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", cwd)
        _resolve_program(args[0], cwd, env)
        args = ["/bin/sh", "-c", _CTTY_WRAPPER, tty, *args]
    return subprocess.Popen(
        args, stdin=stdio[0], stdout=stdio[1], stderr=stdio[2], cwd=cwd, env=env, start_new_session=True
    )


async def pipe_reader(
    loop: asyncio.AbstractEventLoop, name: str, pipe: object
) -> tuple[str, asyncio.StreamReader, asyncio.BaseTransport]:
    reader = asyncio.StreamReader(limit=_READ_LIMIT, loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    return name, reader, transport


async def pipe_writer(loop: asyncio.AbstractEventLoop, pipe: object) -> asyncio.StreamWriter:
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(loop=loop), pipe
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)
