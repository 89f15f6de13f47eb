"""Command processes of one runtime server: spawn, stream output, signal, reap, kill on shutdown.

Every command leads its own process group (session), so a timeout, a cancelled call, SendSignal and
shutdown reach everything it started. Exits are noticed through a pidfd on the event loop (no thread or
SIGCHLD handler per child, so many servers share one loop and tests can embed a server). A command's
background processes outlive it (as with upstream sandboxd), their groups are remembered and killed when
the server stops. When the runtime is PID 1 (a container), orphans re-parented to it are reaped too.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import itertools
import os
import shutil
import signal
import struct
import subprocess
import termios
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from .claimenv import ClaimEnv, ClaimEnvUnavailable

__all__ = [
    "DRAIN_AFTER_EXIT",
    "QUIET_AFTER_EXIT",
    "BoundedOutput",
    "OutputEvent",
    "Process",
    "ShuttingDown",
    "SpawnError",
    "Supervisor",
    "TooManyProcesses",
    "exit_code_of",
]

_READ_LIMIT = 1 << 16  # StreamReader buffer before the pipe is paused (backpressure on a slow client)
DRAIN_AFTER_EXIT = 10.0  # sandboxd's WaitDelay: output pipes a background child keeps open are given up
# ...and sooner once they have been quiet this long after the exit (ours): `sh -c 'server &'` answers then.
QUIET_AFTER_EXIT = 0.5


def _unread_bytes(fd: int) -> int:
    """Bytes waiting to be read from a pipe or terminal (FIONREAD)."""
    count: int = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    return count


class SpawnError(Exception):
    """The program could not be started; `kind` is not_found, permission, invalid, unavailable or internal."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class TooManyProcesses(Exception):
    """The server's concurrent-process limit is reached."""


class ShuttingDown(TooManyProcesses):
    """The runtime is draining (its pod is going away): no command starts any more."""


@dataclass(frozen=True, slots=True)
class OutputEvent:
    """One chunk of output; `stream` is "stdout" or "stderr" (a PTY's output is all "stdout")."""

    stream: str
    data: bytes


def exit_code_of(status: int) -> int:
    """Exit code from a wait status: the code, or -signal for a killed process (Python's convention)."""
    return os.waitstatus_to_exitcode(status)


