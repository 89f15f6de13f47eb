"""One local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, and the
host-side volume provisioner.

Owns: the cluster directory (`<cache>/clusters/<name>/`: pki, kubeconfigs, data, logs, `state.json`), port and
pod-CIDR allocation, start-up order with readiness bounds, and `down` (stops exactly the PIDs recorded in
`state.json`, then removes the directory). Several clusters run side by side: allocation happens under a file
lock and skips every port and CIDR recorded by other live clusters.

Failure modes: `BuildError` (binaries), `ComponentError` (a component exits or is not ready in time; names the
component, its log and the log's last lines), `ClusterError` (name taken, unknown cluster).

Simulation helpers for tests (`cordon_node`, `taint_node`, `set_node_ready`, `volume_path`) change what the
fake nodes and volumes report; docs/devcluster.md describes each simulated behaviour and its knobs.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from agent_sandbox.devcluster import components, processes
from agent_sandbox.devcluster.binaries import KUBERNETES_VERSION, Binaries, cache_root, ensure_binaries
from agent_sandbox.devcluster.certs import write_cluster_pki
from agent_sandbox.devcluster.config import (
    NOT_READY_LABEL,
    SERVICE_IP,
    ClusterConfig,
    audit_policy_yaml,
    kubeconfig_yaml,
    kwok_stages_yaml,
    node_manifest,
    provisioner_binding_manifest,
    scheduler_config_yaml,
    storage_class_manifests,
)
from agent_sandbox.devcluster.processes import ComponentError, Started, component_error
from agent_sandbox.devcluster.provisioner import volume_host_path
from agent_sandbox.devcluster.rest import AdminRest, probe_http
from agent_sandbox.devcluster.simulation import pod_readiness_status, ready_status, with_taint, without_taint

_PORT_NAMES = ("etcd_client", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok", "runner")
PROVISIONER = "volume-provisioner"
_PROVISIONER_MODULE = "agent_sandbox.devcluster.provisioner"
SERVICE_PROXY = "service-proxy"
_SERVICE_PROXY_MODULE = "agent_sandbox.devcluster.serviceproxy"
RUNNER = "runner"
_RUNNER_MODULE = "agent_sandbox.devcluster.runner"


class ClusterError(RuntimeError):
    """Misuse of the dev cluster commands (name already running, unknown name)."""


def clusters_root() -> Path:
    return cache_root() / "clusters"


@contextlib.contextmanager
def _allocation_lock() -> Iterator[None]:
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


def _free_port(taken: set[int]) -> int:
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


class DevCluster:
    """Handle to one local control plane (running or not). Use `up()`, `load()`, `down()`."""

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
        return ClusterConfig(**{k: v for k, v in self.state.config.items() if k in known})

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log (JSON lines; written only with `ClusterConfig.audit_log`)."""
        return self.logs / components.AUDIT_LOG

    @property
    def volumes(self) -> Path:
        """Directory holding one sub-directory per provisioned PersistentVolume."""
        return self.directory / "volumes"

    def admin(self) -> AdminRest:
        pki = self.directory / "pki"
        return AdminRest(self.server, pki / "ca.crt", pki / "admin.crt", pki / "admin.key")

    def _save(self) -> None:
        path = self.directory / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self.state), indent=2))
        tmp.replace(path)

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

    def running(self) -> dict[str, bool]:
        """Component name -> whether its recorded PID is still our process."""
        return {s.name: processes.is_ours(s.pid, s.exe) for s in self.state.started}

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
                    f"run `agent-sandbox dev down --name {config.name}` first"
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
        with _allocation_lock():
            others = [c for c in cls.list() if c.name != config.name]
            taken = {p for c in others for p in (*c.state.ports.values(), *c.state.extra_ports.values())}
            used_octets = {int(c.state.pod_cidr.split(".")[1]) for c in others}
            octet = next(o for o in range(10, 250) if o not in used_octets)
            directory = clusters_root() / config.name
            shutil.rmtree(directory, ignore_errors=True)
            (directory / "logs").mkdir(parents=True)
            ports = {name: _free_port(taken) for name in _PORT_NAMES}
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

    def _wait(self, started: Started, what: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            if not processes.is_ours(started.pid, started.exe):
                raise component_error(started.name, started.log, f"exited before {what}")
            time.sleep(0.1)
        raise component_error(started.name, started.log, f"not {what} within {timeout:.0f}s")

    def _start_all(self, cfg: ClusterConfig, say: Callable[[str], None]) -> None:
        d, p = self.directory, self.state.ports
        pki = write_cluster_pki(d / "pki", service_ip=SERVICE_IP)
        for user, pair in (
            ("admin", pki.admin),
            ("controller-manager", pki.controller_manager),
            ("scheduler", pki.scheduler),
            ("kwok", pki.kwok),
            (PROVISIONER, pki.provisioner),
        ):
            path = d / ("kubeconfig" if user == "admin" else f"{user}.kubeconfig")
            path.write_text(
                kubeconfig_yaml(
                    name=f"agent-sandbox-{self.name}",
                    server=self.server,
                    ca=pki.ca.cert,
                    cert=pair.cert,
                    key=pair.key,
                    user=user,
                )
            )
        (d / "scheduler-config.yaml").write_text(scheduler_config_yaml(d / "scheduler.kubeconfig", cfg))
        (d / "kwok-stages.yaml").write_text(kwok_stages_yaml(cfg))
        if cfg.audit_log:
            (d / components.AUDIT_POLICY).write_text(audit_policy_yaml(bodies=cfg.audit_bodies))
        lay = components.Layout(d, p, self.binaries, pki, self.state.pod_cidr)

        say(f"[{self.name}] starting etcd")
        etcd = self._spawn("etcd", components.etcd_argv(lay, cfg))
        self._wait(
            etcd,
            "healthy",
            lambda: probe_http(f"http://127.0.0.1:{p['etcd_client']}/health"),
            cfg.ready_timeout,
        )

        if cfg.service_proxy:
            self._start_service_proxy(cfg)
        say(f"[{self.name}] starting kube-apiserver")
        apiserver = self._spawn("kube-apiserver", components.apiserver_argv(lay, cfg))
        # Started now so its Python start-up overlaps the apiserver's; it retries until the API (and its
        # RBAC binding, created below) answer.
        provisioner_ready = d / "volume-provisioner.ready"
        provisioner = self._spawn(
            PROVISIONER,
            [
                sys.executable,
                "-m",
                _PROVISIONER_MODULE,
                f"--kubeconfig={d / 'volume-provisioner.kubeconfig'}",
                f"--root={self.volumes}",
                f"--ready-file={provisioner_ready}",
            ],
            identity=_PROVISIONER_MODULE,
        )
        runner_ready = d / "runner.ready"
        runner = None
        if cfg.runner:  # also started early: its imports (aiohttp, grpc) overlap the API server's start
            runner = self._spawn(
                RUNNER,
                [
                    sys.executable,
                    "-m",
                    _RUNNER_MODULE,
                    f"--kubeconfig={self.kubeconfig}",
                    f"--workspaces={self.workspaces}",
                    f"--control-port={p['runner']}",
                    f"--ready-file={runner_ready}",
                ],
                identity=_RUNNER_MODULE,
            )
        admin = self.admin()
        self._wait(
            apiserver,
            "ready (/readyz)",
            lambda: admin.request("GET", "/readyz", timeout=3)[0] == 200,
            cfg.ready_timeout,
        )
        self._create_storage(cfg)

        say(f"[{self.name}] starting kube-controller-manager, kube-scheduler, kwok")
        kcm = self._spawn("kube-controller-manager", components.controller_manager_argv(lay, cfg))
        sched = self._spawn("kube-scheduler", components.scheduler_argv(lay))
        kwok = self._spawn("kwok", components.kwok_argv(lay))
        self._wait(
            kcm,
            "healthy (/healthz)",
            lambda: probe_http(f"https://127.0.0.1:{p['controller_manager']}/healthz"),
            cfg.ready_timeout,
        )
        self._wait(
            sched,
            "healthy (/healthz)",
            lambda: probe_http(f"https://127.0.0.1:{p['scheduler']}/healthz"),
            cfg.ready_timeout,
        )
        self._create_nodes(cfg)
        self._wait(kwok, f"managing {cfg.nodes} Ready node(s)", self._nodes_ready, cfg.ready_timeout)
        self._wait(provisioner, "watching volumes", provisioner_ready.exists, cfg.ready_timeout)
        if runner is not None:
            self._wait(runner, "watching pods", runner_ready.exists, cfg.ready_timeout)
        self._wait(
            kcm,
            "creating the default ServiceAccount",
            lambda: admin.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
            cfg.ready_timeout,
        )

    def _start_service_proxy(self, cfg: ClusterConfig) -> None:
        """The API server's route to Services (serviceproxy.py); it must listen before the API server starts."""
        d = self.directory
        socket_path, ready = d / components.SERVICE_PROXY_SOCKET, d / "service-proxy.ready"
        (d / components.EGRESS_CONFIG).write_text(components.egress_selector_yaml(socket_path))
        proxy = self._spawn(
            SERVICE_PROXY,
            [
                sys.executable,
                "-m",
                _SERVICE_PROXY_MODULE,
                f"--kubeconfig={self.kubeconfig}",
                f"--socket={socket_path}",
                f"--ready-file={ready}",
            ],
            identity=_SERVICE_PROXY_MODULE,
        )
        self._wait(proxy, "listening", ready.exists, cfg.ready_timeout)

    def _create_storage(self, cfg: ClusterConfig) -> None:
        """StorageClasses and the provisioner's RBAC, before the PV controller and scheduler start."""
        admin = self.admin()
        for path, obj in (
            *(("/apis/storage.k8s.io/v1/storageclasses", sc) for sc in storage_class_manifests(cfg)),
            ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", provisioner_binding_manifest()),
        ):
            status, body = admin.request("POST", path, obj)
            if status not in (201, 409):
                raise ComponentError(f"creating {path} failed: HTTP {status}: {body}")

    def _create_nodes(self, cfg: ClusterConfig) -> None:
        admin = self.admin()
        for node in self.state.nodes:
            status, body = admin.request("POST", "/api/v1/nodes", node_manifest(node, cfg))
            if status not in (201, 409):
                raise ComponentError(f"creating node {node} failed: HTTP {status}: {body}")

    def _nodes_ready(self) -> bool:
        status, body = self.admin().request("GET", "/api/v1/nodes", timeout=5)
        if status != 200:
            return False
        ready = 0
        for item in body.get("items", []):
            conds = {c["type"]: c["status"] for c in item.get("status", {}).get("conditions", [])}
            ready += conds.get("Ready") == "True"
        return ready >= len(self.state.nodes)

    def add_process(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None) -> Started:
        """Start an extra process owned by this cluster (e.g. the controller); `down` stops it."""
        return self._spawn(name, argv, env=env)

    def reserve_port(self, name: str) -> int:
        """A free loopback port recorded in this cluster's state (so parallel clusters never share it)."""
        with _allocation_lock():
            taken = {
                p for c in DevCluster.list() for p in (*c.state.ports.values(), *c.state.extra_ports.values())
            }
            port = _free_port(taken)
            self.state.extra_ports[name] = port
            self._save()
        return port

    # -- simulations (docs/devcluster.md) -----------------------------------------------------------------
    def _patch_guarded(
        self,
        path: str,
        what: str,
        change: Callable[[dict[str, Any]], dict[str, Any] | None],
        *,
        subresource: str = "",
    ) -> Any:
        """Merge-patch the object at `path` with `change(object)` under optimistic concurrency.

        `change` returns the patch (None: nothing to do); the object's resourceVersion guards it and
        conflicts are retried, so a concurrent writer (the node lifecycle controller adds taints too, kwok
        writes pod status) is never overwritten.
        """
        admin = self.admin()
        for _ in range(50):
            status, obj = admin.request("GET", path)
            if status != 200:
                raise ClusterError(f"{what}: HTTP {status}: {obj}")
            patch = change(obj)
            if patch is None:
                return obj
            patch.setdefault("metadata", {})["resourceVersion"] = obj["metadata"]["resourceVersion"]
            status, body = admin.request("PATCH", f"{path}/{subresource}" if subresource else path, patch)
            if status == 200:
                return body
            if status != 409:
                raise ClusterError(f"patching {what} failed: HTTP {status}: {body}")
        raise ClusterError(f"{what} kept changing; gave up after 50 conflicts")

    def _update_node(self, name: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> Any:
        """Merge-patch node `name` with `change(node)` (see `_patch_guarded`)."""
        return self._patch_guarded(f"/api/v1/nodes/{name}", f"node {name!r}", change)

    def add_node(self, name: str, *, timeout: float = 30.0) -> None:
        """Create one more kwok-managed node (capacity from the cluster's config) and wait until it is Ready.

        Not recorded in the state (`dev down` needs nothing: the node lives in etcd). Remove it with
        `delete_node`.
        """
        status, body = self.admin().request("POST", "/api/v1/nodes", node_manifest(name, self.config))
        if status != 201:
            raise ClusterError(f"creating node {name!r} failed: HTTP {status}: {body}")
        self._wait_ready(name, "True", timeout)

    def delete_node(self, name: str) -> None:
        """Delete a node (e.g. one made by `add_node`); pods bound to it are left to the pod GC."""
        status, body = self.admin().request("DELETE", f"/api/v1/nodes/{name}")
        if status not in (200, 404):
            raise ClusterError(f"deleting node {name!r} failed: HTTP {status}: {body}")

    def _wait_ready(self, name: str, want: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, node = self.admin().request("GET", f"/api/v1/nodes/{name}")
            if status == 200 and ready_status(node) == want:
                return
            time.sleep(0.1)
        raise ClusterError(f"node {name!r} did not report Ready={want} within {timeout:.0f}s")

    def cordon_node(self, name: str, cordoned: bool = True) -> None:
        """Mark the node unschedulable (`kubectl cordon`) or schedulable again (`cordoned=False`)."""
        self._update_node(name, lambda _: {"spec": {"unschedulable": True if cordoned else None}})

    def taint_node(self, name: str, key: str, value: str = "", effect: str = "NoSchedule") -> None:
        """Add (or replace) the taint key=value:effect on the node."""
        self._update_node(
            name,
            lambda node: {
                "spec": {"taints": with_taint(node.get("spec", {}).get("taints") or [], key, value, effect)}
            },
        )

    def untaint_node(self, name: str, key: str, effect: str | None = None) -> None:
        """Remove the node's taints with `key` (only those with `effect`, when given)."""

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            taints = node.get("spec", {}).get("taints") or []
            kept = without_taint(taints, key, effect)
            return None if len(kept) == len(taints) else {"spec": {"taints": kept or None}}

        self._update_node(name, change)

    def set_node_ready(self, name: str, ready: bool, *, wait: bool = True, timeout: float = 30.0) -> None:
        """Simulate a node failure (`ready=False`) or recovery; waits until the Ready condition agrees.

        NotReady is the node label `devcluster.agents.x-k8s.io/not-ready`: kwok's heartbeat skips labelled
        nodes and a stage writes Ready=False, so it sticks until `set_node_ready(name, True)`.
        """
        self._update_node(
            name, lambda _: {"metadata": {"labels": {NOT_READY_LABEL: None if ready else "true"}}}
        )
        if wait:
            self._wait_ready(name, "True" if ready else "False", timeout)

    def set_pod_ready(self, namespace: str, name: str, ready: bool) -> dict[str, Any]:
        """Report a Running pod's containers ready (or not), as a kubelet does when a readiness probe flips.

        For pods whose readiness kwok leaves alone (annotation `devcluster.agents.x-k8s.io/readiness:
        external`, see docs/devcluster.md "Pod start"): e.g. a local runner calls this once the pod's
        server answers. The status write is guarded by the pod's resourceVersion (conflicts are retried).

        Raises:
            ClusterError: no such pod, it is not Running, or the API refused the write.
        """

        def readiness(pod: dict[str, Any]) -> dict[str, Any]:
            try:
                return {"status": pod_readiness_status(pod, ready)}
            except ValueError as exc:
                raise ClusterError(str(exc)) from None

        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        result: dict[str, Any] = self._patch_guarded(
            path, f"pod {namespace}/{name}", readiness, subresource="status"
        )
        return result

    def volume_path(self, namespace: str, claim: str) -> Path | None:
        """Host directory backing the PVC `namespace/claim`, None while it is unbound."""
        admin = self.admin()
        status, pvc = admin.request("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        volume = pvc.get("spec", {}).get("volumeName") if status == 200 else None
        if not volume:
            return None
        status, pv = admin.request("GET", f"/api/v1/persistentvolumes/{volume}")
        if status != 200:
            return None
        raw = volume_host_path(pv)
        return Path(raw) if raw else None

    # -- local runner (docs/devcluster.md "Local runner") --------------------------------------------------
    @property
    def workspaces(self) -> Path:
        """Where the runner keeps per-pod workspaces (pods without a PVC at their workspace path)."""
        return self.directory / "runtimes"

    def _runner_call(self, method: str, path: str) -> tuple[int, Any]:
        if not self.config.runner or "runner" not in self.state.ports:
            raise ClusterError(f"cluster {self.name!r} runs no local runner")
        req = urllib.request.Request(f"http://127.0.0.1:{self.state.ports['runner']}{path}", method=method)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def runtimes(self) -> builtins.list[dict[str, Any]]:
        """The runner's runtimes: namespace, pod, uid, ip, state, ready, restarts, workspace, claim, ports."""
        status, body = self._runner_call("GET", "/runtimes")
        if status != 200:
            raise ClusterError(f"runner answered {status}: {body}")
        return list(body)

    def crash_runtime(self, namespace: str, pod: str) -> dict[str, Any]:
        """Kill a pod's runtime as a dying container would: the pod turns NotReady, then Ready again."""
        status, body = self._runner_call("POST", f"/runtimes/{namespace}/{pod}/crash")
        if status != 200:
            raise ClusterError(f"cannot crash the runtime of {namespace}/{pod}: {body}")
        return dict(body)

    def down(self, *, quiet: bool = False, keep_logs: bool = False) -> None:
        """Stop every recorded process (reverse start order) and remove the cluster directory.

        With `keep_logs` the logs are copied to `<cache>/failed/<name>-<time>/` first (failed start-ups).
        """
        for started in reversed(self.state.started):
            processes.stop(started)
        if keep_logs and self.logs.is_dir():
            dest = cache_root() / "failed" / f"{self.name}-{int(time.time())}"
            shutil.copytree(self.logs, dest, dirs_exist_ok=True)
            if not quiet:
                print(f"logs of the failed start kept in {dest}", file=sys.stderr)
        shutil.rmtree(self.directory, ignore_errors=True)

    def memory(self) -> dict[str, int]:
        """RSS in bytes of each live component."""
        return {
            s.name: processes.rss_bytes(s.pid) for s in self.state.started if processes.is_ours(s.pid, s.exe)
        }

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

    def _describe_runtimes(self) -> builtins.list[str]:
        try:
            runtimes = self.runtimes()
        except (ClusterError, OSError, ValueError) as err:
            return [f"  runtimes: runner not answering ({err})"]
        lines = [f"  runtimes:   {len(runtimes)} (local runner, control port {self.state.ports['runner']})"]
        for rt in sorted(runtimes, key=lambda r: (r["namespace"], r["pod"])):
            where = f"claim {rt['claim']}" if rt["claim"] else "per-pod dir"
            lines.append(
                f"    {rt['namespace']}/{rt['pod']:<32} {rt['ip']:<15} {rt['state']:<11} "
                f"restarts {rt['restarts']}  processes {rt['processes']}  {where}"
            )
        return lines
