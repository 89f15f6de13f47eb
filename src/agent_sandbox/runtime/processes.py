"""The command processes of one runtime server (:class:`Supervisor`): ids, the limit, spawn, kill on shutdown.

Every command leads its own process group (session), so a timeout, a cancelled call, SendSignal and
shutdown reach everything it started. A command's background processes outlive it (as with upstream
sandboxd), their groups are remembered and killed when the server stops. One running command is a
:class:`.process.Process`; its exit is noticed by :mod:`.reaper`, its OS process started by :mod:`.spawn`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import itertools
import os
import signal
import subprocess
import termios
from collections.abc import Callable, Mapping, Sequence

from .claimenv import ClaimEnv, ClaimEnvUnavailable
from .process import DRAIN_AFTER_EXIT, QUIET_AFTER_EXIT, Process, winsize
from .reaper import loop_reaper
from .spawn import pipe_reader, pipe_writer, popen_in_session

__all__ = ["ShuttingDown", "SpawnError", "Supervisor", "TooManyProcesses"]


class SpawnError(Exception):
    """The program could not be started; `kind` is not_found, permission, invalid, unavailable or internal."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class TooManyProcesses(Exception):
    """The server's concurrent-process limit is reached."""


class ShuttingDown(TooManyProcesses):
    """The runtime is draining (its pod is going away): no command starts any more."""


def _spawn_error(err: OSError, cwd: str) -> SpawnError:
    if err.filename is not None:
        # Named without the host's path (on a local runner the working directory is the volume's path on
        # the host) and clipped: a 300 KB program name came back whole and passed gRPC's metadata limit.
        name = os.fsdecode(err.filename)
        shown = "working directory" if name == cwd else name[:200] + ("..." if len(name) > 200 else "")
        err = type(err)(err.errno, err.strerror, shown)
    if err.errno == errno.ENAMETOOLONG:
        return SpawnError("invalid", str(err))
    if isinstance(err, FileNotFoundError):
        return SpawnError("not_found", str(err))
    if isinstance(err, PermissionError):
        return SpawnError("permission", str(err))
    if isinstance(err, NotADirectoryError | IsADirectoryError):
        return SpawnError("invalid", str(err))
    if err.errno == errno.E2BIG:
        # Agents send whole scripts as `python -c '...'`; the kernel's limits are worth naming, with the way
        # around them (upstream's runtimes report the bare errno, sandboxd as INTERNAL).
        return SpawnError(
            "invalid",
            f"{err} - one argument may hold at most 128 KiB and all of them with the environment about "
            "2 MiB: write a long script to a file and run the file",
        )
    return SpawnError("internal", str(err))


