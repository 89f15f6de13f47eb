"""The SDK through the real router (`agent-sandbox-router`, dev mode: Pod cache on, loopback pod IPs only
as a sandbox's, h2c on) to runtimes the local runner serves — and the published upstream SDK 1.0.8,
unchanged, on the same path (`SandboxDirectConnectionConfig(api_url=<router URL>)`).

| mode | config | path |
|---|---|---|
| legacy via router | `SandboxDirectConnectionConfig(api_url)` | router :HTTP + `X-Sandbox-*` -> pod :8888 |
| sandboxd via router | `SandboxdDirectConnectionConfig(api_url)` | REST via router -> pod :8080; gRPC via the router's h2c pass-through -> pod :9090 |
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import time
from typing import Any

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClient,
    SandboxdDirectConnectionConfig,
    SandboxDirectConnectionConfig,
    SandboxRequestError,
)
from tests.upstream_sdk import ensure_upstream_sdk, run_script

from .conftest import RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def pool(cluster: DevCluster, namespace: str, controller: Started) -> str:
    apply_pool(cluster, namespace, replicas=2, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    return namespace


def router_config(
    router: str, runtime: str
) -> SandboxDirectConnectionConfig | SandboxdDirectConnectionConfig:
    """The router connection for the legacy runtime's HTTP API or sandboxd's (REST + gRPC over h2c)."""
    if runtime == "legacy":
        return SandboxDirectConnectionConfig(api_url=router)
    return SandboxdDirectConnectionConfig(api_url=router)


@pytest.mark.parametrize("runtime", ["legacy", "sandboxd"])
def test_commands_files_and_streams_through_the_router(
    cluster: DevCluster, pool: str, router: str, runtime: str
) -> None:
    config = router_config(router, runtime)
    with SandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        assert sandbox.files is not None
        result = sandbox.commands.run("echo routed")
        assert (result.stdout, result.exit_code) == ("routed\n", 0)
        assert sandbox.commands.run("printenv X", env={"X": "y"}).stdout == "y\n"
        sandbox.files.write("r/a.txt", b"through the router")
        assert sandbox.files.read("r/a.txt") == b"through the router"
        assert [e.name for e in sandbox.files.list("r")] == ["a.txt"]
        assert sandbox.files.exists("r/a.txt")
        # `..` itself is the runtime's to refuse; until December 6 the legacy path's dot segment was resolved
        # away by the HTTP library and `read("..")` returned the runtime's health answer as the file's content
        with pytest.raises(SandboxRequestError) as refused:
            sandbox.files.read("..", allow_unsafe_paths=True)
        assert refused.value.status_code == 403
        events = list(sandbox.commands.stream("sh -c 'echo one; sleep 0.2; echo two'"))
        assert b"".join(e.data for e in events if e.type == "stdout") == b"one\ntwo\n"
        assert events[-1].exit_code == 0
        sandbox.suspend(timeout=60)
        sandbox.resume(timeout=60)
        # New pod, new IP: the SDK re-reads it; the router accepts it (its cache follows the resume).
        assert sandbox.commands.run("echo back").stdout == "back\n"
        sandbox.terminate()


def test_router_errors_reach_the_caller(cluster: DevCluster, pool: str, router: str) -> None:
    """A sandbox the router cannot resolve: its JSON `detail` arrives in the SDK's error, status kept."""
    with SandboxClient(
        SandboxDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig
    ) as client:
        ghost = client.sandbox_class(
            "ghost-claim", "never-existed", pool, client.connection_config, k8s_helper=client._driver
        )
        assert ghost.commands is not None
        with pytest.raises(SandboxRequestError) as info:
            ghost.commands.run("true", timeout=20)
        assert info.value.status_code == 502
        assert "Could not connect to the backend sandbox: never-existed" in str(info.value)


def test_twenty_concurrent_sandboxes_through_the_router_async(
    cluster: DevCluster, namespace: str, controller: Started, router: str
) -> None:
    apply_pool(cluster, namespace, replicas=20, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])

    async def main() -> None:
        config = SandboxDirectConnectionConfig(api_url=router)
        async with AsyncSandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
            sandboxes = await asyncio.gather(
                *(client.create_sandbox("pool", namespace, sandbox_ready_timeout=120) for _ in range(20))
            )
            assert len({s.sandbox_id for s in sandboxes}) == 20
            # 100 calls in flight on one client (5 per sandbox): one connection pool, no thread pool.
            calls = [(i, sandboxes[i % 20]) for i in range(100)]
            outs = await asyncio.gather(*(s.commands.run(f"echo {i}") for i, s in calls))  # type: ignore[union-attr]
            assert [o.stdout for o in outs] == [f"{i}\n" for i in range(100)]

    asyncio.run(main())


