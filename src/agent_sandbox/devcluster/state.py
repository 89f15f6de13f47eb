"""What a dev cluster records in `state.json`, and the handle that reads and extends that record.

Owns: `ClusterState` (ports, pod CIDR, kubeconfig, nodes, the processes started for the cluster, the
`ClusterConfig` it was started with), where clusters live (`clusters_root`), the paths and admin clients
derived from a state, and recording each process started for the cluster (`add_process`, `respawn`) so
`down` can later stop exactly those PIDs. `ClusterHandle` is the base `DevCluster` (cluster.py) is built
on; the start-up sequence (startup.py), the simulations (node_controls.py) and the runner's control calls
(runner_client.py) are written against it.

Failure modes: `ClusterError` (misuse: unknown process, still running, name taken, unknown cluster).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from agent_sandbox.devcluster import components, processes
from agent_sandbox.devcluster.binaries import Binaries, cache_root
from agent_sandbox.devcluster.config import ClusterConfig
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.devcluster.rest import AdminRest


class ClusterError(RuntimeError):
    """Misuse of the dev cluster commands (name already running, unknown name)."""


def clusters_root() -> Path:
    """Where each recorded cluster has its directory (`<cache>/clusters/<name>/`)."""
    return cache_root() / "clusters"


@dataclass
class ClusterState:
    """What `state.json` records: enough to reach, inspect and stop the cluster later."""

    name: str
    directory: str
    binaries: str
    ports: dict[str, int]
    pod_cidr: str
    kubeconfig: str
    server: str
    nodes: list[str]
    processes: list[dict[str, Any]] = field(default_factory=list)
    extra_ports: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0
    # The ClusterConfig the cluster was started with (knobs tests read back, e.g. the grace-period cap).
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def started(self) -> list[Started]:
        return [
            Started(name=p["name"], pid=p["pid"], exe=p["exe"], log=Path(p["log"])) for p in self.processes
        ]


class ClusterHandle:
    """One cluster's recorded state: its paths, admin clients and the processes started for it."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    # -- paths and accessors -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.state.name

    @property
    def directory(self) -> Path:
        return Path(self.state.directory)

    @property
    def kubeconfig(self) -> Path:
        return Path(self.state.kubeconfig)

    @property
    def server(self) -> str:
        return self.state.server

    @property
    def logs(self) -> Path:
        return self.directory / "logs"

    @property
    def pod_logs(self) -> Path:
        """The runtime pods' container logs the runner keeps (devcluster/kubelet_api.py)."""
        return self.logs / "pods"

    @property
    def binaries(self) -> Binaries:
        return Binaries(Path(self.state.binaries))

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run the cluster's own kubectl (same release as the apiserver) against it."""
        argv = [str(self.binaries.path("kubectl")), f"--kubeconfig={self.kubeconfig}", *args]
        out = subprocess.run(argv, input=input, capture_output=True, text=True, check=False)
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
        return out

    @property
    def config(self) -> ClusterConfig:
        """The configuration this cluster was started with (defaults for knobs an older state lacks)."""
        known = {f.name for f in fields(ClusterConfig)}
        # JSON has no tuples: a sequence knob comes back as a list.
        kept: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in self.state.config.items() if k in known
        }
        return ClusterConfig(**kept)

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log (JSON lines; written only with `ClusterConfig.audit_log`)."""
        return self.logs / components.AUDIT_LOG

    @property
    def volumes(self) -> Path:
        """Directory holding one sub-directory per provisioned PersistentVolume."""
        return self.directory / "volumes"

    @property
    def workspaces(self) -> Path:
        """Where the runner keeps per-pod workspaces (pods without a PVC at their workspace path)."""
        return self.directory / "runtimes"

    def admin(self) -> AdminRest:
        pki = self.directory / "pki"
        return AdminRest(self.server, pki / "ca.crt", pki / "admin.crt", pki / "admin.key")

    def _save(self) -> None:
        path = self.directory / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self.state), indent=2))
        tmp.replace(path)

    # -- recorded processes ---------------------------------------------------------------------------
    def running(self) -> dict[str, bool]:
        """Component name -> whether its recorded PID is still our process."""
        return {s.name: processes.is_ours(s.pid, s.exe) for s in self.state.started}

    def _spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        identity: str | None = None,
        env: dict[str, str] | None = None,
        replace: int | None = None,
    ) -> Started:
        """Start a process and record it (with its argv and env, so `respawn` can repeat it exactly).

        `replace`: the index of the recorded entry this process takes the place of (start order kept).
        """
        started = processes.spawn(
            name, argv, log=self.logs / f"{name}.log", env=env, cwd=self.directory, identity=identity
        )
        entry = {
            "name": started.name,
            "pid": started.pid,
            "exe": started.exe,
            "log": str(started.log),
            "argv": list(argv),
            "env": dict(env or {}),
        }
        if replace is None:
            self.state.processes.append(entry)
        else:
            self.state.processes[replace] = entry
        self._save()
        return started

    def respawn(self, name: str) -> Started:
        """Start the recorded process `name` again with the same argv and env (same ports, same data).

        The caller stops the old one first (`devcluster.faults.restart_component` does both and waits
        for readiness). The new PID takes the old entry's place, so `down` keeps the start order.

        Raises:
            ClusterError: no process of that name was recorded with its argv, or it is still running.
        """
        for index in range(len(self.state.processes) - 1, -1, -1):
            entry = self.state.processes[index]
            if entry["name"] != name:
                continue
            if "argv" not in entry:
                raise ClusterError(f"{name}: recorded without its argv (started by an older version)")
            if processes.is_ours(entry["pid"], entry["exe"]):
                raise ClusterError(f"{name} (pid {entry['pid']}) is still running; stop it first")
            return self._spawn(name, entry["argv"], identity=entry["exe"], env=entry["env"], replace=index)
        raise ClusterError(f"cluster {self.name!r} has no process {name!r}")

    def add_process(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None) -> Started:
        """Start an extra process owned by this cluster (e.g. the controller); `down` stops it."""
        return self._spawn(name, argv, env=env)

    def memory(self) -> dict[str, int]:
        """RSS in bytes of each live component."""
        return {
            s.name: processes.rss_bytes(s.pid) for s in self.state.started if processes.is_ours(s.pid, s.exe)
        }
