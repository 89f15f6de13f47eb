"""`make demo`: the README journey on a local cluster (grows as capabilities land).

Idempotent: a running demo cluster (and its controller) is reused, so `make demo` twice in a row works.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from datetime import UTC, datetime
from typing import Any

from agent_sandbox.devcluster import ClusterConfig, DevCluster
from agent_sandbox.devcluster.controller import CONTROLLER, start_controller
from agent_sandbox.devcluster.processes import is_ours
from agent_sandbox.devcluster.router import ROUTER, router_url, start_router


def _say(msg: str) -> None:
    print(msg, flush=True)


def ensure_cluster(name: str) -> DevCluster:
    """The running cluster `name`, or a freshly started one."""
    cluster = DevCluster.load(name)
    # The controller is judged separately (see `ensure_controller`): a stopped one must not force a rebuild.
    if cluster is not None and all(
        up for part, up in cluster.running().items() if part not in (CONTROLLER, ROUTER)
    ):
        _say(f"reusing running cluster {name!r}")
        return cluster
    return DevCluster.up(ClusterConfig(name=name, nodes=2))


def run_demo(*, name: str = "demo") -> int:
    cluster = ensure_cluster(name)
    _say(cluster.describe())
    nodes = cluster.kubectl("get", "nodes", "-o", "wide")
    _say(nodes.stdout or nodes.stderr)
    if nodes.returncode != 0:
        return 1
    ensure_controller(cluster)
    ensure_router(cluster)
    code = asyncio.run(claim_journey(cluster))
    _say(f"KUBECONFIG={cluster.kubeconfig} kubectl get sandboxclaims,sandboxes -n {DEMO_NS}")
    _say(f"stop it with: .venv/bin/agent-sandbox dev down --name {name}")
    return code


def ensure_router(cluster: DevCluster) -> None:
    """Reuse the demo's running `agent-sandbox-router` (Pod cache on), or start one."""
    url = router_url(cluster)
    if url is None:
        started = start_router(cluster)
        url = router_url(cluster)
        _say(f"router started (pid {started.pid}, log {started.log})")
    _say(f"router: {url}  (agent-sandbox dev router-url --name {cluster.name})")


# --------------------------------------------------------------------------- warm pool + claim journey

DEMO_NS = "demo"
EXT = "extensions.agents.x-k8s.io/v1beta1"


def ensure_controller(cluster: DevCluster) -> None:
    """Reuse the demo's running `agent-sandbox-controller --extensions`, or start one."""
    if any(s.name == CONTROLLER and is_ours(s.pid, s.exe) for s in cluster.state.started):
        _say("reusing the running controller")
        return
    started = start_controller(cluster)
    _say(f"controller started (pid {started.pid}, log {started.log})")


async def _retry(call: Any, *args: Any, **kw: Any) -> Any:
    """Retry while the API server rebuilds the CRDs' storage after the controller patched them (503/429)."""
    from agent_sandbox.kube import ServerError, TooManyRequests

    deadline = time.monotonic() + 30
    while True:
        try:
            return await call(*args, **kw)
        except (ServerError, TooManyRequests):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def claim_journey(cluster: DevCluster) -> int:
    """Template -> warm pool of 2 -> claim; prints the claim's time to Ready and its launch type."""
    from agent_sandbox.kube import (
        NAMESPACE,
        SANDBOX,
        SANDBOX_CLAIM,
        SANDBOX_TEMPLATE,
        SANDBOX_WARM_POOL,
        AlreadyExists,
        ApiClient,
    )

    def ready(obj: dict[str, Any]) -> bool:
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    async with await ApiClient.from_kubeconfig(str(cluster.kubeconfig)) as api:
        template = {
            "apiVersion": EXT,
            "kind": "SandboxTemplate",
            "metadata": {"name": "demo-template"},
            "spec": {
                "podTemplate": {"spec": {"containers": [{"name": "main", "image": "python:3.12-slim"}]}}
            },
        }
        pool = {
            "apiVersion": EXT,
            "kind": "SandboxWarmPool",
            "metadata": {"name": "demo-pool"},
            "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "demo-template"}},
        }
        namespace = {"metadata": {"name": DEMO_NS}}
        for kind, body, ns in ((NAMESPACE, namespace, None), (SANDBOX_TEMPLATE, template, DEMO_NS)):
            with contextlib.suppress(AlreadyExists):
                await _retry(api.create, kind, body, namespace=ns)
        with contextlib.suppress(AlreadyExists):
            await _retry(api.create, SANDBOX_WARM_POOL, pool, namespace=DEMO_NS)
        for old in await _retry(api.list, SANDBOX_CLAIM, namespace=DEMO_NS):  # the previous run's claim
            await api.delete(SANDBOX_CLAIM, old["metadata"]["name"], namespace=DEMO_NS)
        deadline = time.monotonic() + 120
        while True:
            members = await api.list(
                SANDBOX, namespace=DEMO_NS, label_selector="agents.x-k8s.io/warm-pool-sandbox"
            )
            if sum(ready(m) for m in members) >= 2:
                break
            if time.monotonic() > deadline:
                _say("the warm pool did not become Ready within 120 s")
                return 1
            await asyncio.sleep(0.2)
        _say("template demo-template, warm pool demo-pool: 2/2 members Ready")
        name = "demo-claim-" + datetime.now(UTC).strftime("%H%M%S")
        claim = {
            "apiVersion": EXT,
            "kind": "SandboxClaim",
            "metadata": {"name": name},
            "spec": {"warmPoolRef": {"name": "demo-pool"}},
        }
        start = time.monotonic()
        await api.create(SANDBOX_CLAIM, claim, namespace=DEMO_NS)
        while not ready(got := await api.get(SANDBOX_CLAIM, name, namespace=DEMO_NS)):
            if time.monotonic() - start > 60:
                _say(f"claim {name} not Ready within 60 s: {got.get('status')}")
                return 1
            await asyncio.sleep(0.005)
        elapsed_ms = (time.monotonic() - start) * 1000
        bound = got["status"]["sandbox"]["name"]
        sandbox = await api.get(SANDBOX, bound, namespace=DEMO_NS)
        launch = (sandbox["metadata"].get("labels") or {}).get("agents.x-k8s.io/launch-type", "unknown")
        _say(f"claim {name}: Ready in {elapsed_ms:.0f} ms, launch type {launch}, sandbox {bound}")
    return 0


if __name__ == "__main__":
    sys.exit(run_demo())
