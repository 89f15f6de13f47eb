"""`agent-sandbox exec -i` / `-t`: standard input and a terminal, as `kubectl exec -it`.

Both need sandboxd's process API (gRPC `Start` with a PTY, `WriteStdin`, `ResizeTTY`), reached through the
router (started with `--enable-h2c`) or a port-forward to the pod; the legacy runtime has no stdin.

Three parties run at once: the main thread reads the command's output stream; a pump thread forwards what
arrives on standard input (`send_stdin`, then `close_stdin` at end of input) and, with `-t`, the terminal's
new size after each SIGWINCH (`resize`); Python's C-level signal handler writes SIGWINCH to a pipe the pump
waits on (`signal.set_wakeup_fd`), so a resize is not delayed until the next output arrives. With `-it` the
local terminal is in raw mode, so Ctrl-C, Ctrl-D and the arrow keys go to the remote program as bytes; with
`-t` alone it is left as it is (nothing would read the keys), so Ctrl-C stops the CLI, as with kubectl.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
import tty
from collections.abc import Callable, Iterator

from agent_sandbox_sdk import CommandEvent, SandboxError
from agent_sandbox_sdk.sandbox import CommandStream

from .output import relay_output

__all__ = ["StartCommand", "run_interactive"]

_CHUNK = 64 * 1024

#: Starts the command, under a PTY of (cols, rows) when given.
StartCommand = Callable[[tuple[int, int] | None], CommandStream]


def run_interactive(start: StartCommand, *, stdin: bool, want_tty: bool) -> CommandEvent | None:
    """Run the command `start(pty)` starts, wiring standard input and the terminal to it; its exit event
    (None if the stream ended without one)."""
    use_tty = want_tty and os.isatty(sys.stdin.fileno()) and os.isatty(sys.stdout.fileno())
    if want_tty and not use_tty:
        which = "input" if not os.isatty(sys.stdin.fileno()) else "output"
        if not os.isatty(sys.stdin.fileno()) and not os.isatty(sys.stdout.fileno()):
            which = "input and output"
        print(f"warning: -t ignored: standard {which} is not a terminal", file=sys.stderr)
    size = _terminal_size() if use_tty else None
    stream = start((size.columns, size.lines) if size else None)
    stream.wait_started()  # before the pump thread may call the stream (the flow is not re-entrant)
    if not stdin and not use_tty:
        # Nothing will ever be written to its stdin (no -i; `-t` ignored off a terminal): end it now, as plain
        # `exec` runs with /dev/null. Until December 6 `echo abc | agent-sandbox exec -t X -- cat` hung forever.
        stream.close_stdin()
    stop_read, stop_write = os.pipe()
    # Raw only when the keys go somewhere (-i): with -t alone Ctrl-C must still stop this program (as kubectl).
    with stream, _raw(use_tty and stdin), _winch_pipe(use_tty) as winch:
        pump = threading.Thread(
            target=_pump,
            args=(stream, stdin, winch, stop_read, size),
            name="exec-stdin",
            daemon=True,  # blocked in select() when the command ends; the stop pipe wakes it
        )
        pump.start()
        try:
            exit_event: CommandEvent | None = relay_output(stream)
        finally:
            os.write(stop_write, b"x")
            pump.join(timeout=5)
            os.close(stop_write)
            os.close(stop_read)
    return exit_event


def _pump(
    stream: CommandStream,
    stdin: bool,
    winch: int | None,
    stop: int,
    size: os.terminal_size | None,
) -> None:
    """Forward standard input and terminal resizes until told to stop (errors end the pump, not the command:
    the output stream reports how the command ended)."""
    watched = [stop] + ([sys.stdin.fileno()] if stdin else []) + ([winch] if winch is not None else [])
    try:
        while True:
            ready, _, _ = select.select(watched, [], [])
            if stop in ready:
                return
            if winch is not None and winch in ready:
                os.read(winch, 512)  # one byte per signal delivered; any number of them means "look again"
                now = _terminal_size()
                if now != size:
                    size = now
                    stream.resize(now.columns, now.lines)
            if stdin and sys.stdin.fileno() in ready:
                data = os.read(sys.stdin.fileno(), _CHUNK)
                if not data:
                    stream.close_stdin()
                    watched.remove(sys.stdin.fileno())
                    continue
                stream.send_stdin(data)
    except (SandboxError, OSError):
        return


def _terminal_size() -> os.terminal_size:
    """The terminal's own size (not shutil's, which prefers $COLUMNS / $LINES: those do not follow a resize)."""
    return os.get_terminal_size(sys.stdout.fileno())


@contextlib.contextmanager
def _raw(enabled: bool) -> Iterator[None]:
    """The local terminal in raw mode (keys reach the remote program as typed), restored afterwards."""
    if not enabled:
        yield
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setraw(
        fd, termios.TCSANOW
    )  # not setraw's default TCSAFLUSH: what was typed ahead goes to the command
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _winch_pipe(enabled: bool) -> Iterator[int | None]:
    """A pipe that receives a byte for every signal the process gets (SIGWINCH among them), or None."""
    if not enabled:
        yield None
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous_handler = signal.signal(
        signal.SIGWINCH, lambda *_: None
    )  # a Python handler makes C write the fd
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        yield read_end
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGWINCH, previous_handler)
        os.close(read_end)
        os.close(write_end)
