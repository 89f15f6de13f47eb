"""`kubectl apply -k k8s/` and the release assets, installed for real (operations §2-§4, §14.1-§14.4).

The controller runs from its installed Deployment: kwok gives the pod a 127.x IP and a stand-in kubelet
(devcluster/podprocess.py) runs `agent-sandbox-controller` with the pod's arguments and a token bound to
the pod, so the controller authenticates as the installed ServiceAccount under the installed RBAC, patches
the CRDs with the Service reference, and the API server converts through that Service.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from benchmarks import promtext
from cryptography import x509

from agent_sandbox.cli.main import main as cli_main
from agent_sandbox.devcluster import ensure_binaries
from agent_sandbox.devcluster.install import apply, kustomize
from agent_sandbox.manifests import REPO_ROOT, substitute_images
from tests.helpers import wait_for
from tests.integration.install.conftest import (
    RAW_SELECTOR,
    SYSTEM_NS,
    Installed,
    leads_with_ca,
    write_overlay,
)
from tests.integration.install.rbac import allowed

pytestmark = pytest.mark.integration

CRDS = (
    "sandboxes.agents.x-k8s.io",
    "sandboxclaims.extensions.agents.x-k8s.io",
    "sandboxtemplates.extensions.agents.x-k8s.io",
    "sandboxwarmpools.extensions.agents.x-k8s.io",
)
LEASE = "a3317529.agent-sandbox.x-k8s.io"


def _kubectl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """kubectl without a cluster (kustomize)."""
    out = subprocess.run([str(ensure_binaries().path("kubectl")), *args], capture_output=True, text=True)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def _ids(docs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) for d in docs]


def test_kustomize_renders_the_standard_install() -> None:
    docs = [d for d in yaml.safe_load_all(_kubectl("kustomize", str(REPO_ROOT / "k8s")).stdout) if d]
    ids = _ids(docs)
    assert len(ids) == len(set(ids)), "duplicate resource ids"
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert len(deployments) == 1
    # The kustomize patch and extensions.controller.yaml describe the same Deployment (upstream's invariant).
    assert deployments[0] == yaml.safe_load((REPO_ROOT / "k8s" / "extensions.controller.yaml").read_text())
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"} == set(CRDS)
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole") == [
        "agent-sandbox-controller",
        "agent-sandbox-controller-extensions",
    ]


def test_router_component_composes_with_the_install(tmp_path: Path) -> None:
    overlay = write_overlay(tmp_path / "overlay", ["router", "router/tokenreview"])
    docs = [d for d in yaml.safe_load_all(_kubectl("kustomize", str(overlay)).stdout) if d]
    (router,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "sandbox-router"]
    assert router["metadata"]["namespace"] == SYSTEM_NS
    # A request without a token is refused too (not the binary's transitional default: docs/router.md).
    assert router["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == [
        "--authz-mode=tokenreview",
        "--authz-tokenreview-require-token=true",
    ]
    assert ("ClusterRoleBinding", "", "sandbox-router-auth-delegator") in _ids(docs)
    assert len([d for d in docs if d["kind"] == "Deployment"]) == 2


def _router_args(docs: list[dict[str, Any]]) -> list[str]:
    (router,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "sandbox-router"]
    args: list[str] = router["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


@pytest.mark.parametrize(
    ("component", "flag"),
    [("router/tokenreview", "--authz-mode=tokenreview"), ("router/lifecycle", "--sandbox-lifecycle")],
)
def test_a_router_sub_component_before_the_router_fails_to_render(
    tmp_path: Path, component: str, flag: str
) -> None:
    """Listed before `k8s/router`, the sub-component's selector patch matched nothing and was skipped without
    a word: the render (and apply) succeeded with the RBAC added but no flag, so "tokenreview" ran with no
    authentication (inst12 finding 1). Its target-less guard patch now names the router Deployment, which
    kustomize refuses to apply when that Deployment does not exist yet."""
    wrong = _kubectl("kustomize", str(write_overlay(tmp_path / "wrong", [component, "router"])), check=False)
    assert wrong.returncode != 0, "rendered without the router Deployment's flag"
    assert "no matches for Id Deployment.v1.apps/sandbox-router.agent-sandbox-system" in wrong.stderr
    right = _kubectl("kustomize", str(write_overlay(tmp_path / "right", ["router", component])))
    assert flag in _router_args([d for d in yaml.safe_load_all(right.stdout) if d])


@pytest.mark.parametrize(
    ("component", "missing"),
    [
        ("lifecycle", "Deployment.v1.apps/agent-sandbox-controller.agent-sandbox-system"),
        ("v1beta1-only", "CustomResourceDefinition.v1.apiextensions.k8s.io/sandboxes.agents.x-k8s.io"),
    ],
)
def test_a_component_without_the_install_fails_to_render(
    tmp_path: Path, component: str, missing: str
) -> None:
    """The same guard on the components that patch the install (k8s/) itself: with an overlay whose resources
    do not include the install, the component is refused instead of adding its objects and nothing else."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "sa.yaml").write_text((REPO_ROOT / "k8s" / "router" / "serviceaccount.yaml").read_text())
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["sa.yaml"],
        "components": [os.path.relpath(REPO_ROOT / "k8s" / component, overlay)],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    out = _kubectl("kustomize", str(overlay), check=False)
    assert out.returncode != 0, f"{component} rendered without the object it patches"
    assert f"no matches for Id {missing}" in out.stderr


