"""`make demo`: the whole user journey on a local cluster, each step timed.

Control plane + controller + router + local runner -> a SandboxTemplate (this project's runtime image, a
PVC-backed /workspace) and a warm pool -> through the Python SDK: create a sandbox, run a command (time to
first instruction = create -> first command output), write and read a file, stream a command's output,
suspend and resume (the file is still there: it lives on the sandbox's volume), terminate.

Idempotent: a running demo cluster, controller, router, template and pool are reused, so `make demo`
twice in a row works and the second run is faster. It stops nothing it did not start in this run and
deletes nothing but the sandbox it created; the last lines say how to look around and how to stop.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from agent_sandbox.cli.output import inform
from agent_sandbox.devcluster import ClusterConfig, DevCluster
from agent_sandbox.devcluster.cluster import down_command
from agent_sandbox.devcluster.controller import CONTROLLER, start_controller
from agent_sandbox.devcluster.processes import is_ours
from agent_sandbox.devcluster.router import DEV_ROUTER_FLAGS, ROUTER, router_url, start_router
from agent_sandbox.devcluster.router_service import NAMESPACE, SERVICE, expose_router_report
from agent_sandbox.invocation import cli_command

T = TypeVar("T")

DEMO_NS = "demo"
TEMPLATE = "demo-template"
POOL = "demo-pool"
POOL_SIZE = 2
EXT = "extensions.agents.x-k8s.io/v1beta1"
#: The runner serves pods of this image with `agent-sandbox-runtime` (docs/devcluster.md "Local runner").
RUNTIME_IMAGE = "ghcr.io/agent-sandbox/agent-sandbox-runtime:dev"


def _say(msg: str) -> None:
    inform(msg)  # progress: dropped with a closed stdout (`demo >&-`), the demo goes on


@contextmanager
def step(title: str) -> Iterator[Callable[[str], None]]:
    """Print `title ... 123 ms  detail` when the block ends (the block reports its detail via the callback)."""
    details: list[str] = []
    start = time.perf_counter()
    yield details.append
    took = (time.perf_counter() - start) * 1000
    _say(f"  {title:<44} {took:8.0f} ms  {'; '.join(details)}")


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - start) * 1000


# ----------------------------------------------------------------------------------------- platform


def ensure_cluster(name: str) -> DevCluster:
    """The running cluster `name`, or a freshly started one (2 kwok nodes, local runner on)."""
    cluster = DevCluster.load(name)
    if cluster is not None:
        core = {part: up for part, up in cluster.running().items() if part not in (CONTROLLER, ROUTER)}
        if all(core.values()):
            if "runner" not in core:
                raise RuntimeError(
                    f"dev cluster {name!r} runs without the local runner (sandboxes could not execute); "
                    f"stop it with `{down_command(name)}` and run `make demo` again"
                )
            return cluster
    return DevCluster.up(ClusterConfig(name=name, nodes=2))


def _ours_running(cluster: DevCluster, name: str) -> bool:
    return any(s.name == name and is_ours(s.pid, s.exe) for s in cluster.state.started)


def ensure_controller(cluster: DevCluster) -> str:
    if _ours_running(cluster, CONTROLLER):
        return "reused"
    started = start_controller(cluster)
    return f"started (pid {started.pid})"


def ensure_router(cluster: DevCluster) -> str:
    url = router_url(cluster)
    if url is None:
        start_router(cluster, extra=DEV_ROUTER_FLAGS)
        url = router_url(cluster)
        assert url is not None
    # so clients that port-forward to the router (upstream's default mode) find it too; idempotent
    exposed, line = expose_router_report(cluster)
    if not exposed:
        _say(f"  ({line})")
    return url


def _create(cluster: DevCluster, path: str, body: dict[str, Any]) -> str:
    """POST unless it exists; retried while the API server (re)builds CRD storage (503/429/0)."""
    admin = cluster.admin()
    deadline = time.monotonic() + 30
    while True:
        status, out = admin.request("POST", path, body)
        if status in (201, 409):
            return "created" if status == 201 else "reused"
        if status not in (0, 429, 503, 404) or time.monotonic() > deadline:
            raise RuntimeError(f"creating {path} failed: HTTP {status}: {out}")
        time.sleep(0.2)


def ensure_pool(cluster: DevCluster) -> str:
    """Namespace, template (runtime image, 1Gi workspace PVC at /workspace) and a warm pool of 2, all Ready."""
    _create(cluster, "/api/v1/namespaces", {"metadata": {"name": DEMO_NS}})
    template = {
        "apiVersion": EXT,
        "kind": "SandboxTemplate",
        "metadata": {"name": TEMPLATE},
        "spec": {
            "podTemplate": {
                "spec": {
                    "containers": [
                        {
                            "name": "runtime",
                            "image": RUNTIME_IMAGE,
                            "ports": [{"containerPort": 8888}],
                            "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
                        }
                    ]
                }
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "workspace"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                }
            ],
        },
    }
    pool = {
        "apiVersion": EXT,
        "kind": "SandboxWarmPool",
        "metadata": {"name": POOL},
        "spec": {"replicas": POOL_SIZE, "sandboxTemplateRef": {"name": TEMPLATE}},
    }
    made = _create(cluster, f"/apis/{EXT}/namespaces/{DEMO_NS}/sandboxtemplates", template)
    _create(cluster, f"/apis/{EXT}/namespaces/{DEMO_NS}/sandboxwarmpools", pool)
    deadline = time.monotonic() + 120
    while True:
        status, body = cluster.admin().request(
            "GET", f"/apis/{EXT}/namespaces/{DEMO_NS}/sandboxwarmpools/{POOL}"
        )
        ready = int(((body or {}).get("status") or {}).get("readyReplicas") or 0) if status == 200 else 0
        if ready >= POOL_SIZE:
            return f"{made}; {ready}/{POOL_SIZE} members Ready"
        if time.monotonic() > deadline:
            raise RuntimeError(f"warm pool {DEMO_NS}/{POOL} not Ready within 120 s ({ready}/{POOL_SIZE})")
        time.sleep(0.2)


# ----------------------------------------------------------------------------------------- journey


def sdk_journey(cluster: DevCluster, router: str) -> None:
    """The user's part, through the SDK; each step timed."""
    from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig

    config = SandboxDirectConnectionConfig(api_url=router)
    with SandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        start = time.perf_counter()
        with step("create_sandbox (claim from the warm pool)") as note:
            sandbox = client.create_sandbox(POOL, DEMO_NS, sandbox_ready_timeout=120)
            note(f"claim {sandbox.claim_name}")
        commands, files = sandbox.commands, sandbox.files
        assert commands is not None
        assert files is not None
        with step("commands.run (first command)") as note:
            result = commands.run("echo 'hello from the sandbox'")
            first = (time.perf_counter() - start) * 1000
            note(f"{result.stdout.strip()!r}, exit {result.exit_code}")
        _say(f"  {'time to first instruction (create -> output)':<44} {first:8.0f} ms")
        with step("files.write + files.read") as note:
            files.write("notes/hello.txt", "written before suspend\n")
            note(f"{files.read('notes/hello.txt').decode().strip()!r}")
        with step("commands.stream (output as it happens)") as note:
            t0 = time.perf_counter()
            for event in commands.stream("sh -c 'for i in 1 2 3; do echo tick $i; sleep 0.2; done'"):
                if event.type == "stdout":
                    for line in event.text.splitlines():
                        note(f"{line} @{(time.perf_counter() - t0) * 1000:.0f} ms")
                elif event.type == "exit":
                    note(f"exit {event.exit_code}")
        with step("suspend (pod deleted, volume kept)"):
            sandbox.suspend(timeout=120)
        with step("resume (new pod, same volume)") as note:
            sandbox.resume(timeout=120)
            note(f"pod IP {sandbox.get_pod_ip()}")
        with step("files.read after resume") as note:
            note(f"{files.read('notes/hello.txt').decode().strip()!r} (still there)")
        with step("get_logs (the runtime's log: kubectl logs)") as note:
            last = sandbox.get_logs(tail_lines=1).strip()
            note(last.split(" ", 2)[-1])  # without the date and time
        with step("terminate (claim deleted)"):
            sandbox.terminate()


