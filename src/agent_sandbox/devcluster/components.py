"""Command lines of the control-plane components (etcd, kube-apiserver, controller-manager, scheduler, kwok).

Owns: the flags each component runs with, as pure functions of the cluster's layout and `ClusterConfig`.
Starting and waiting live in `startup.py`, stopping in `cluster.py`; the flags are kept here so they can be
read (and tested) in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent_sandbox.devcluster.binaries import Binaries
from agent_sandbox.devcluster.certs import ClusterPki
from agent_sandbox.devcluster.config import SERVICE_CIDR, ClusterConfig

# Written by DevCluster when `ClusterConfig.service_proxy` is on (see serviceproxy.py).
EGRESS_CONFIG = "egress-selector.yaml"
SERVICE_PROXY_SOCKET = "service-proxy.sock"
# Written by DevCluster when `ClusterConfig.audit_log` is on (config.audit_policy_yaml).
AUDIT_POLICY = "audit-policy.yaml"
AUDIT_LOG = "audit.log"


def egress_selector_yaml(socket_path: Path) -> str:
    """kube-apiserver's EgressSelectorConfiguration: the ``cluster`` network via this proxy."""
    return (
        "apiVersion: apiserver.k8s.io/v1beta1\n"
        "kind: EgressSelectorConfiguration\n"
        "egressSelections:\n"
        "- name: cluster\n"
        "  connection:\n"
        "    proxyProtocol: HTTPConnect\n"
        "    transport:\n"
        "      uds:\n"
        f"        udsName: {socket_path}\n"
    )


@dataclass(frozen=True, slots=True)
class Layout:
    """Where one cluster's files live and which loopback ports it owns."""

    directory: Path
    ports: dict[str, int]
    binaries: Binaries
    pki: ClusterPki
    pod_cidr: str


def etcd_argv(lay: Layout, cfg: ClusterConfig) -> list[str]:
    p = lay.ports
    argv = [
        str(lay.binaries.path("etcd")),
        "--name=default",
        f"--data-dir={lay.directory / 'etcd'}",
        f"--listen-client-urls=http://127.0.0.1:{p['etcd_client']}",
        f"--advertise-client-urls=http://127.0.0.1:{p['etcd_client']}",
        f"--listen-peer-urls=http://127.0.0.1:{p['etcd_peer']}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd_peer']}",
        f"--initial-cluster=default=http://127.0.0.1:{p['etcd_peer']}",
        "--listen-metrics-urls=",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]
    if cfg.etcd_unsafe_no_fsync:
        argv.append("--unsafe-no-fsync")
    return argv


def apiserver_argv(lay: Layout, cfg: ClusterConfig) -> list[str]:
    pki = lay.pki
    egress = [f"--egress-selector-config-file={lay.directory / EGRESS_CONFIG}"] if cfg.service_proxy else []
    audit = (
        [
            f"--audit-policy-file={lay.directory / AUDIT_POLICY}",
            f"--audit-log-path={lay.directory / 'logs' / AUDIT_LOG}",
            "--audit-log-format=json",
            # Blocking: an event is written before the response is sent, so none is ever dropped (batch
            # mode drops events when its buffer fills, which would make counts wrong).
            "--audit-log-mode=blocking",
            # Never rotate (the reader follows one file by byte offset). 0 does not mean "no limit": the
            # rotating writer reads 0 as its default, 100 MB, which a 500-claim trial passes.
            "--audit-log-maxsize=1000000",
        ]
        if cfg.audit_log
        else []
    )
    return [
        str(lay.binaries.path("kube-apiserver")),
        f"--etcd-servers=http://127.0.0.1:{lay.ports['etcd_client']}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={lay.ports['apiserver']}",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca.cert}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # The built-in reconciler would keep trying to write loopback Endpoints, which validation rejects.
        "--endpoint-reconciler-type=none",
        f"--max-requests-inflight={cfg.max_requests_inflight}",
        f"--max-mutating-requests-inflight={cfg.max_mutating_requests_inflight}",
        "--allow-privileged=true",
        # pods/log reaches the "kubelet" (kwok's server, below) at the node's InternalIP, 127.0.0.1; never a
        # name to resolve. No --kubelet-certificate-authority: kwok serves a self-signed certificate.
        "--kubelet-preferred-address-types=InternalIP",
        f"--profiling={str(cfg.apiserver_profiling).lower()}",
        *egress,
        *audit,
        "--v=1",
        *cfg.apiserver_extra_args,
    ]


def controller_manager_argv(lay: Layout, cfg: ClusterConfig) -> list[str]:
    kubeconfig = lay.directory / "controller-manager.kubeconfig"
    pki = lay.pki
    return [
        str(lay.binaries.path("kube-controller-manager")),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={lay.ports['controller_manager']}",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca.cert}",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        "--controllers=*",
        "--allocate-node-cidrs=false",
        f"--kube-api-qps={cfg.controller_manager_qps}",
        f"--kube-api-burst={cfg.controller_manager_burst}",
        "--concurrent-gc-syncs=20",
        "--v=1",
    ]


def scheduler_argv(lay: Layout) -> list[str]:
    kubeconfig = lay.directory / "scheduler.kubeconfig"
    return [
        str(lay.binaries.path("kube-scheduler")),
        # Client QPS/burst only apply through the config file (see config.scheduler_config_yaml).
        f"--config={lay.directory / 'scheduler-config.yaml'}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={lay.ports['scheduler']}",
        "--v=1",
    ]


def kwok_argv(lay: Layout) -> list[str]:
    return [
        str(lay.binaries.path("kwok")),
        f"--kubeconfig={lay.directory / 'kwok.kubeconfig'}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        f"--cidr={lay.pod_cidr}",
        "--node-ip=127.0.0.1",
        "--node-lease-duration-seconds=40",
        f"--server-address=127.0.0.1:{lay.ports['kwok']}",
        # The kubelet port its nodes report, so the API server's pods/log and pods/portforward reach the server
        # above; it serves what the runner's `Logs` and `PortForward` objects name (devcluster/kubelet_api.py;
        # CRDs in kwok-crds/).
        f"--node-port={lay.ports['kwok']}",
        "--enable-crds=Logs,PortForward",
        f"--config={lay.directory / 'kwok-stages.yaml'}",
    ]
