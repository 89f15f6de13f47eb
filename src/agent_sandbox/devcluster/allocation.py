"""Loopback ports for side-by-side dev clusters, chosen under one file lock.

Owns: the lock every cluster takes while it picks ports and a pod CIDR (`<cache>/clusters/.lock`), the
names of the ports a cluster allocates at start-up, and finding a free loopback port below the kernel's
ephemeral range that no other process picked recently (`<cache>/clusters/.recent-ports`). Which ports and CIDRs are taken (those recorded by other live clusters) is decided by
the caller (`DevCluster.up`, `DevCluster.reserve_port`) under the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from agent_sandbox.devcluster.state import clusters_root

PORT_NAMES = ("etcd_client", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok", "runner")


@contextlib.contextmanager
def allocation_lock() -> Iterator[None]:
    """Hold the one file lock under which every cluster picks its ports and pod CIDR."""
    root = clusters_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _listen_ports() -> range:
    """Ports for the cluster's listeners: below the kernel's ephemeral range when there is room.

    A port from the ephemeral range can be handed to some client as its source port while its listener
    is down (during an in-place restart, devcluster/faults.py); a client connecting to a free local
    port can even connect to itself. Either makes the restarted listener fail with "address in use".
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    return range(max(1024, low - 12768), low) if low > 2048 else range(0)


_RECENT_FOR = 600.0  # s a picked port stays off-limits to other picks, bound yet or not


def _recent_file() -> Path:
    return clusters_root() / ".recent-ports"


def _recent_picks(now: float) -> dict[int, float]:
    """Ports picked in the last `_RECENT_FOR` s by any process (read under the allocation lock)."""
    try:
        picks = json.loads(_recent_file().read_text())
        return {int(port): float(at) for port, at in picks.items() if now - float(at) < _RECENT_FOR}
    except (OSError, ValueError, AttributeError):
        return {}


def free_port(taken: set[int]) -> int:
    """A loopback port that binds now and is not in `taken` (added to `taken`); call under `allocation_lock`.

    A port no cluster records (a test's own process) is bound only after the pick, so picks are remembered
    for a while: two processes picking at once (parallel test workers) never get the same port.
    """
    now = time.time()
    recent = _recent_picks(now)
    port = _pick(taken | set(recent))
    taken.add(port)
    recent[port] = now
    with contextlib.suppress(OSError):
        _recent_file().parent.mkdir(parents=True, exist_ok=True)
        _recent_file().write_text(json.dumps({str(p): at for p, at in recent.items()}))
    return port


def _pick(avoid: set[int] | frozenset[int]) -> int:
    candidates = _listen_ports()
    for _ in range(200 if candidates else 0):
        port = random.choice(candidates)
        if port in avoid:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    while True:  # no room below the ephemeral range: let the kernel choose
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port