@pytest.mark.parametrize("runtime", ["legacy", "sandboxd"])
def test_one_async_client_across_event_loops(
    cluster: DevCluster, pool: str, router: str, runtime: str
) -> None:
    """A client made once and used from several `asyncio.run` calls (scripts, a test framework's loop per test)
    reopens its connections on each new loop instead of failing with "Event loop is closed"."""
    config = router_config(router, runtime)
    client = AsyncSandboxClient(config, kubeconfig=cluster.kubeconfig)

    async def create() -> Any:
        sandbox = await client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert (await sandbox.commands.run("echo first")).stdout == "first\n"  # type: ignore[union-attr]
        return sandbox

    sandbox = asyncio.run(create())

    async def again() -> str:
        return (await sandbox.commands.run("echo again")).stdout  # type: ignore[no-any-return,union-attr]

    assert asyncio.run(again()) == "again\n"
    assert asyncio.run(again()) == "again\n"

    async def finish() -> None:
        await sandbox.terminate()
        await client.close()

    asyncio.run(finish())


#: The handle forked workers inherit (a handle holds TLS contexts and sockets: it cannot be pickled to them).
_INHERITED: list[Any] = []


def _echo_in_a_forked_worker(worker: int) -> list[str]:
    return [_INHERITED[0].commands.run(f"echo {worker}-{j}").stdout for j in range(20)]


def test_forked_workers_share_a_handle_made_before_the_fork(
    cluster: DevCluster, pool: str, router: str
) -> None:
    """multiprocessing `fork` workers using a client and handle made in the parent, while the parent uses them
    too: every call gets its own answer (inherited pooled sockets are not shared across processes)."""
    with SandboxClient(
        SandboxDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig
    ) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        assert sandbox.commands.run("echo parent").stdout == "parent\n"  # a pooled connection to inherit
        _INHERITED[:] = [sandbox]
        with multiprocessing.get_context("fork").Pool(3) as workers:
            pending = workers.map_async(_echo_in_a_forked_worker, range(3))
            mine = [sandbox.commands.run(f"echo p-{j}").stdout for j in range(20)]
            theirs = pending.get(timeout=120)
        assert mine == [f"p-{j}\n" for j in range(20)]
        assert theirs == [[f"{w}-{j}\n" for j in range(20)] for w in range(3)]
        sandbox.terminate()


_UPSTREAM = r"""
import json, sys
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
ns, url = sys.argv[1], sys.argv[2]
client = SandboxClient(connection_config=SandboxDirectConnectionConfig(api_url=url))
sb = client.create_sandbox("pool", namespace=ns, sandbox_ready_timeout=90)
out = {"claim": sb.claim_name}
r = sb.commands.run("echo hello")
out["run"] = [r.stdout, r.exit_code]
sb.files.write("dir/hello.txt", "hi")
out["read"] = sb.files.read("dir/hello.txt").decode()
out["exists"] = sb.files.exists("dir/hello.txt")
sb.terminate()
print(json.dumps(out))
"""


async def test_published_upstream_sdk_through_the_router(cluster: DevCluster, pool: str, router: str) -> None:
    """The reference client: k8s-agent-sandbox==1.0.8 from PyPI, in its own virtualenv, unchanged."""
    python = ensure_upstream_sdk()
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    out = json.loads(await run_script(python, _UPSTREAM, pool, router, env=env, timeout=180))
    assert out["run"] == ["hello\n", 0]
    assert out["read"] == "hi"
    assert out["exists"] is True
    with SandboxClient(
        SandboxDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig
    ) as client:
        assert out["claim"] not in client.list_all_sandboxes(pool)  # terminate deleted the claim


