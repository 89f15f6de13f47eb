"""CLI output: `-o table|json|yaml|name` rendering and a progress line for waits.

Tables and progress are for people; json/yaml are for programs and keep field names stable (the SDK
models' field names). Progress is drawn on stderr only when stderr is a terminal, so piped output stays
clean.
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml

__all__ = [
    "CLAIM_RESOURCE",
    "FORMATS",
    "OBJECT_FORMATS",
    "POOL_RESOURCE",
    "StdoutClosedError",
    "age",
    "claim_of",
    "inform",
    "open_missing_streams",
    "progress",
    "relay_output",
    "render",
]

FORMATS = ("table", "json", "yaml")
OBJECT_FORMATS = (*FORMATS, "name")
#: Commands whose output is text of their own (cp, delete, proxy, logs): `-o json` is refused, not ignored
#: (until December 6 it was accepted, and `jq` got empty or non-JSON input).
TEXT_ONLY = ("table",)
"""For commands that print objects: `name` is kubectl's `-o name` (`resource.group/name`, one per line), which
kubectl and this CLI's commands accept back as an argument."""

CLAIM_RESOURCE = "sandboxclaim.extensions.agents.x-k8s.io"
POOL_RESOURCE = "sandboxwarmpool.extensions.agents.x-k8s.io"
_CLAIM_TYPES = {"sandboxclaim", "sandboxclaims", CLAIM_RESOURCE, "sandboxclaims.extensions.agents.x-k8s.io"}


def claim_of(type_and_name: str) -> str | None:
    """The claim name in kubectl's `TYPE/NAME` (`sandboxclaim/NAME`, what `-o name` prints); None when it
    names another type (or no name)."""
    kind, _, name = type_and_name.rpartition("/")
    return name if kind.lower() in _CLAIM_TYPES and name else None


