"""APF insulation (operations §10, docs/apf-insulation.md): with examples/apf-insulation applied, the
controller's requests land in the intended priority levels, read from the API server itself: its
flow-control metrics for the live controller's traffic, and the X-Kubernetes-PF-* headers it returns for
requests made with the controller's own token."""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.identity import controller_kubeconfig
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.manifests import REPO_ROOT
from tests.helpers import wait_for
from tests.integration.install.conftest import sa_controller
from tests.integration.install.test_rbac import _claim, _create, _pool, _ready, _template

pytestmark = pytest.mark.integration

MANIFEST = REPO_ROOT / "examples" / "apf-insulation" / "apf-insulation.yaml"
FLOW = "/apis/flowcontrol.apiserver.k8s.io/v1"
METRIC = re.compile(
    r'^apiserver_flowcontrol_dispatched_requests_total\{flow_schema="([^"]+)",priority_level="([^"]+)"\} (\S+)$'
)


def _dispatched(cluster: DevCluster) -> dict[tuple[str, str], float]:
    status, text = cluster.admin().request("GET", "/metrics")
    assert status == 200
    out: dict[tuple[str, str], float] = {}
    for line in str(text).splitlines():
        if m := METRIC.match(line):
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


@pytest.fixture
def insulated(install_cluster: DevCluster) -> Iterator[DevCluster]:
    """The overlay applied (and removed afterwards); its FlowSchemas resolved (not dangling)."""
    cluster = install_cluster
    out = cluster.kubectl("apply", "-f", str(MANIFEST))
    assert out.returncode == 0, out.stderr

    def resolved() -> bool:
        schemas = cluster.admin().request(
            "GET", f"{FLOW}/flowschemas?labelSelector=app%3Dagent-sandbox-controller"
        )[1]
        conds = [
            c
            for s in schemas["items"]
            for c in (s.get("status") or {}).get("conditions") or ()
            if c["type"] == "Dangling"
        ]
        return len(conds) == 3 and all(c["status"] == "False" for c in conds)

    wait_for(resolved, what="the three FlowSchemas resolved to their priority levels")
    try:
        yield cluster
    finally:
        cluster.kubectl("delete", "-f", str(MANIFEST), "--ignore-not-found")


@pytest.fixture
def controller(insulated: DevCluster) -> Iterator[Started]:
    with sa_controller(insulated) as started:
        yield started


class AsController:
    """Raw HTTPS requests with the controller's token; returns the APF headers of each response."""

    def __init__(self, cluster: DevCluster) -> None:
        config = yaml.safe_load(controller_kubeconfig(cluster, "serviceaccount").read_text())
        self.server = config["clusters"][0]["cluster"]["server"]
        self.token = config["users"][0]["user"]["token"]
        self.ctx = ssl.create_default_context(
            cafile=config["clusters"][0]["cluster"]["certificate-authority"]
        )

    def level_uid(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> str:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=10) as resp:
                headers = resp.headers
        except urllib.error.HTTPError as err:  # the level is decided before the handler answers
            headers = err.headers
        return str(headers.get("X-Kubernetes-PF-PriorityLevel-UID", ""))


def _level_uids(cluster: DevCluster) -> dict[str, str]:
    body = cluster.admin().request("GET", f"{FLOW}/prioritylevelconfigurations")[1]
    return {item["metadata"]["uid"]: item["metadata"]["name"] for item in body["items"]}


def test_controller_requests_land_in_the_intended_levels(
    insulated: DevCluster, controller: Started, install_ns: str
) -> None:
    cluster, ns = insulated, install_ns
    before = _dispatched(cluster)
    for obj in (_template(), _pool(), _claim()):
        _create(cluster, ns, obj)
    wait_for(lambda: _ready(cluster, ns, "SandboxClaim", "claim"), timeout=60, what="the claim Ready")

    # The live controller's traffic, as the API server counted it.
    def delta(schema: str, level: str) -> float:
        return _dispatched(cluster).get((schema, level), 0.0) - before.get((schema, level), 0.0)

    wait_for(
        lambda: delta("agent-sandbox-events", "workload-low") > 0, what="controller events in workload-low"
    )
    assert delta("agent-sandbox-critical", "agent-sandbox-critical") > 0  # claim adoption writes
    assert delta("agent-sandbox-bulk", "agent-sandbox-bulk") > 0  # pool refill creates, watches

    # Per request kind, with the controller's own token (the level is in each response's headers).
    levels = _level_uids(cluster)
    me = AsController(cluster)
    claims = f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxclaims"
    merge = "application/merge-patch+json"
    cases = {
        ("PATCH", f"{claims}/claim/status"): "agent-sandbox-critical",
        ("PATCH", f"{claims}/claim"): "agent-sandbox-critical",
        ("PATCH", f"/api/v1/namespaces/{ns}/pods/does-not-exist"): "agent-sandbox-critical",
        ("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/x"): "agent-sandbox-critical",
        ("GET", f"{claims}/claim"): "agent-sandbox-bulk",  # reads never dilute the critical level
        ("GET", "/api/v1/pods?limit=1"): "agent-sandbox-bulk",
        ("DELETE", f"{claims}/does-not-exist"): "agent-sandbox-bulk",
        ("GET", "/version"): "agent-sandbox-bulk",
        ("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events"): "workload-low",
    }
    got = {
        key: levels.get(me.level_uid(*key, body={} if key[0] == "PATCH" else None, ctype=merge), "?")
        for key in cases
    }
    assert got == cases
