"""Fixtures for the install tests: a cluster of their own, the installed pods' processes, clean-up.

The install tests apply cluster-scoped objects with fixed names (ClusterRoles, CRDs pointed at a Service,
APF objects, Helm releases), so they get a separate dev cluster per worker (`install_cluster`, started on
first use) with `service_proxy` on: the API server reaches Services the way it does on a real node, so the
conversion webhook is used through its Service reference, as installed. `pods` runs the installed
controller pods as host processes (devcluster/podprocess.py); every test leaves the cluster uninstalled, its
CRDs as a fresh install leaves them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from agent_sandbox.api.constants import ALL_KINDS, WEBHOOK_PATH, WEBHOOK_SERVICE_NAME
from agent_sandbox.controllers.webhook.crds import KEPT_CAS
from agent_sandbox.devcluster import ClusterConfig, DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.identity import IDENTITY_ENV
from agent_sandbox.devcluster.install import helm
from agent_sandbox.devcluster.podprocess import PodProcesses
from agent_sandbox.devcluster.processes import Started, log_tail, stop
from agent_sandbox.manifests import REPO_ROOT
from tests.helpers import wait_for

SYSTEM_NS = "agent-sandbox-system"
RAW_SELECTOR = {"app": "agent-sandbox-controller"}
INSTALL_OBJECTS = (
    "clusterrolebinding/agent-sandbox-controller",
    "clusterrolebinding/agent-sandbox-controller-extensions",
    "clusterrole/agent-sandbox-controller",
    "clusterrole/agent-sandbox-controller-extensions",
    "clusterrolebinding/sandbox-router",
    "clusterrolebinding/sandbox-router-auth-delegator",
    "clusterrole/sandbox-router",
    "clusterrolebinding/agent-sandbox-controller-lifecycle",
    "clusterrole/agent-sandbox-controller-lifecycle",
    "clusterrolebinding/sandbox-router-lifecycle",
    "clusterrole/sandbox-router-lifecycle",
)


@pytest.fixture(scope="session")
def install_cluster() -> Iterator[DevCluster]:
    """This worker's install cluster (1 kwok node, service proxy on)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    started = DevCluster.up(ClusterConfig(name=f"pytest-{worker}-{os.getpid()}-install", service_proxy=True))
    try:
        yield started
    finally:
        if os.environ.get("AGENT_SANDBOX_KEEP_CLUSTER") != "1":
            started.down(quiet=True)


