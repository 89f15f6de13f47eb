"""One running command: its output events (with the drain after its exit), stdin, signals, and its PTY.

A command leads its own process group (session), so a signal, a timeout or a kill reaches everything it
started. Its output is read until every stream ends or, after the program exited, until the pipes have been
quiet a while (a background child that keeps them open does not hold the command's answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import struct
import subprocess
import termios
from collections.abc import AsyncIterator
from dataclasses import dataclass

__all__ = ["DRAIN_AFTER_EXIT", "QUIET_AFTER_EXIT", "BoundedOutput", "OutputEvent", "Process", "winsize"]

DRAIN_AFTER_EXIT = 10.0  # sandboxd's WaitDelay: output pipes a background child keeps open are given up
# ...and sooner once they have been quiet this long after the exit (ours): `sh -c 'server &'` answers then.
QUIET_AFTER_EXIT = 0.5


def _unread_bytes(fd: int) -> int:
    """Bytes waiting to be read from a pipe or terminal (FIONREAD)."""
    count: int = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    return count


@dataclass(frozen=True, slots=True)
class OutputEvent:
    """One chunk of output; `stream` is "stdout" or "stderr" (a PTY's output is all "stdout")."""

    stream: str
    data: bytes


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
        fcntl.ioctl(self._pty_master, termios.TIOCSWINSZ, winsize(cols, rows))

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


def winsize(cols: int, rows: int) -> bytes:
    """TIOCSWINSZ's struct winsize; sizes past its 16 bits are clamped (a 70000-column `Start` failed with
    `struct.error` and leaked its PTY until December 6; upstream's sandboxd truncates them with `uint16()`)."""
    return struct.pack("HHHH", min(rows, 0xFFFF), min(cols, 0xFFFF), 0, 0)