def age(stamp: datetime | None, now: datetime | None = None) -> str:
    """kubectl-style age: `45s`, `12m`, `3h`, `2d`."""
    if stamp is None:
        return "-"
    seconds = int(((now or datetime.now(UTC)) - stamp).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


def render(
    data: Any,
    fmt: str,
    *,
    columns: Sequence[tuple[str, Any]] = (),
    name: Callable[[Any], str] | None = None,
    namespace: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> None:
    """Print `data` (a model, a dict, or a list of them) as `fmt`.

    `columns`: (header, function of one row -> cell) for the table form; `name`: function of one row -> its
    `resource.group/name`, for the name form. An empty table is a note on `err` naming `namespace` (kubectl's
    "No resources found in NS namespace."), so that a pipe reading the table sees no rows.
    """
    out = out or sys.stdout
    rows = data if isinstance(data, list) else [data]
    if fmt == "name":
        if name is None:
            raise ValueError("-o name: this command prints no objects")
        out.writelines(f"{name(r)}\n" for r in rows)
        return
    if fmt == "json":
        out.write(
            json.dumps(_plain(data) if not isinstance(data, list) else [_plain(r) for r in rows], indent=2)
        )
        out.write("\n")
        return
    if fmt == "yaml":
        plain = _plain(data) if not isinstance(data, list) else [_plain(r) for r in rows]
        out.write(yaml.safe_dump(plain, sort_keys=False))
        return
    if not rows:
        where = f" in {namespace} namespace" if namespace else ""
        (err or sys.stderr).write(f"No resources found{where}.\n")
        return
    table = [[h for h, _ in columns]] + [[_cell(fn(r)) for _, fn in columns] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    for row in table:
        out.write("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@contextmanager
def progress(message: str, *, stream: TextIO | None = None) -> Iterator[None]:
    """`message ... 1.2s` redrawn on a terminal while the block runs; nothing when not a terminal."""
    stream = stream or sys.stderr
    if not stream.isatty():
        yield
        return
    done = threading.Event()
    start = time.monotonic()

    def draw() -> None:
        frames = "|/-\\"
        i = 0
        while not done.wait(0.1):
            stream.write(f"\r{frames[i % 4]} {message} {time.monotonic() - start:5.1f}s")
            stream.flush()
            i += 1

    thread = threading.Thread(target=draw, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        stream.write("\r\033[K")
        stream.flush()


def relay_output(events: Iterable[Any]) -> Any:
    """Write a command's streamed output to standard output / error as it arrives (bytes, unchanged);
    returns its `exit` event, or None if the stream ended without one."""
    exit_event = None
    for event in events:
        if event.type == "exit":
            exit_event = event
            continue
        target = sys.stdout.buffer if event.type == "stdout" else sys.stderr.buffer
        target.write(event.data)
        target.flush()
    return exit_event


class StdoutClosedError(OSError):
    """A write to a standard output the process was started without (`>&-`): `error: cannot write to standard
    output`, exit 1 (kubectl: `error: write /dev/stdout: bad file descriptor`)."""

    def __init__(self) -> None:
        super().__init__("cannot write to standard output")


class _Unwritable(io.RawIOBase):
    """A standard output the CLI was started without (`agent-sandbox list >&-`): a write fails at once, one
    `error:` line and exit 1 (an `OSError`, which the commands' guard reports), where until December 7 `render`
    met a None `sys.stdout` with an AttributeError traceback. `drop`: a standard error's, whose writes are
    taken and dropped."""

    def __init__(self, fd: int, *, drop: bool = False) -> None:
        super().__init__()
        self._fd, self._drop = fd, drop

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self._drop:
            return len(memoryview(data))
        raise StdoutClosedError

    def fileno(self) -> int:
        return self._fd  # /dev/null, holding the descriptor (not a terminal: no `exec -t` session)

    def isatty(self) -> bool:
        return False


def inform(message: str) -> bool:
    """Print an informational line on standard output (a progress line, the URL `proxy` serves at), flushed.

    Best-effort: with a standard output the CLI was started without (`>&-`) the line is dropped and False
    returned, where a result (`list`, `get`, `exec`, `cp -`, `logs`) fails with `StdoutClosedError`. Until
    December 7 `proxy ... >&- &` exited 1 right after it started listening, and `demo` / `release` at their
    first progress line.
    """
    try:
        print(message, flush=True)
    except StdoutClosedError:
        return False
    return True


def open_missing_streams() -> None:
    """Stand-ins for a standard input, output or error the process was started without (`<&-`, `>&-`, `2>&-`:
    Python sets `sys.stdin` / `sys.stdout` / `sys.stderr` to None).

    Each closed descriptor is held by /dev/null first, so that no file or socket the CLI opens becomes
    "standard input" or "standard output". A missing stdin reads /dev/null: the end of input at once, as an
    empty one (until December 7 `cp - CLAIM:PATH <&-` was an AttributeError traceback, and `exec -i ... <&-`
    never ended the command's input). A missing stdout fails the first write (`_Unwritable`: unbuffered, so
    that nothing is left to fail again when Python flushes it at exit); a missing stderr takes what is
    written to it and drops it - messages, and the stderr `exec` relays from the command, whose exit code is
    kept (until December 7 exit 1, from an AttributeError traceback nobody could see).
    """
    # fd 0 first: the lowest free descriptor is what the next open returns.
    for fd, name, flags in (
        (0, "stdin", os.O_RDONLY),
        (1, "stdout", os.O_WRONLY),
        (2, "stderr", os.O_WRONLY),
    ):
        if getattr(sys, name) is not None:
            continue
        try:
            held = os.open(os.devnull, flags)
        except OSError:
            held = -1
        if held not in (-1, fd):
            os.dup2(held, fd)
            os.close(held)
        if fd == 0:
            # Standard input, never closed; without a /dev/null to hold fd 0 (a bare chroot) still empty.
            empty = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
            sys.stdin = empty if held == -1 else open(fd, encoding="utf-8", closefd=False)  # noqa: SIM115
            continue
        # A raw stream under the text one (no buffer): TextIOWrapper takes any binary stream.
        raw = _Unwritable(fd, drop=name == "stderr")
        setattr(sys, name, io.TextIOWrapper(raw, encoding="utf-8", write_through=True))