def _secret_bundle(installed: Installed) -> dict[str, bytes]:
    secret = installed.kubectl_json("get", "secret", "agent-sandbox-webhook-certs", "-n", SYSTEM_NS)
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def _whoami(installed: Installed, uid: str) -> dict[str, Any]:
    """What the API server authenticates the pod's process as (SelfSubjectReview with its kubeconfig)."""
    kubeconfig = next(a for a in _cmdline(installed, uid) if a.startswith("--kubeconfig=")).split("=", 1)[1]
    out = subprocess.run(
        [
            str(installed.cluster.binaries.path("kubectl")),
            f"--kubeconfig={kubeconfig}",
            "auth",
            "whoami",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    info: dict[str, Any] = json.loads(out.stdout)["status"]["userInfo"]
    return info


def _cmdline(installed: Installed, uid: str) -> list[str]:
    pid = installed.pods.started[uid].pid
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def test_kustomize_install_upgrade_and_uninstall(installed: Installed, install_ns: str) -> None:
    cluster = installed.cluster
    docs = kustomize(cluster, REPO_ROOT / "k8s")
    apply(cluster, docs)
    (pod,) = installed.controller_pods(RAW_SELECTOR)
    uid = pod["metadata"]["uid"]

    # The process runs the Deployment's arguments, as the installed ServiceAccount, bound to its pod.
    argv = _cmdline(installed, uid)
    script = next(i for i, a in enumerate(argv) if a.endswith("/agent-sandbox-controller"))
    assert argv[script + 1 : script + 3] == ["--leader-elect=true", "--extensions"]
    who = _whoami(installed, uid)
    assert who["username"] == "system:serviceaccount:agent-sandbox-system:agent-sandbox-controller"
    assert who["extra"]["authentication.kubernetes.io/pod-name"] == [pod["metadata"]["name"]]

    # Start-up contracts (operations §4): shared cert Secret, CRDs patched with the Service reference
    # and that CA, conversion served through the Service, the Lease held.
    installed.wait_conversion(install_ns)
    bundle = _secret_bundle(installed)
    assert set(bundle) == {"ca.crt", "tls.crt", "tls.key"}
    cert = x509.load_pem_x509_certificate(bundle["tls.crt"])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert "agent-sandbox-webhook-service.agent-sandbox-system.svc" in sans

    def patched(crd: str) -> dict[str, Any] | None:
        # The Secret's CA first; the controller may keep CAs the caBundle already held after it (KEPT_CAS).
        config: dict[str, Any] = installed.kubectl_json("get", "crd", crd)["spec"]["conversion"]["webhook"][
            "clientConfig"
        ]
        return config if leads_with_ca(config, bundle["ca.crt"]) else None

    for crd in CRDS:
        config = wait_for(lambda crd=crd: patched(crd), what=f"{crd} patched with the Secret's CA")
        assert config["service"] == {
            "name": "agent-sandbox-webhook-service",
            "namespace": SYSTEM_NS,
            "path": "/convert",
            "port": 443,
        }, crd
        assert "url" not in config
    lease = installed.kubectl_json("get", "lease", LEASE, "-n", SYSTEM_NS)
    assert lease["spec"]["holderIdentity"]
    # It leads through the namespaced Role; no other namespace's Leases (node heartbeats, the scheduler's and
    # controller-manager's leadership) are the controller's to write (tenant10 finding 4).
    leases = "coordination.k8s.io", "leases"
    assert allowed(cluster, (*leases, "update"), SYSTEM_NS, LEASE)
    assert not allowed(cluster, (*leases, "update"), SYSTEM_NS, "another-lease")
    for verb, lease_ns in (("update", "kube-system"), ("delete", "kube-node-lease"), ("create", install_ns)):
        assert not allowed(cluster, (*leases, verb), lease_ns, LEASE), (verb, lease_ns)

    # A workload, also readable as v1alpha1 (conversion through the Service).
    installed.sandbox(install_ns, "keep")
    keep_pod = installed.pod_uid(install_ns, "keep")
    alpha = installed.kubectl_json("get", "sandboxes.v1alpha1.agents.x-k8s.io", "keep", "-n", install_ns)
    assert alpha["apiVersion"] == "agents.x-k8s.io/v1alpha1"

    # Re-applying the same install changes nothing: same controller pod, same sandbox pod.
    apply(cluster, docs)
    assert [p["metadata"]["uid"] for p in installed.controller_pods(RAW_SELECTOR)] == [uid]
    assert installed.pod_uid(install_ns, "keep") == keep_pod

    # Upgrade to a new release (new image): the controller rolls, running sandboxes are untouched.
    upgraded = yaml.safe_load_all(
        substitute_images(yaml.safe_dump_all(docs), tag="v0.0.2-test", registry="example.com/agent-sandbox")
    )
    apply(cluster, [d for d in upgraded if d])
    image = "example.com/agent-sandbox/agent-sandbox-controller:v0.0.2-test"
    (new_pod,) = installed.controller_pods(RAW_SELECTOR, image=image)
    assert new_pod["metadata"]["uid"] != uid
    assert uid not in installed.pods.started  # the old pod's process was stopped
    installed.wait_sandbox_ready(install_ns, "keep")
    assert installed.pod_uid(install_ns, "keep") == keep_pod
    installed.sandbox(install_ns, "after-upgrade")

    # Uninstall (docs/install.md): nothing may still use the CRDs before they are deleted.
    in_use = installed.kubectl_json("get", "sandboxes.agents.x-k8s.io", "--all-namespaces")["items"]
    assert {s["metadata"]["name"] for s in in_use} == {"keep", "after-upgrade"}
    cluster.kubectl(
        "delete", "sandboxes.agents.x-k8s.io", "--all", "-n", install_ns, "--wait=true", check=True
    )
    out = cluster.kubectl(
        "delete",
        "-f",
        "-",
        "--wait=true",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
    )
    assert out.returncode == 0, out.stderr
    for crd in CRDS:
        assert cluster.kubectl("get", "crd", crd).returncode != 0
    wait_for(lambda: not installed.pods.sync(SYSTEM_NS, RAW_SELECTOR), what="controller pod gone")
    assert not installed.pods.started


def test_release_assets_install_in_order(installed: Installed, install_ns: str, tmp_path: Path) -> None:
    """sandbox.yaml then extensions.yaml (operations §3): the second Deployment wins, with --extensions."""
    assert cli_main(["release", "--tag", "v0.0.1-test", "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {
        "sandbox.yaml",
        "extensions.yaml",
        "sandbox-with-extensions.yaml",
        "sandbox-router.yaml",
    }
    cluster = installed.cluster
    # --force-conflicts as docs/install.md says for CRDs that already exist: the assets carry the CRDs, and on
    # this shared cluster an earlier test's controller (Helm, another namespace) may still own their
    # conversion webhook's service reference.
    for asset in ("sandbox.yaml", "extensions.yaml"):
        out = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tmp_path / asset))
        assert out.returncode == 0, f"{asset}: {out.stderr}"
    (pod,) = installed.controller_pods(RAW_SELECTOR, args=["--leader-elect=true", "--extensions"])
    container = pod["spec"]["containers"][0]
    assert container["image"] == "registry.k8s.io/agent-sandbox/agent-sandbox-controller:v0.0.1-test"
    installed.wait_conversion(install_ns)
    installed.sandbox(install_ns, "from-release")
    # The all-in-one asset describes the same installation: applying it over this one is a no-op rollout.
    out = cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(tmp_path / "sandbox-with-extensions.yaml")
    )
    assert out.returncode == 0, out.stderr
    assert [p["metadata"]["uid"] for p in installed.controller_pods(RAW_SELECTOR)] == [pod["metadata"]["uid"]]