_UPSTREAM_ASYNC = r"""
import asyncio, json, sys
from k8s_agent_sandbox import AsyncSandboxClient
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig, SandboxdInClusterConnectionConfig
ns, url = sys.argv[1], sys.argv[2]

async def journey(config):
    out = {}
    async with AsyncSandboxClient(connection_config=config) as client:
        sandboxes = await asyncio.gather(
            *(client.create_sandbox("pool", namespace=ns, sandbox_ready_timeout=90) for _ in range(3))
        )
        out["claims"] = len({s.claim_name for s in sandboxes})
        sb = sandboxes[0]
        runs = await asyncio.gather(*(s.commands.run(f"echo {i}") for i, s in enumerate(sandboxes)))
        out["run"] = [[r.stdout, r.exit_code] for r in runs]
        await sb.files.write("dir/hello.txt", "hi")
        out["read"] = (await sb.files.read("dir/hello.txt")).decode()
        out["exists"] = await sb.files.exists("dir/hello.txt")
        out["list"] = sorted(e.name for e in await sb.files.list("dir"))
        out["status"] = (await sb.status())[0]
        again = await client.get_sandbox(sb.claim_name, namespace=ns)
        out["again"] = (await again.commands.run("echo again")).stdout
        out["listed"] = len(await client.list_all_sandboxes(ns))
        await sb.terminate()
        out["after_terminate"] = len(await client.list_all_sandboxes(ns))
    # Leaving the `async with` deleted the other two (auto-named) claims.
    async with AsyncSandboxClient(connection_config=config, cleanup=False) as client:
        out["after_exit"] = len(await client.list_all_sandboxes(ns))
    return out

async def main():
    print(json.dumps({
        "router": await journey(SandboxDirectConnectionConfig(api_url=url)),
        "sandboxd pod IP": await journey(SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip")),
    }))

asyncio.run(main())
"""


async def test_published_upstream_async_sdk(cluster: DevCluster, pool: str, router: str) -> None:
    """The reference client's AsyncSandboxClient (1.0.8 with its `async` extra: httpx, kubernetes_asyncio),
    unchanged: through the router (legacy runtime) and to sandboxd at the pod IP (REST + gRPC)."""
    python = ensure_upstream_sdk()
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    out = json.loads(await run_script(python, _UPSTREAM_ASYNC, pool, router, env=env, timeout=240))
    for mode, seen in out.items():
        assert seen == {
            "claims": 3,
            "run": [["0\n", 0], ["1\n", 0], ["2\n", 0]],
            "read": "hi",
            "exists": True,
            "list": ["hello.txt"],
            "status": "SandboxReady",
            "again": "again\n",
            "listed": 3,
            "after_terminate": 2,
            "after_exit": 0,
        }, mode


@pytest.mark.parametrize("runtime", ["legacy", "sandboxd"])
def test_a_sandbox_the_router_cannot_reach_is_explained(
    cluster: DevCluster, pool: str, router: str, runtime: str
) -> None:
    """A 502 / UNAVAILABLE from the router says why when the Sandbox tells: suspended, or gone."""
    config = router_config(router, runtime)
    with SandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        sandbox.suspend(timeout=60)
        with pytest.raises(
            SandboxRequestError,
            match=r"is suspended \(spec.operatingMode: Suspended\): resume it \(the handle's",
        ):
            sandbox.commands.run("echo x")
        with pytest.raises(SandboxRequestError, match="is suspended"):
            list(sandbox.commands.stream("echo x"))
        assert sandbox.files is not None
        with pytest.raises(SandboxRequestError, match="is suspended"):
            sandbox.files.read("anything")  # a GET: no retries once the Sandbox says suspended
        sandbox.resume(timeout=60)
        assert sandbox.commands.run("echo back").stdout == "back\n"
        # Gone: its claim deleted behind this handle's back (another process, an expiry).
        other = client.get_sandbox(sandbox.claim_name or "", pool)
        assert other.commands is not None
        with SandboxClient(config, kubeconfig=cluster.kubeconfig) as second:
            second.delete_claim(sandbox.claim_name or "", pool)
        deadline, last = time.monotonic() + 60, "no error"
        while True:
            try:
                other.commands.run("echo x")
            except SandboxRequestError as err:
                last = str(err)
                if "no longer exists" in last:
                    break
            assert time.monotonic() < deadline, f"the gone Sandbox was never explained: {last}"
            time.sleep(0.5)
