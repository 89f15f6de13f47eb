"""The dev router's identity: with `AGENT_SANDBOX_CONTROLLER_IDENTITY=serviceaccount` (CI) it is the install's
`agent-sandbox-system/sandbox-router`, holding exactly the grants of the router components its flags need.

Until December 6 every dev and test router used the admin kubeconfig, so the router's shipped RBAC (the Pod
cache's reads, the claimed-member lookup, lifecycle resume and activity writes, TokenReview) was never
exercised by the suite, while the controller's was.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import stop
from agent_sandbox.devcluster.router import router_components, router_kubeconfig, start_router
from agent_sandbox.kube import ApiClient

pytestmark = pytest.mark.integration

USER = "system:serviceaccount:agent-sandbox-system:sandbox-router"


async def _whoami(client: ApiClient) -> str:
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    raw = await client.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        body=orjson.dumps(review),
        content_type="application/json",
    )
    return str(orjson.loads(raw)["status"]["userInfo"]["username"])


async def _can(client: ApiClient, verb: str, group: str, resource: str) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource}},
    }
    raw = await client.request(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        body=orjson.dumps(review),
        content_type="application/json",
    )
    return bool(orjson.loads(raw)["status"]["allowed"])


def test_the_components_follow_the_flags() -> None:
    assert router_components(["--cache-enabled"]) == ("router",)
    assert router_components(["--sandbox-lifecycle"]) == ("router", "router/lifecycle")
    assert router_components(["--authz-mode=tokenreview"]) == ("router", "router/tokenreview")
    assert router_components(["--authz-mode", "tokenreview"]) == ("router", "router/tokenreview")
    assert router_components(["--authz-mode=scoped-token"]) == ("router",)


async def test_the_service_account_identity_holds_the_router_components_grants(
    cluster: DevCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_SANDBOX_CONTROLLER_IDENTITY", "admin")
    assert router_kubeconfig(cluster) == cluster.kubeconfig

    monkeypatch.setenv("AGENT_SANDBOX_CONTROLLER_IDENTITY", "serviceaccount")
    path = router_kubeconfig(cluster, ("--cache-enabled",))
    assert path != cluster.kubeconfig
    async with await ApiClient.from_kubeconfig(str(path)) as client:
        assert await _whoami(client) == USER
        assert await _can(client, "watch", "", "pods")
        assert await _can(client, "get", "agents.x-k8s.io", "sandboxes")  # the claimed-member lookup
        assert not await _can(client, "get", "", "secrets")
        assert not await _can(client, "delete", "agents.x-k8s.io", "sandboxes")

    path = router_kubeconfig(cluster, ("--cache-enabled", "--sandbox-lifecycle", "--authz-mode=tokenreview"))
    async with await ApiClient.from_kubeconfig(str(path)) as client:
        assert await _whoami(client) == USER
        assert await _can(client, "patch", "agents.x-k8s.io", "sandboxes")  # resume, activity
        assert await _can(client, "patch", "lifecycle.agents.x-k8s.io", "sandboxarchives")  # restore
        assert await _can(client, "get", "extensions.agents.x-k8s.io", "sandboxclaims")
        assert await _can(client, "create", "authentication.k8s.io", "tokenreviews")


def test_the_dev_router_process_runs_as_its_service_account(
    cluster: DevCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_SANDBOX_CONTROLLER_IDENTITY", "serviceaccount")
    started = start_router(cluster)  # /readyz: its Pod cache synced with the router's own grants
    try:
        argv = Path(f"/proc/{started.pid}/cmdline").read_bytes().decode().split("\0")
        (kubeconfig,) = [a.split("=", 1)[1] for a in argv if a.startswith("--kubeconfig=")]
        assert kubeconfig != str(cluster.kubeconfig)
        users = yaml.safe_load(Path(kubeconfig).read_text())["users"]
        assert [u["name"] for u in users] == [USER]  # the ServiceAccount's token kubeconfig
    finally:
        stop(started)
