"""One local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, and the
host-side volume provisioner.

Owns: the cluster directory (`<cache>/clusters/<name>/`: pki, kubeconfigs, data, logs, `state.json`), finding
recorded clusters (`load`, `list`), allocating a new one (ports and pod CIDR, under the lock of
allocation.py), `up` (start-up order with readiness bounds in startup.py), `down` (stops exactly the PIDs
recorded in `state.json`, then removes the directory) and `describe`. Several clusters run side by side:
allocation happens under a file lock and skips every port and CIDR recorded by other live clusters.

`DevCluster` is composed of its bases: the recorded state, paths and processes (state.py), the start-up
sequence (startup.py), the simulations (node_controls.py) and the local runner's control calls (runner_client.py).

Failure modes: `BuildError` (binaries), `ComponentError` (a component exits or is not ready in time; names the
component, its log and the log's last lines), `ClusterError` (name taken, unknown cluster).

Simulation helpers for tests (`cordon_node`, `taint_node`, `set_node_ready`, `volume_path`) change what the
fake nodes and volumes report; docs/devcluster.md describes each simulated behaviour and its knobs.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict

from agent_sandbox.devcluster import processes
from agent_sandbox.devcluster.allocation import PORT_NAMES, allocation_lock, free_port
from agent_sandbox.devcluster.binaries import KUBERNETES_VERSION, Binaries, cache_root, ensure_binaries
from agent_sandbox.devcluster.config import ClusterConfig
from agent_sandbox.devcluster.node_controls import ClusterControls
from agent_sandbox.devcluster.runner_client import RunnerClient
from agent_sandbox.devcluster.startup import RUNNER, ClusterStartup
from agent_sandbox.devcluster.state import ClusterError, ClusterState, clusters_root
from agent_sandbox.invocation import cli_command


def down_command(name: str) -> str:
    """The shell command that stops the cluster `name` of this process's cache root.

    A cluster under another root than the default (the benchmarks keep theirs under `<cache>/bench/`, tests
    under their own) is invisible to a plain `agent-sandbox dev down`, which would answer "no dev cluster
    named ..." and leave it running: the command then carries the root.
    """
    root = os.environ.get("AGENT_SANDBOX_CACHE")
    prefix = f"AGENT_SANDBOX_CACHE={shlex.quote(root)} " if root else ""
    return f"{prefix}{cli_command(f'dev down --name {shlex.quote(name)}')}"


class DevCluster(ClusterStartup, ClusterControls, RunnerClient):
    """Handle to one local control plane (running or not). Use `up()`, `load()`, `down()`."""

    # -- lifecycle ------------------------------------------------------------------------------------
    @classmethod
    def load(cls, name: str) -> DevCluster | None:
        """The recorded cluster `name`, or None when there is none."""
        path = clusters_root() / name / "state.json"
        try:
            return cls(ClusterState(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            return None

    @classmethod
    def list(cls) -> list[DevCluster]:
        root = clusters_root()
        if not root.is_dir():
            return []
        found = (cls.load(p.name) for p in sorted(root.iterdir()) if p.is_dir())
        return [c for c in found if c is not None]

    @classmethod
    def up(cls, config: ClusterConfig, *, log: Callable[[str], None] | None = None) -> DevCluster:
        """Build (if needed) and start a cluster; return once nodes are Ready and `default` SA exists.

        Raises:
            ClusterError: a live cluster with that name exists.
            BuildError, ComponentError: see the module docstring. A failed start leaves nothing running.
        """
        say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        existing = cls.load(config.name)
        if existing is not None:
            if any(existing.running().values()):
                raise ClusterError(
                    f"cluster {config.name!r} is already running (kubeconfig {existing.kubeconfig}); "
                    f"run `{down_command(config.name)}` first"
                )
            existing.down(quiet=True)
        bins = ensure_binaries()
        cluster = cls._allocate(config, bins)
        t0 = time.monotonic()
        try:
            cluster._start_all(config, say)
        except BaseException:
            cluster.down(quiet=True, keep_logs=True)
            raise
        say(f"cluster {config.name!r} ready in {time.monotonic() - t0:.1f}s")
        return cluster

    @classmethod
    def _allocate(cls, config: ClusterConfig, bins: Binaries) -> DevCluster:
        with allocation_lock():
            others = [c for c in cls.list() if c.name != config.name]
            taken = {p for c in others for p in (*c.state.ports.values(), *c.state.extra_ports.values())}
            used_octets = {int(c.state.pod_cidr.split(".")[1]) for c in others}
            octet = next(o for o in range(10, 250) if o not in used_octets)
            directory = clusters_root() / config.name
            shutil.rmtree(directory, ignore_errors=True)
            (directory / "logs").mkdir(parents=True)
            ports = {name: free_port(taken) for name in PORT_NAMES}
            server = f"https://127.0.0.1:{ports['apiserver']}"
            state = ClusterState(
                name=config.name,
                directory=str(directory),
                binaries=str(bins.directory),
                ports=ports,
                pod_cidr=f"127.{octet}.0.0/16",
                kubeconfig=str(directory / "kubeconfig"),
                server=server,
                nodes=[f"kwok-node-{i}" for i in range(config.nodes)],
                started_at=time.time(),
                config=asdict(config),
            )
            cluster = cls(state)
            cluster._save()
            return cluster

    def reserve_port(self, name: str) -> int:
        """A free loopback port recorded in this cluster's state (so parallel clusters never share it)."""
        with allocation_lock():
            taken = {
                p for c in DevCluster.list() for p in (*c.state.ports.values(), *c.state.extra_ports.values())
            }
            port = free_port(taken)
            self.state.extra_ports[name] = port
            self._save()
        return port

    def down(self, *, quiet: bool = False, keep_logs: bool = False) -> None:
        """Stop every recorded process (reverse start order) and remove the cluster directory.

        With `keep_logs` the logs are copied to `<cache>/failed/<name>-<time>/` first (a failed start, or a test
        session with failures).
        """
        for started in reversed(self.state.started):
            processes.stop(started)
        if keep_logs and self.logs.is_dir():
            dest = cache_root() / "failed" / f"{self.name}-{int(time.time())}"
            shutil.copytree(self.logs, dest, dirs_exist_ok=True)
            if not quiet:
                print(f"cluster {self.name}: logs kept in {dest}", file=sys.stderr)
        shutil.rmtree(self.directory, ignore_errors=True)

    def describe(self) -> str:
        alive = self.running()
        lines = [
            f"cluster {self.name}: Kubernetes v{KUBERNETES_VERSION}, server {self.server}",
            f"  kubeconfig: {self.kubeconfig}",
            f"  pod CIDR:   {self.state.pod_cidr}   nodes: {', '.join(self.state.nodes)}",
            f"  logs:       {self.logs}",
        ]
        for s in self.state.started:
            lines.append(f"  {s.name:<24} pid {s.pid:<8} {'running' if alive.get(s.name) else 'STOPPED'}")
        if alive.get(RUNNER):
            lines.extend(self._describe_runtimes())
        return "\n".join(lines)
