"""The lifecycle components (k8s/lifecycle, k8s/router/lifecycle; ours, docs/lifecycle.md) installed the way
users do: the controller runs with `--sandbox-lifecycle` as its ServiceAccount and the router with
`--sandbox-lifecycle` as its own, each with exactly the grants the components render. The router becomes
Ready only if it can list Sandboxes, templates and archives, and a request through it resumes a suspended
Sandbox only if it may patch Sandboxes: both grants are exercised for real."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.devcluster.install import apply, kustomize
from tests.integration.devcluster.runtime_helpers import RUNTIME_IMAGE
from tests.integration.install.conftest import RAW_SELECTOR, Installed, write_overlay

pytestmark = pytest.mark.integration

ROUTER = {"app.kubernetes.io/name": "sandbox-router", "app.kubernetes.io/component": "sandbox-router"}


def test_lifecycle_components_run_with_their_grants(
    installed: Installed, install_ns: str, tmp_path: Path
) -> None:
    overlay = write_overlay(tmp_path / "overlay", ["lifecycle", "router", "router/lifecycle"])
    docs = kustomize(installed.cluster, overlay)
    controller = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "agent-sandbox-controller"
    )
    assert "--sandbox-lifecycle" in controller["spec"]["template"]["spec"]["containers"][0]["args"]
    apply(installed.cluster, docs)
    installed.controller_pods(RAW_SELECTOR)
    routers = installed.controller_pods(ROUTER, count=2)  # Ready: the lifecycle informers synced
    installed.wait_conversion(install_ns)
    sandbox = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "wake", "annotations": {lc.ANNOTATION_AUTO_RESUME: "true"}},
        "spec": {
            "operatingMode": "Suspended",
            "podTemplate": {"spec": {"containers": [{"name": "runtime", "image": RUNTIME_IMAGE}]}},
        },
    }
    admin = installed.cluster.admin()
    status, body = admin.request(
        "POST", f"/apis/agents.x-k8s.io/v1beta1/namespaces/{install_ns}/sandboxes", sandbox
    )
    assert status == 201, body
    time.sleep(2)  # the router's informers see it
    ip = routers[0]["status"]["podIP"]
    request = urllib.request.Request(
        f"http://{ip}:8080/execute",
        data=json.dumps({"command": "sh -c 'echo $HOSTNAME'"}).encode(),
        headers={
            "X-Sandbox-ID": "wake",
            "X-Sandbox-Namespace": install_ns,
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=90) as resp:
        assert resp.status == 200
        assert json.loads(resp.read())["stdout"] == "wake\n"
    status, sb = admin.request("GET", f"/apis/agents.x-k8s.io/v1beta1/namespaces/{install_ns}/sandboxes/wake")
    assert status == 200, sb
    assert sb["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] == "Request"
