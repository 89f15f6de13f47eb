"""Starting a command's OS process: fork+exec in a session of its own, and its pipes onto the event loop.

Synchronous and cheap on purpose (vfork+exec, no Python code between fork and exec); exec errors surface
as OSError for the supervisor to report. A command given a PTY is started through a tiny /bin/sh wrapper
that makes the terminal its controlling one, and is executed as one without (`_CTTY_WRAPPER`).
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence

__all__ = ["pipe_reader", "pipe_writer", "popen_in_session"]

_READ_LIMIT = 1 << 16  # StreamReader buffer before the pipe is paused (backpressure on a slow client)


# With a PTY the program must lead a session whose controlling terminal is the PTY (job control, ^C, SIGWINCH).
# A session leader without one acquires it by opening the terminal; /bin/sh does that open and then execs the
# program, so no Python code runs between fork and exec (grpcio's fork handlers can crash such a child, and
# a plain vfork+exec stays cheap in a large runner process). Python's subprocess has no TIOCSCTTY, and
# os.posix_spawn (which could open the terminal after setsid) no working directory.
#
# The shell must not show: its `exec` runs a file the kernel refuses (ENOEXEC: no `#!`, no ELF) as a shell
# script, where a command without PTY fails with "Exec format error" as sandboxd's does - so such a file is
# refused before the shell starts (`_check_program`); and it sets PWD to the real working directory - so the
# client's PWD, or its absence, is handed over in $1 ("=<value>" or "-") and restored before the exec.
# $0 is the terminal.
_CTTY_WRAPPER = (
    'case $1 in =*) PWD=${1#=}; export PWD;; *) unset PWD;; esac; shift; exec "$@" <>"$0" >&0 2>&0'
)

_ELF_MAGIC = b"\x7fELF"
_BINFMT_MISC = "/proc/sys/fs/binfmt_misc"
_HEAD = 256  # the kernel's BINPRM_BUF_SIZE: what it reads to choose a format, the `#!` line too
_INTERPRETER = re.compile(rb"[ \t]*([^ \t\x00]*)")


def _check_program(argv0: str, cwd: str, env: Mapping[str, str]) -> None:
    """Raise the OSError exec would (missing, not executable, a format the kernel cannot run, a `#!`
    interpreter missing), since the PTY wrapper would hide it or run the file as a shell script."""
    if "/" in argv0:
        path = os.path.join(cwd, argv0)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", argv0)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, "Permission denied", argv0)
    else:
        # A relative PATH entry (an empty one too) is found from the command's working directory, as exec finds
        # it - not from the server's.
        search = os.pathsep.join(os.path.join(cwd, d) for d in env.get("PATH", os.defpath).split(os.pathsep))
        found = shutil.which(argv0, path=search)
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", argv0)
        path = os.path.join(cwd, found)
    _check_format(path, argv0, cwd)


def _check_format(path: str, argv0: str, cwd: str) -> None:
    """ENOEXEC for a file no binary format of the kernel takes; ENOENT for a `#!` whose interpreter is missing
    (what execve answers). A file that cannot be read (execute-only) is left to exec."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or a device is not opened here: exec decides
            return
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return
    try:
        head = os.read(fd, _HEAD)
    except OSError:
        return
    finally:
        os.close(fd)
    if head.startswith(_ELF_MAGIC):
        return
    if head.startswith(b"#!"):
        line, newline, _ = head[2:].partition(b"\n")
        # As the kernel reads it: blanks skipped, then up to a blank or NUL - a CR stays in the name (a script
        # saved with CRLF line ends names "/bin/sh\r", which does not exist: ENOENT without a PTY too).
        match = _INTERPRETER.match(line)
        interpreter = match.group(1) if match else b""
        if newline and not interpreter:
            raise OSError(errno.ENOEXEC, os.strerror(errno.ENOEXEC), argv0)
        # A relative interpreter is found from the working directory, as the kernel finds it.
        if newline and not os.path.exists(os.path.join(os.fsencode(cwd), interpreter)):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", argv0)
        return
    if not _binfmt_misc_takes(path, head):
        raise OSError(errno.ENOEXEC, os.strerror(errno.ENOEXEC), argv0)


def _binfmt_misc_takes(path: str, head: bytes) -> bool:
    """Whether an enabled binfmt_misc entry (by magic or by extension) would run the file."""
    try:
        with open(f"{_BINFMT_MISC}/status") as f:
            if f.read().strip() != "enabled":
                return False
        names = [n for n in os.listdir(_BINFMT_MISC) if n not in ("status", "register")]
    except OSError:  # not mounted: no such formats
        return False
    for name in names:
        try:
            with open(f"{_BINFMT_MISC}/{name}") as f:
                fields = dict(line.partition(" ")[::2] for line in f.read().splitlines())
        except OSError:
            continue
        if "enabled" not in fields:
            continue
        if "extension" in fields:
            if path.endswith("." + fields["extension"].lstrip(".")):
                return True
            continue
        try:
            magic = bytes.fromhex(fields.get("magic", ""))
            mask = bytes.fromhex(fields["mask"]) if "mask" in fields else b"\xff" * len(magic)
            offset = int(fields.get("offset", "0"))
        except ValueError:
            return True  # an entry we cannot read: let exec decide, as before
        got = head[offset : offset + len(magic)]
        if len(got) == len(magic) and all(
            (a & m) == (b & m) for a, b, m in zip(got, magic, mask, strict=False)
        ):
            return True
    return False


def popen_in_session(
    argv: Sequence[str], cwd: str, env: Mapping[str, str], *, stdio: tuple[int, int, int], tty: str | None
) -> subprocess.Popen[bytes]:
    """fork+exec in a new session (own process group). Synchronous on purpose: vfork makes it cheap, and
    exec errors (missing program, denied, bad cwd) surface here as OSError."""
    args = list(argv)
    if tty is not None:
        if not os.path.isdir(cwd):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", cwd)
        _check_program(args[0], cwd, env)
        pwd = "=" + env["PWD"] if "PWD" in env else "-"
        args = ["/bin/sh", "-c", _CTTY_WRAPPER, tty, pwd, *args]
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
