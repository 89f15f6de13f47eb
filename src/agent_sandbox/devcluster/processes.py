"""Start, watch and stop the dev cluster's processes, by PID and only those we started.

Owns: spawning a component with its own log file and session, telling whether a recorded PID is still the
process we started (PIDs get reused), and stopping it (SIGTERM, then SIGKILL after a bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Variables that would point a component at an in-cluster address: the dev cluster only talks to loopback.
_SCRUBBED_ENV = (
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "KUBECONFIG",
    "HTTP_PROXY",
    "HTTPS_PROXY",
)


class ComponentError(RuntimeError):
    """A component failed to start or become ready; the message names it, its log and its last lines."""


@dataclass(frozen=True, slots=True)
class Started:
    """A process we started: its PID and the argv[0] used to recognise it later."""

    name: str
    pid: int
    exe: str
    log: Path


def log_tail(path: Path, lines: int = 25) -> str:
    """Last `lines` lines of a log file (empty string when missing)."""
    try:
        data = path.read_bytes()[-16384:].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def component_error(name: str, log: Path, what: str) -> ComponentError:
    """Build the uniform error: component, what went wrong, log path, last lines."""
    return ComponentError(f"{name}: {what}\nlog: {log}\nlast lines of the log:\n{log_tail(log)}")


def wait_ready(started: Started, url: str, *, deadline: float) -> None:
    """Poll `url` (e.g. a `/readyz`) until it answers 200; fail if the process exits or `deadline` passes.

    Raises:
        ComponentError: with the process's last log lines.
    """
    from .rest import probe_http

    while not probe_http(url):
        if not is_ours(started.pid, started.exe):
            raise component_error(started.name, started.log, f"exited before ready ({url})")
        if time.monotonic() > deadline:
            raise component_error(started.name, started.log, f"not ready ({url}) in time")
        time.sleep(0.1)


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    identity: str | None = None,
) -> Started:
    """Start `argv` detached (own session) with stdout+stderr appended to `log`.

    `identity` is the argv word that recognises the process later (default argv[0]); pass the module name
    for `python -m module` so a recycled PID running another Python program is not taken for ours.
    """
    base = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    if env:
        base.update(env)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=base,
            cwd=cwd,
            start_new_session=True,
        )
    _await_exec(proc.pid)
    return Started(name=name, pid=proc.pid, exe=identity or str(argv[0]), log=log)


def _await_exec(pid: int, bound: float = 2.0) -> None:
    # Popen returns once exec has begun, but the kernel fills /proc/<pid>/cmdline a moment later;
    # `is_ours` reads it, so wait for it to appear (bounded: a fast-exiting process never shows one).
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes():
                return
        except OSError:
            return
        time.sleep(0.001)


def is_ours(pid: int, exe: str) -> bool:
    """True when `pid` is alive and its command line still starts with `exe` (not a recycled PID)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # A zombie (state Z) has exited; it only waits for its parent to reap it.
    if stat.rpartition(")")[2].split()[0] == "Z":
        return False
    args = raw.split(b"\0")
    # Scripts run through an interpreter show it as argv[0] and themselves as argv[1]; `python -m module`
    # shows the module as argv[2].
    return exe.encode() in args[:3]


def _reap(pid: int, *, within: float = 0.0) -> None:
    """Collect `pid`'s exit status if it is our exited child; wait up to `within` s for it to finish exiting."""
    deadline = time.monotonic() + within
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            return  # not our child (any more)
        if done or time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def _gone(started: Started) -> bool:
    """True once the process is not running any more, reaping it if it was our child.

    Reap *after* seeing it gone, and give it a moment: an exiting process loses its command line before it
    becomes a zombie, and a child not reaped stays a zombie in the process table of whoever started the
    cluster (a test process) until that one exits.
    """
    if is_ours(started.pid, started.exe):
        return False
    _reap(started.pid, within=1.0)
    return True


def stop(started: Started, *, grace: float = 10.0) -> None:
    """SIGTERM the process (and its session), SIGKILL after `grace` seconds; no-op when already gone."""
    if _gone(started):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(started.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if _gone(started):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(started.pid, signal.SIGKILL)
    for _ in range(100):
        if _gone(started):
            return
        time.sleep(0.05)


def rss_bytes(pid: int) -> int:
    """Resident set size of a live process (0 when gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_component(main: Coroutine[Any, Any, None]) -> int:
    """Body of a Python component's `main()` (provisioner, service proxy): log lines to stdout (the log file
    `spawn` gave it), run `main` until it returns or the process is interrupted."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main)
    return 0
