"""Bringing a freshly allocated dev cluster up: its files, its processes in order, and the bootstrap objects.

Owns: writing the cluster's PKI, kubeconfigs and component config files; the start-up order (etcd, the
optional service proxy, kube-apiserver with the volume provisioner and the local runner started early,
then kube-controller-manager, kube-scheduler and kwok) with a readiness bound for each; and the
cluster-scoped objects created on the way (StorageClasses, the provisioner's RBAC binding, the kwok nodes).
The components' flags live in components.py, the rendered files in config.py; `DevCluster.up` (cluster.py)
allocates the cluster and calls `_start_all`.

Failure modes: `ComponentError` (a component exits or is not ready in time; names the component, its log
and the log's last lines; a bootstrap object the API refuses).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from importlib import resources

import yaml

from agent_sandbox.devcluster import components, processes
from agent_sandbox.devcluster.certs import ClusterPki, write_cluster_pki
from agent_sandbox.devcluster.config import (
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
from agent_sandbox.devcluster.rest import CRDS, probe_http
from agent_sandbox.devcluster.state import ClusterHandle

PROVISIONER = "volume-provisioner"
_PROVISIONER_MODULE = "agent_sandbox.devcluster.provisioner"
SERVICE_PROXY = "service-proxy"
_SERVICE_PROXY_MODULE = "agent_sandbox.devcluster.serviceproxy"
RUNNER = "runner"
_RUNNER_MODULE = "agent_sandbox.devcluster.runner"


class ClusterStartup(ClusterHandle):
    """The start-up sequence of `DevCluster.up` (a base of `DevCluster`)."""

    def _wait(self, started: Started, what: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            if not processes.is_ours(started.pid, started.exe):
                raise component_error(started.name, started.log, f"exited before {what}")
            time.sleep(0.1)
        raise component_error(started.name, started.log, f"not {what} within {timeout:.0f}s")

    def _write_files(self, cfg: ClusterConfig) -> ClusterPki:
        """The PKI, one kubeconfig per client identity, and the components' config files."""
        d = self.directory
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
        return pki

    def _start_all(self, cfg: ClusterConfig, say: Callable[[str], None]) -> None:
        d, p = self.directory, self.state.ports
        pki = self._write_files(cfg)
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
                    f"--pod-logs={self.pod_logs}",
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
        self._create_kwok_crds(cfg)

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

    def _create_kwok_crds(self, cfg: ClusterConfig) -> None:
        """kwok's CRDs that `kwok_argv` enables (`--enable-crds`), Established before kwok lists them."""
        admin = self.admin()
        crd_dir, names = resources.files("agent_sandbox.devcluster") / "kwok-crds", []
        for entry in sorted(crd_dir.iterdir(), key=lambda e: e.name):
            if not entry.name.endswith(".yaml"):
                continue
            crd = yaml.safe_load(entry.read_text())
            status, body = admin.request("POST", CRDS, crd)
            if status not in (201, 409):
                raise ComponentError(f"creating CRD {crd['metadata']['name']} failed: HTTP {status}: {body}")
            names.append(crd["metadata"]["name"])
        try:
            admin.wait_crds_established(names, timeout=cfg.ready_timeout)
        except TimeoutError as err:
            raise ComponentError(str(err)) from err

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