class BoundedOutput:
    """Keeps the first `limit` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._kept = 0
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self.limit - self._kept
        if room > 0:
            part = data[:room]
            self._parts.append(part)
            self._kept += len(part)
        self.dropped += max(0, len(data) - max(room, 0))

    def value(self) -> bytes:
        """The kept bytes, followed by a marker line when anything was dropped."""
        data = b"".join(self._parts)
        if self.dropped:
            data += f"\n[output truncated: {self.dropped} more bytes]\n".encode()
        return data


class _Reaper:
    """Notices child exits on one event loop through pidfds; as PID 1 also reaps adopted orphans."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._waiting: dict[int, tuple[int, asyncio.Future[int]]] = {}
        if os.getpid() == 1:
            loop.add_signal_handler(signal.SIGCHLD, self._reap_all)

    def watch(self, pid: int) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = self.loop.create_future()
        pidfd = os.pidfd_open(pid)
        self._waiting[pid] = (pidfd, fut)
        self.loop.add_reader(pidfd, self._poll, pid)
        self._poll(pid)  # it may have exited already
        return fut

    def _poll(self, pid: int) -> None:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere (PID 1 sweep): status lost
            done, status = pid, -1
        if done:
            self._finish(pid, status)

    def _finish(self, pid: int, status: int) -> None:
        entry = self._waiting.pop(pid, None)
        if entry is None:
            return
        pidfd, fut = entry
        self.loop.remove_reader(pidfd)
        os.close(pidfd)
        if not fut.done():
            fut.set_result(exit_code_of(status) if status != -1 else -1)

    def _reap_all(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._finish(pid, status)


_reapers: dict[asyncio.AbstractEventLoop, _Reaper] = {}


def _reaper() -> _Reaper:
    loop = asyncio.get_running_loop()
    reaper = _reapers.get(loop)
    if reaper is None or reaper.loop.is_closed():
        reaper = _reapers[loop] = _Reaper(loop)
    return reaper


class Process:
    """A running command: its output events, stdin, exit code, and its process group."""

    def __init__(
        self,
        ident: int,
        popen: subprocess.Popen[bytes],
        exited: asyncio.Future[int],
        readers: list[tuple[str, asyncio.StreamReader, asyncio.BaseTransport]],
        stdin: asyncio.StreamWriter | None,
        terminal: tuple[int, int] | None,
        chunk_size: int,
        drain_after_exit: float = DRAIN_AFTER_EXIT,
        quiet_after_exit: float = QUIET_AFTER_EXIT,
    ) -> None:
        self.id = ident
        self.pid = popen.pid
        self._popen = popen
        self._exited = exited
        self._stdin = stdin
        self._stdin_lock = asyncio.Lock()
        # With a PTY we keep the slave side open ourselves until the program exited and its output was
        # read: closing the last slave makes the master return EIO, which can drop output still in flight.
        self._pty_master: int | None = terminal[0] if terminal else None
        self._pty_slave: int | None = terminal[1] if terminal else None
        self._slave_closer: asyncio.Future[None] | None = None
        self._chunk = chunk_size
        self._drain_after_exit = drain_after_exit
        self._quiet_after_exit = quiet_after_exit
        self._events: asyncio.Queue[OutputEvent | None] = asyncio.Queue(maxsize=16)
        self._transports = [t for _, _, t in readers]
        self._pumps = [asyncio.ensure_future(self._pump(name, r)) for name, r, _ in readers]
        self._open_streams = len(readers)
        exited.add_done_callback(self._on_exit)

    @property
    def has_pty(self) -> bool:
        return self._pty_master is not None

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    def _on_exit(self, fut: asyncio.Future[int]) -> None:
        if not fut.cancelled():
            self._popen.returncode = fut.result()  # keeps subprocess from waiting on a reaped pid
        if self._pty_slave is not None:
            self._slave_closer = asyncio.ensure_future(self._close_slave_when_drained())

    async def _close_slave_when_drained(self) -> None:
        """Close our slave side once the master has had no unread bytes for two polls (at most 1 s)."""
        quiet = 0
        for _ in range(100):
            await asyncio.sleep(0.01)
            if self._pty_master is None:
                break
            try:
                pending = _unread_bytes(self._pty_master)
            except OSError:
                break
            quiet = quiet + 1 if pending == 0 else 0
            if quiet >= 2:
                break
        self._close_slave()

    def _close_slave(self) -> None:
        if self._pty_slave is not None:
            with contextlib.suppress(OSError):
                os.close(self._pty_slave)
            self._pty_slave = None

    async def _pump(self, name: str, reader: asyncio.StreamReader) -> None:
        """Hand a stream's output on to `events`, then its end (None).

        Cancelled (`_abandon_streams`: nobody reads any more) it just ends. It used to put its end marker
        then too, and with the queue full (a command with lots of output, timed out or its client gone)
        waited for good: a task pending forever, "Task was destroyed but it is pending!" once collected
        (until December 6).
        """
        try:
            while True:
                try:
                    data = await reader.read(self._chunk)
                except OSError:  # EIO on a PTY master once the terminal's last holder is gone
                    data = b""
                if not data:
                    break
                await self._events.put(OutputEvent(name, data))
        except Exception:
            with contextlib.suppress(asyncio.QueueFull):  # the stream ends for `events` all the same
                self._events.put_nowait(None)
            raise
        await self._events.put(None)

    async def events(self) -> AsyncIterator[OutputEvent]:
        """Output in arrival order until every stream ends, or after the program exited: once the pipes
        have been quiet for `quiet_after_exit`, and at the latest `drain_after_exit` after the exit
        (sandboxd's WaitDelay). A background child that keeps the pipes open (`sh -c 'server &'`), quiet or
        chatty, does not hold the command's answer."""
        loop = asyncio.get_running_loop()
        drain_until: float | None = None
        while self._open_streams:
            if not self._events.empty():
                item = self._events.get_nowait()
            else:
                getter = asyncio.ensure_future(self._events.get())
                try:
                    if drain_until is None and not self._exited.done():
                        # The exit may come while we wait for output: it must start the drain clock then.
                        await asyncio.wait((getter, self._exited), return_when=asyncio.FIRST_COMPLETED)
                    while not getter.done():
                        if drain_until is None:
                            drain_until = loop.time() + self._drain_after_exit
                        quiet_until = min(drain_until, loop.time() + self._quiet_after_exit)
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout_at(quiet_until):
                                await asyncio.shield(getter)
                        if not getter.done() and (
                            loop.time() >= drain_until or not await self._output_pending()
                        ):
                            self._abandon_streams()
                            return
                finally:
                    getter.cancel()  # no-op once done; a cancelled caller leaves no waiting getter
                item = getter.result()
            if item is None:
                self._open_streams -= 1
                continue
            yield item

    async def _output_pending(self) -> bool:
        """Whether output is on its way though none arrived for a while: bytes the pumps have not handed on
        yet (after a stalled event loop the read callbacks and the quiet timer come due together, so the
        pumps get a few turns first) or bytes still in a pipe."""
        for _ in range(3):
            await asyncio.sleep(0)
        if not self._events.empty():
            return True
        for transport in self._transports:
            pipe = transport.get_extra_info("pipe")
            with contextlib.suppress(OSError, ValueError, AttributeError):
                if _unread_bytes(pipe.fileno()) > 0:
                    return True
        return False

    def _abandon_streams(self) -> None:
        for pump in self._pumps:
            pump.cancel()
        for transport in self._transports:
            transport.close()
        self._open_streams = 0

    async def wait(self) -> int:
        """The exit code (negative signal number if killed)."""
        return await asyncio.shield(self._exited)

    async def write_stdin(self, data: bytes) -> None:
        """Write `data` to the program's stdin, in order with other calls.

        Chunk by chunk, each handed over once the previous one is: a call cancelled (its deadline) while the
        program does not read has delivered a prefix of its data at most, as a blocking write would, and
        leaves at most two chunks queued (asyncio's transport buffers 64 KiB before `drain` waits). Handed over whole, every timed-out call's data stayed queued - memory
        without bound, and input delivered that the client was told had failed (until December 6).
        """
        async with self._stdin_lock:
            for start in range(0, len(data), _STDIN_CHUNK):
                if self._stdin is None:
                    raise BrokenPipeError("stdin is closed")
                await self._stdin.drain()  # what a cancelled call left queued goes first
                if self._stdin is None:
                    raise BrokenPipeError("stdin is closed")
                self._stdin.write(data[start : start + _STDIN_CHUNK])
            if self._stdin is not None:
                await self._stdin.drain()

    async def close_stdin(self) -> None:
        """Close stdin (EOF for the program); with a PTY, send the terminal's EOF character. After the writes
        in progress, in order (a write is handed over in chunks: an EOF between two would cut it)."""
        async with self._stdin_lock:
            if self._pty_master is not None and self._stdin is not None:
                self._stdin.write(b"\x04")
                return
            if self._stdin is not None:
                self._stdin.close()
                self._stdin = None

    @property
    def stdin_open(self) -> bool:
        return self._stdin is not None

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the whole process group (ProcessLookupError when it is gone)."""
        os.killpg(self.pid, sig)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def resize(self, cols: int, rows: int) -> None:
        if self._pty_master is None:
            raise OSError(errno.ENOTTY, "process has no PTY")
        fcntl.ioctl(self._pty_master, termios.TIOCSWINSZ, _winsize(cols, rows))

    async def close(self) -> None:
        """Release pipes and the PTY (after the process ended or was killed)."""
        self._abandon_streams()
        self._close_slave()
        if self._stdin is not None:
            self._stdin.close()
            self._stdin = None
        if self._pty_master is not None:
            with contextlib.suppress(OSError):
                os.close(self._pty_master)
            self._pty_master = None


#: What `write_stdin` hands to the pipe at a time (the size of a Linux pipe's buffer).
_STDIN_CHUNK = 64 * 1024


def _winsize(cols: int, rows: int) -> bytes:
    """TIOCSWINSZ's struct winsize; sizes past its 16 bits are clamped (a 70000-column `Start` failed with
    `struct.error` and leaked its PTY until December 6; upstream's sandboxd truncates them with `uint16()`)."""
    return struct.pack("HHHH", min(rows, 0xFFFF), min(cols, 0xFFFF), 0, 0)


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


def _popen(
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
        self.closed = False

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
            try:
                claim = await self.claim_env.wait()
            except ClaimEnvUnavailable as err:
                raise SpawnError("unavailable", str(err)) from None
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
                    fcntl.ioctl(master, termios.TIOCSWINSZ, _winsize(cols, rows))
                popen = _popen(argv, cwd, full_env, stdio=(slave, slave, slave), tty=os.ttyname(slave))
            else:
                stdin_fd = subprocess.PIPE if stdin else subprocess.DEVNULL
                popen = _popen(
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
        exited = _reaper().watch(popen.pid)
        readers: list[tuple[str, asyncio.StreamReader, asyncio.BaseTransport]] = []
        writer: asyncio.StreamWriter | None = None
        try:
            if pty is not None:
                readers.append(await _reader(loop, "stdout", os.fdopen(os.dup(master), "rb", buffering=0)))
                writer = await _writer(loop, os.fdopen(os.dup(master), "wb", buffering=0))
            else:
                assert popen.stdout is not None
                assert popen.stderr is not None
                readers.append(await _reader(loop, "stdout", popen.stdout))
                readers.append(await _reader(loop, "stderr", popen.stderr))
                if popen.stdin is not None:
                    writer = await _writer(loop, popen.stdin)
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
        self.closed = True
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


async def _reader(
    loop: asyncio.AbstractEventLoop, name: str, pipe: object
) -> tuple[str, asyncio.StreamReader, asyncio.BaseTransport]:
    reader = asyncio.StreamReader(limit=_READ_LIMIT, loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    return name, reader, transport


async def _writer(loop: asyncio.AbstractEventLoop, pipe: object) -> asyncio.StreamWriter:
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(loop=loop), pipe
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)