@dataclass
class Installed:
    """Helpers over one install cluster and its pod processes."""

    cluster: DevCluster
    pods: PodProcesses

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.cluster.kubectl(*args, "-o", "json", check=True).stdout)

    def controller_pods(
        self,
        selector: dict[str, str],
        *,
        count: int = 1,
        image: str | None = None,
        args: list[str] | None = None,
        namespace: str = SYSTEM_NS,
        timeout: float = 90.0,
    ) -> list[dict[str, Any]]:
        """Wait until exactly `count` pods of `selector` (of `image`, when given) run a process that passes
        the pod's readinessProbe, and no other pod of `selector` has one (a rollout has finished). `image` and
        `args` pick the pods of one Deployment revision: right after an apply the old pod is still the only
        ready one until the Deployment controller has started its replacement."""
        deadline = time.monotonic() + timeout
        while True:
            pods = [
                p for p in self.pods.sync(namespace, selector) if p["metadata"]["uid"] in self.pods.started
            ]
            for pod in pods:
                uid = pod["metadata"]["uid"]
                if not self.pods.alive(uid):
                    pytest.fail(f"pod {pod['metadata']['name']} exited:\n{log_tail(self.pods.log(uid), 40)}")
            ready = [
                p
                for p in pods
                if self.pods.ready(p["metadata"]["uid"])
                and (image is None or p["spec"]["containers"][0]["image"] == image)
                and (args is None or p["spec"]["containers"][0].get("args") == args)
            ]
            if len(ready) == count and len(pods) == count:
                return ready
            if time.monotonic() > deadline:
                tails = "\n".join(log_tail(self.pods.log(p["metadata"]["uid"]), 20) for p in pods)
                pytest.fail(f"{len(ready)}/{count} controller pods ready after {timeout:.0f}s:\n{tails}")
            time.sleep(0.3)

    def wait_conversion(self, namespace: str, timeout: float = 60.0) -> None:
        """Wait until a v1alpha1 write converts through the webhook (dry run: nothing is stored)."""
        probe = {
            "apiVersion": "agents.x-k8s.io/v1alpha1",
            "kind": "Sandbox",
            "metadata": {"name": "conversion-probe"},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
        }
        path = f"/apis/agents.x-k8s.io/v1alpha1/namespaces/{namespace}/sandboxes?dryRun=All"
        wait_for(
            lambda: self.cluster.admin().request("POST", path, probe)[0] == 201,
            timeout=timeout,
            what="v1alpha1 writes converted by the webhook through its Service",
        )

    def sandbox(self, namespace: str, name: str) -> dict[str, Any]:
        body = {
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}},
        }
        status, created = self.cluster.admin().request(
            "POST", f"/apis/agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxes", body
        )
        assert status == 201, created
        return self.wait_sandbox_ready(namespace, name)

    def wait_sandbox_ready(self, namespace: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
        path = f"/apis/agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxes/{name}"

        def ready() -> dict[str, Any] | None:
            status, sb = self.cluster.admin().request("GET", path)
            conds = {c["type"]: c["status"] for c in ((sb or {}).get("status") or {}).get("conditions") or ()}
            return sb if status == 200 and conds.get("Ready") == "True" else None

        result: dict[str, Any] = wait_for(ready, timeout=timeout, what=f"Sandbox {namespace}/{name} Ready")
        return result

    def pod_uid(self, namespace: str, name: str) -> str:
        status, pod = self.cluster.admin().request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        assert status == 200, pod
        uid: str = pod["metadata"]["uid"]
        return uid


def _reset_crds(cluster: DevCluster) -> None:
    """Point the CRDs' conversion webhook back at what `kubectl apply -k k8s/` leaves: the Service reference
    in the system namespace, no CA bundle, no `url`.

    A controller patches its CA (and, in dev mode, its URL) into the CRDs, and uninstalling leaves the CRDs
    (Helm never deletes crds/). Left as they were, the next install's controller would find that CA still
    valid and keep it after its own (it keeps up to KEPT_CAS, controllers/webhook/crds.py), and a dev-mode
    `url` would not merge with the installed `service`: each install test starts from a fresh install's CRDs.
    CRDs that do not exist (an earlier test deleted them) are skipped: the patch fails and nothing changes.
    """
    service = {"name": WEBHOOK_SERVICE_NAME, "namespace": SYSTEM_NS, "path": WEBHOOK_PATH, "port": 443}
    config = {"url": None, "caBundle": None, "service": service}
    patch = {"spec": {"conversion": {"webhook": {"clientConfig": config}}}}
    for kind in ALL_KINDS:
        cluster.kubectl("patch", "crd", kind.crd_name, "--type=merge", "-p", json.dumps(patch))


def _uninstall(cluster: DevCluster) -> None:
    """Remove whatever an install test left (releases, RBAC, the system namespace); CRDs stay, reset to a
    fresh install's conversion webhook config (`_reset_crds`) once no controller is left to patch them."""
    listed = helm(cluster, "list", "--all-namespaces", "-o", "json", check=False).stdout
    for release in json.loads(listed or "[]"):
        helm(
            cluster, "uninstall", release["name"], "--namespace", release["namespace"], "--wait", check=False
        )
    cluster.kubectl("delete", "--ignore-not-found", "--wait=false", *INSTALL_OBJECTS)
    cluster.kubectl("delete", "namespace", SYSTEM_NS, "--ignore-not-found", "--timeout=60s")
    _reset_crds(cluster)


def leads_with_ca(config: dict[str, Any], ca_pem: bytes) -> bool:
    """Whether a CRD's conversion webhook `clientConfig` trusts `ca_pem` as a controller leaves it: that CA's
    certificates first, then at most KEPT_CAS others (CAs the caBundle held that are still valid, which the
    controller keeps for replicas still serving a pair of theirs; controllers/webhook/crds.py). Compared as
    DER, so PEM formatting does not matter."""
    held = base64.b64decode(config.get("caBundle") or "")
    if not held:
        return False
    ders = _ders(held)
    first = _ders(ca_pem)
    return ders[: len(first)] == first and len(ders) - len(first) <= KEPT_CAS


def _ders(pem: bytes) -> list[bytes]:
    return [cert.public_bytes(Encoding.DER) for cert in x509.load_pem_x509_certificates(pem)]


@pytest.fixture
def installed(install_cluster: DevCluster) -> Iterator[Installed]:
    """The install cluster with an empty pod-process table; everything is uninstalled afterwards."""
    _uninstall(install_cluster)  # whatever an earlier test on this cluster left
    pods = PodProcesses(install_cluster)
    try:
        yield Installed(install_cluster, pods)
    finally:
        pods.stop_all()
        _uninstall(install_cluster)


@pytest.fixture
def install_ns(install_cluster: DevCluster) -> Iterator[str]:
    """A fresh namespace in the install cluster (its default ServiceAccount present)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    install_cluster.kubectl("create", "namespace", name, check=True)
    wait_for(
        lambda: install_cluster.kubectl("get", "serviceaccount", "default", "-n", name).returncode == 0,
        what=f"default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        install_cluster.kubectl("delete", "namespace", name, "--wait=false")


@contextlib.contextmanager
def sa_controller(cluster: DevCluster, *extra: str) -> Iterator[Started]:
    """A dev-mode controller (loopback listeners, webhook by URL) running as the installed ServiceAccount.

    Afterwards its RBAC and namespace are removed (a later Helm install must not meet objects it does not
    own) and the CRDs, which point at this controller's URL, are pointed back at the installed Service
    reference (`_uninstall`), so the next install's server-side apply does not meet a `url` it cannot merge
    with a `service`.
    """
    with pytest.MonkeyPatch.context() as env:
        env.setenv(IDENTITY_ENV, "serviceaccount")
        started = start_controller(cluster, extra=tuple(extra))
    try:
        yield started
    finally:
        stop(started)
        _uninstall(cluster)


def write_overlay(directory: Path, components: Sequence[str]) -> Path:
    """A user's kustomize overlay: the install (k8s/) plus components (paths relative to k8s/)."""
    directory.mkdir(parents=True, exist_ok=True)
    k8s = REPO_ROOT / "k8s"
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize refuses absolute roots: paths relative to the overlay, as a user's overlay has.
        "resources": [os.path.relpath(k8s, directory)],
        "components": [os.path.relpath(k8s / c, directory) for c in components],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory
