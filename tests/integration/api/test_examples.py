"""Every manifest under examples/ is accepted by a real API server (dry-run and real apply)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_sandbox.devcluster import DevCluster

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
FILES = sorted(EXAMPLES.rglob("*.yaml"))
# Deleted after the test (the APF overlay would otherwise reshape this cluster's API traffic, the spec guard
# refuse other tests' users).
CLUSTER_SCOPED = (
    "RuntimeClass",
    "FlowSchema",
    "PriorityLevelConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)


def test_examples_exist() -> None:
    assert len(FILES) >= 11


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(EXAMPLES)) for p in FILES])
def test_example_is_accepted(crds: DevCluster, namespace: str, path: Path) -> None:
    dry = crds.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path))
    assert dry.returncode == 0, dry.stderr
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    cluster_scoped = [d for d in docs if d["kind"] in CLUSTER_SCOPED]
    try:
        real = crds.kubectl("apply", "-n", namespace, "-f", str(path))
        assert real.returncode == 0, real.stderr
        for doc in docs:
            scope = [] if doc in cluster_scoped else ["-n", namespace]
            resource = f"{doc['kind'].lower()}.{doc['apiVersion'].rpartition('/')[0]}"
            got = crds.kubectl("get", resource, doc["metadata"]["name"], *scope, "-o", "json")
            assert got.returncode == 0, got.stderr
            stored = json.loads(got.stdout)
            sent = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
            assert _contains(sent, stored), doc["metadata"]["name"]
    finally:
        for doc in cluster_scoped:
            resource = f"{doc['kind'].lower()}.{doc['apiVersion'].rpartition('/')[0]}".rstrip(".")
            crds.kubectl("delete", resource, doc["metadata"]["name"], "--ignore-not-found")


def _contains(small: Any, big: Any) -> bool:
    """What we sent is what is stored (the server may only add defaults)."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and _contains(v, big[k]) for k, v in small.items())
    if isinstance(small, list):
        return isinstance(big, list) and len(small) == len(big) and all(map(_contains, small, big))
    return bool(small == big or str(small) == str(big))


def test_server_applies_schema_defaults(crds: DevCluster, namespace: str) -> None:
    """Defaults of api spec §11 and the embedded PodSpec (protocol TCP) are applied on write."""
    for sub in ("python-runtime-sandbox", "warmpool-quickstart", "sandbox-with-pvc"):
        out = crds.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / sub))
        assert out.returncode == 0, out.stderr

    def get(resource: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(crds.kubectl("get", resource, name, "-n", namespace, "-o", "json",
                                                      check=True).stdout)  # fmt: skip
        return obj

    sb = get("sandbox", "sandbox-python-example")["spec"]
    assert sb["operatingMode"] == "Running"
    assert sb["shutdownPolicy"] == "Retain"
    assert sb["podTemplate"]["spec"]["containers"][0]["ports"] == [{"containerPort": 8888, "protocol": "TCP"}]
    tmpl = get("sandboxtemplate", "python-runtime-template")["spec"]
    assert tmpl["networkPolicyManagement"] == "Managed"
    claim = get("sandboxclaim", "quickstart-claim")["spec"]
    assert claim["lifecycle"]["shutdownPolicy"] == "Delete"
    pool = get("swp", "python-warmpool")["spec"]
    assert pool["updateStrategy"] == {"type": "Recreate"}

    crds.kubectl("apply", "-n", namespace, "-f", "-", check=True, input=json.dumps({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
        "metadata": {"name": "defaults"},
        "spec": {"sandboxTemplateRef": {"name": "python-runtime-template"}, "updateStrategy": {}}}))  # fmt: skip
    assert get("swp", "defaults")["spec"] == {
        "replicas": 1, "sandboxTemplateRef": {"name": "python-runtime-template"}, "updateStrategy": {"type": "OnReplenish"}
    }  # fmt: skip
    crds.kubectl("apply", "-n", namespace, "-f", "-", check=True, input=json.dumps({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate", "metadata": {"name": "bare"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}))  # fmt: skip
    bare = get("sandboxtemplate", "bare")["spec"]
    assert (bare["envVarsInjectionPolicy"], bare["volumeClaimTemplatesPolicy"]) == (
        "Disallowed",
        "Disallowed",
    )