def run_demo(*, name: str = "demo") -> int:
    _say(f"agent-sandbox demo on the local dev cluster {name!r}")
    with step("local control plane + runner") as note:
        cluster = ensure_cluster(name)
        note(f"{len(cluster.state.nodes)} nodes, pod CIDR {cluster.state.pod_cidr}")
    with step("controller") as note:
        note(ensure_controller(cluster))
    with step("router") as note:
        router = ensure_router(cluster)
        note(router)
    with step(f"template {TEMPLATE} + warm pool {POOL}") as note:
        note(ensure_pool(cluster))
    sdk_journey(cluster, router)
    _say("")
    _say("look around:")
    _say(f"  export KUBECONFIG={cluster.kubeconfig} AGENT_SANDBOX_ROUTER_URL={router}")
    _say(
        f"  {cli_command(f'pools -n {DEMO_NS}')}        # and: create {POOL} -n {DEMO_NS}, exec, cp, list, logs"
    )
    _say(f"  kubectl get sandboxtemplates,sandboxwarmpools,sandboxclaims,sandboxes,pods -n {DEMO_NS}")
    _say(
        f"  (without AGENT_SANDBOX_ROUTER_URL the SDKs port-forward to svc/{SERVICE} -n {NAMESPACE}, as upstream's)"
    )
    _say(f"the cluster keeps running; stop it with: {down_command(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_demo())