class Supervisor:
    """The processes of one server: ids, the concurrency limit, and what shutdown must kill."""

    def __init__(
        self,
        *,
        max_processes: int,
        chunk_size: int,
        env: Mapping[str, str] | None = None,
        claim_env: ClaimEnv | None = None,
        on_activity: Callable[[], None] | None = None,
        drain_after_exit: float = DRAIN_AFTER_EXIT,
        quiet_after_exit: float = QUIET_AFTER_EXIT,
    ) -> None:
        """Args:
        max_processes: concurrent commands (TooManyProcesses beyond).
        chunk_size: largest output event.
        drain_after_exit: how long a command's output is still read after it exited (what a background
            child keeps open is given up then).
        quiet_after_exit: ...or sooner, once it has been quiet this long after the exit.
        env: the commands' base environment (default: the server's own).
        claim_env: a claim's env, added to every command (after waiting for its delivery).
        on_activity: called when a command starts or ends (activity for idle detection).
        """
        self.max_processes = max_processes
        self.chunk_size = chunk_size
        self.drain_after_exit = drain_after_exit
        self.quiet_after_exit = quiet_after_exit
        self._env = dict(os.environ if env is None else env)
        self.claim_env = claim_env
        self._on_activity = on_activity
        self._ids = itertools.count(1)
        self._running: dict[int, Process] = {}
        # Spawns past the limit check that have not registered their process yet (they await on the way):
        # counted against the limit, or commands that arrive together all pass it.
        self._starting = 0
        self._groups: set[int] = set()  # groups started here that may still have members
        self._closing = (
            asyncio.Event()
        )  # `shutdown` began (`closed`); also ends a start waiting for the claim env

    @property
    def closed(self) -> bool:
        """`shutdown` began: no new command starts."""
        return self._closing.is_set()

    @property
    def running(self) -> int:
        return len(self._running)

    def get(self, ident: int) -> Process | None:
        return self._running.get(ident)

    def environment(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = dict(self._env)
        if extra:
            env.update(extra)
        return env

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str] | None = None,
        pty: tuple[int, int] | None = None,
        stdin: bool = True,
    ) -> Process:
        """Start `argv` (no shell) in its own process group; pty = (cols, rows) gives it a terminal."""
        if self.closed:
            raise ShuttingDown("runtime is shutting down")
        # A slot is taken before the first await and given back however the start ends: checked here but
        # counted only once registered, 150 commands sent together all ran under a limit of 64 (until
        # December 6).
        if len(self._running) + self._starting >= self.max_processes:
            raise TooManyProcesses(f"too many running commands (limit {self.max_processes})")
        if not argv or not argv[0]:
            raise SpawnError("invalid", "command is required")
        if any("\x00" in a for a in argv):
            raise SpawnError("invalid", "command contains a NUL byte")
        self._starting += 1
        try:
            return await self._spawn(argv, cwd=cwd, env=env, pty=pty, stdin=stdin)
        finally:
            self._starting -= 1

    async def _claim_env_or_shutdown(self, claim_env: ClaimEnv) -> dict[str, str]:
        """The claim env (`ClaimEnv.wait`), or `ShuttingDown` as soon as the drain starts: a command still
        waiting for its env was not started, and its request is answered so (`HEADER_NOT_STARTED`) while
        the listener is still open. Until December 7 it went on waiting, past the stop's deadline, and its
        connection was reset unanswered - which a router must take for a request that may have run."""
        waiting = asyncio.ensure_future(claim_env.wait())
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait({waiting, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            if not waiting.done():
                waiting.cancel()
        if not waiting.done() or waiting.cancelled():
            raise ShuttingDown("runtime is shutting down")
        try:
            return waiting.result()
        except ClaimEnvUnavailable as err:
            raise SpawnError("unavailable", str(err)) from None

    async def _spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str] | None,
        pty: tuple[int, int] | None,
        stdin: bool,
    ) -> Process:
        if self.claim_env is not None:
            claim = await self._claim_env_or_shutdown(self.claim_env)
            if claim:
                env = {**claim, **(env or {})}
            if self.closed:
                raise ShuttingDown("runtime is shutting down")
        full_env = self.environment(env)
        if any("\x00" in k or "=" in k or not k or "\x00" in v for k, v in full_env.items()):
            raise SpawnError("invalid", "environment names must be non-empty without '=' or NUL")
        loop = asyncio.get_running_loop()
        master = slave = -1
        try:
            if pty is not None:
                master, slave = os.openpty()
                cols, rows = pty
                if cols > 0 and rows > 0:
                    fcntl.ioctl(master, termios.TIOCSWINSZ, winsize(cols, rows))
                popen = popen_in_session(
                    argv, cwd, full_env, stdio=(slave, slave, slave), tty=os.ttyname(slave)
                )
            else:
                stdin_fd = subprocess.PIPE if stdin else subprocess.DEVNULL
                popen = popen_in_session(
                    argv, cwd, full_env, stdio=(stdin_fd, subprocess.PIPE, subprocess.PIPE), tty=None
                )
        except OSError as err:
            self._close_fds(master, slave)
            raise _spawn_error(err, cwd) from None
        except ValueError as err:
            self._close_fds(master, slave)
            raise SpawnError("invalid", str(err)) from None
        except BaseException:
            self._close_fds(master, slave)  # a PTY pair per failed call would use up fds and /dev/ptmx
            raise
        self._groups.add(popen.pid)
        exited = loop_reaper().watch(popen.pid)
        readers: list[tuple[str, asyncio.StreamReader, asyncio.BaseTransport]] = []
        writer: asyncio.StreamWriter | None = None
        try:
            if pty is not None:
                readers.append(
                    await pipe_reader(loop, "stdout", os.fdopen(os.dup(master), "rb", buffering=0))
                )
                writer = await pipe_writer(loop, os.fdopen(os.dup(master), "wb", buffering=0))
            else:
                assert popen.stdout is not None
                assert popen.stderr is not None
                readers.append(await pipe_reader(loop, "stdout", popen.stdout))
                readers.append(await pipe_reader(loop, "stderr", popen.stderr))
                if popen.stdin is not None:
                    writer = await pipe_writer(loop, popen.stdin)
        except BaseException:
            # Cancelled (its caller gone) while the pipes were wired up: the command is nobody's, it must
            # not run on unseen, nor hold its pipes and PTY.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)
            for _, _, transport in readers:
                transport.close()
            for pipe in (popen.stdin, popen.stdout, popen.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            self._close_fds(master, slave)
            raise
        ident = next(self._ids)
        terminal = (master, slave) if pty is not None else None
        proc = Process(
            ident,
            popen,
            exited,
            readers,
            writer,
            terminal,
            self.chunk_size,
            self.drain_after_exit,
            self.quiet_after_exit,
        )
        self._running[ident] = proc
        exited.add_done_callback(lambda _f: self._forget(ident))
        if self._on_activity is not None:
            self._on_activity()
        return proc

    @staticmethod
    def _close_fds(*fds: int) -> None:
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _forget(self, ident: int) -> None:
        proc = self._running.pop(ident, None)
        if proc is None:
            return
        if self._on_activity is not None:
            self._on_activity()
        if not _group_alive(proc.pid):
            self._groups.discard(proc.pid)
        # Prune groups whose background members have all gone, so a recycled id is never signalled.
        for pgid in [g for g in self._groups if g not in {p.pid for p in self._running.values()}]:
            if not _group_alive(pgid):
                self._groups.discard(pgid)

    def signal_all(self, sig: int) -> None:
        """Signal every process group started here that still has members."""
        for pgid in list(self._groups):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                self._groups.discard(pgid)
            except PermissionError:
                pass

    async def shutdown(self, grace: float) -> None:
        """Refuse new commands, SIGTERM every group, SIGKILL whatever is left after `grace` seconds."""
        self._closing.set()
        self.signal_all(signal.SIGTERM)
        running = [p.wait() for p in self._running.values()]
        if running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True), grace)
        self.signal_all(signal.SIGKILL)
        running = [p.wait() for p in self._running.values()]
        if running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True), 5.0)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
