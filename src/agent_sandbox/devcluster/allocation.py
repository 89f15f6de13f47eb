"""Loopback ports for side-by-side dev clusters, chosen under one file lock.

Owns: the lock every cluster takes while it picks ports and a pod CIDR (`<cache>/clusters/.lock`), the
names of the ports a cluster allocates at start-up, and finding a free loopback port below the kernel's
ephemeral range. Which ports and CIDRs are taken (those recorded by other live clusters) is decided by
the caller (`DevCluster.up`, `DevCluster.reserve_port`) under the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import random
import socket
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


def free_port(taken: set[int]) -> int:
    """A loopback port that binds now and is not in `taken` (added to `taken`)."""
    candidates = _listen_ports()
    for _ in range(200 if candidates else 0):
        port = random.choice(candidates)
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    while True:  # no room below the ephemeral range: let the kernel choose
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            taken.add(port)
            return port