def test_v1beta1_only_component_unserves_v1alpha1_and_changes_nothing_else(tmp_path: Path) -> None:
    overlay = write_overlay(tmp_path / "overlay", ["v1beta1-only"])
    docs = [d for d in yaml.safe_load_all(_kubectl("kustomize", str(overlay)).stdout) if d]
    standard = [d for d in yaml.safe_load_all(_kubectl("kustomize", str(REPO_ROOT / "k8s")).stdout) if d]
    crds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert set(crds) == set(CRDS)
    for crd in crds.values():
        versions = {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]}
        assert versions == {"v1beta1": (True, True), "v1alpha1": (False, False)}
        assert (
            crd["spec"]["conversion"]["strategy"] == "Webhook"
        )  # v1alpha1 objects stored earlier still read
    for crd in crds.values():  # only the served flag differs from the standard install
        crd["spec"]["versions"][1]["served"] = True
    assert sorted(docs, key=str) == sorted(standard, key=str)


def _conversions(installed: Installed) -> float:
    """How many objects kube-apiserver has sent through a CRD conversion webhook (all four CRDs)."""
    samples = promtext.parse(installed.cluster.admin().get_bytes("/metrics").decode())
    name = "apiserver_crd_conversion_webhook_duration_seconds_count"
    return sum(promtext.scalar(samples, name, crd_name=crd) or 0.0 for crd in CRDS)


def test_v1beta1_only_install_converts_nothing_on_writes(
    installed: Installed, install_ns: str, tmp_path: Path
) -> None:
    """With v1alpha1 served, kube-apiserver's v1alpha1 watch cache sends every stored change of a Sandbox
    through the webhook although no client asked for v1alpha1 (kubernetes/kubernetes#129979); with the
    component it sends none. Both halves are measured here, on the same Sandbox."""
    cluster, admin = installed.cluster, installed.cluster.admin()
    apply(cluster, kustomize(cluster, write_overlay(tmp_path / "overlay", ["v1beta1-only"])))
    installed.controller_pods(RAW_SELECTOR)
    alpha = f"/apis/agents.x-k8s.io/v1alpha1/namespaces/{install_ns}/sandboxes"
    beta = f"/apis/agents.x-k8s.io/v1beta1/namespaces/{install_ns}/sandboxes"
    wait_for(lambda: admin.request("GET", alpha)[0] == 404, what="v1alpha1 no longer served")

    def write_labels(value: str) -> None:
        for i in range(5):
            patch = {"metadata": {"labels": {"round": f"{value}-{i}"}}}
            status, body = admin.request("PATCH", f"{beta}/unserved", patch)
            assert status == 200, body

    before = _conversions(installed)
    installed.sandbox(install_ns, "unserved")  # create, pod-name annotation, status writes
    write_labels("a")
    time.sleep(2)  # a watch cache would have converted them by now (the other half shows it does)
    assert _conversions(installed) == before

    # The standard install serves v1alpha1 again: the same writes now go through the webhook.
    apply(cluster, kustomize(cluster, REPO_ROOT / "k8s"))
    installed.wait_conversion(install_ns)
    served = _conversions(installed)
    write_labels("b")
    wait_for(
        lambda: _conversions(installed) >= served + 5, what="the 5 writes converted for v1alpha1's cache"
    )
