"""The SDK's Kubernetes side on the real control plane + controller (no router or runtime needed):
create from a warm pool and from a template, find, list, suspend/resume, terminate, and the errors a
user sees for a wrong pool and for a sandbox that cannot become Ready. Sync and async clients.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClaimFailedError,
    SandboxClient,
    SandboxDirectConnectionConfig,
    SandboxNotFoundError,
    SandboxTimeoutError,
    SandboxWarmPoolNotFoundError,
)
from tests.helpers import signals_as_from_a_shell, wait_for

from .conftest import apply_pool

pytestmark = pytest.mark.integration

# Nothing listens here: these tests never reach a sandbox, only the Kubernetes API.
UNUSED_ROUTER = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")


def client(cluster: DevCluster) -> SandboxClient:
    return SandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig)


def test_create_find_list_terminate(cluster: DevCluster, namespace: str, controller: Started) -> None:
    apply_pool(cluster, namespace)
    with client(cluster) as c:
        sandbox = c.create_sandbox("pool", namespace, sandbox_ready_timeout=90, labels={"team": "sdk"})
        claim = sandbox.claim_name
        assert claim is not None
        assert claim.startswith("sandbox-claim-")
        assert sandbox.status()[0] == "SandboxReady"
        ip = sandbox.get_pod_ip()
        assert ip is not None
        assert ip.startswith("127.")
        assert sandbox.get_pod_name() == sandbox.sandbox_id
        assert sandbox.get_sandbox_name_hash()
        assert c.list_all_sandboxes(namespace) == [claim]
        assert c.list_all_sandboxes(namespace, label_selector="team=other") == []
        info = c.list_sandboxes(namespace)[0]
        assert (info.claim_name, info.warm_pool, info.sandbox_id, info.ready) == (
            claim,
            "pool",
            sandbox.sandbox_id,
            True,
        )
        assert c.get_sandbox_claim_warmpool_name(claim, namespace) == "pool"
        # Another client (another process, in real life) re-attaches by claim name.
        with client(cluster) as other:
            again = other.get_sandbox(claim, namespace)
            assert again.sandbox_id == sandbox.sandbox_id
            with pytest.raises(ValueError, match="warm pool 'pool', not 'x'"):
                other.get_sandbox(claim, namespace, warmpool_name="x")
        sandbox.terminate()
        sandbox.terminate()  # idempotent
        assert c.list_all_sandboxes(namespace) == []
        with pytest.raises(SandboxNotFoundError):
            c.get_sandbox(claim, namespace, resolve_timeout=2)


def test_wrong_pool_names_the_reason_quickly(
    cluster: DevCluster, namespace: str, controller: Started
) -> None:
    start = time.monotonic()
    with client(cluster) as c, pytest.raises(SandboxWarmPoolNotFoundError) as info:
        c.create_sandbox("no-such-pool", namespace, sandbox_ready_timeout=60)
    assert time.monotonic() - start < 30
    assert info.value.reason == "WarmPoolNotFound"
    assert "no-such-pool" in str(info.value)
    with client(cluster) as c:
        assert c.list_all_sandboxes(namespace) == []  # the auto-named claim was rolled back


def test_a_template_whose_pod_is_invalid_fails_at_once_naming_the_field(
    cluster: DevCluster, namespace: str, controller: Started
) -> None:
    """The API server refuses the Pod (422); no retry can change that. Upstream's SDK waits out the timeout
    (180 s by default) on `ReconcilerError`; ours raises SandboxClaimFailedError with the field, well before
    this test's 60 s timeout (the old code raised SandboxTimeoutError after it), and rolls the claim back."""
    apply_pool(cluster, namespace, replicas=0, containers=[{"name": "Bad_Name", "image": "busybox"}])
    with client(cluster) as c, pytest.raises(SandboxClaimFailedError) as info:
        c.create_sandbox_from_template("tmpl", namespace, sandbox_ready_timeout=60)
    assert info.value.reason == "ReconcilerError"
    assert 'spec.containers[0].name: Invalid value: "Bad_Name"' in str(info.value)
    with client(cluster) as c:
        assert c.list_all_sandboxes(namespace) == []

    def failed_create() -> list[str]:
        status, out = cluster.admin().request("GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
        assert status == 200, out
        return [e["note"] for e in out["items"] if e["reason"] == "FailedCreate" and e["type"] == "Warning"]

    # And `kubectl get events` says why, as a ReplicaSet's FailedCreate does (ours; upstream has no event).
    notes = wait_for(failed_create, what="a FailedCreate Warning event on the Sandbox")
    assert 'failed to create pod: Pod "' in notes[0]
    assert 'spec.containers[0].name: Invalid value: "Bad_Name"' in notes[0]


def test_unschedulable_times_out_naming_the_condition(
    cluster: DevCluster, namespace: str, controller: Started
) -> None:
    apply_pool(cluster, namespace, replicas=0, nodeSelector={"no-such-node-label": "x"})
    with client(cluster) as c, pytest.raises(SandboxTimeoutError) as info:
        c.create_sandbox("pool", namespace, sandbox_ready_timeout=8)
    assert isinstance(info.value, TimeoutError)
    assert info.value.reason  # the claim's Ready reason, e.g. SandboxNotReady
    assert "not Ready within 8 s" in str(info.value)
    assert info.value.reason in str(info.value)


def test_cold_start_from_a_template_and_suspend_resume(
    cluster: DevCluster, namespace: str, controller: Started
) -> None:
    apply_pool(cluster, namespace, replicas=0)
    with client(cluster) as c:
        sandbox = c.create_sandbox_from_template("tmpl", namespace, sandbox_ready_timeout=90)
        assert c.get_sandbox_claim_warmpool_name(sandbox.claim_name or "", namespace) == "tmpl-cold"
        sandbox.suspend(timeout=60)
        info = c.list_sandboxes(namespace)[0]
        assert info.suspended
        assert sandbox.get_pod_ip() is None
        sandbox.resume(timeout=60)
        assert sandbox.status()[0] == "SandboxReady"
        assert sandbox.get_pod_ip() is not None


def test_twenty_sandboxes_in_parallel_from_one_async_client(
    cluster: DevCluster, namespace: str, controller: Started
) -> None:
    apply_pool(cluster, namespace, replicas=10)

    async def main() -> None:
        async with AsyncSandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig) as c:
            sandboxes = await asyncio.gather(
                *(c.create_sandbox("pool", namespace, sandbox_ready_timeout=120) for _ in range(20))
            )
            assert len({s.sandbox_id for s in sandboxes}) == 20
            assert sorted(await c.list_active_sandboxes()) == sorted(
                (namespace, s.claim_name) for s in sandboxes
            )
            statuses = await asyncio.gather(*(s.status() for s in sandboxes))
            assert {st for st, _ in statuses} == {"SandboxReady"}
        # Leaving the `async with` deleted the 20 auto-named claims.
        async with AsyncSandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig, cleanup=False) as c:
            assert await c.list_all_sandboxes(namespace) == []

    asyncio.run(main())


def test_a_create_cut_short_by_the_callers_timeout_leaves_no_claim(
    cluster: DevCluster, namespace: str, controller: Started
) -> None:
    """`asyncio.wait_for` cancels the create mid-wait: the caller sees its own TimeoutError, the claim is gone."""
    apply_pool(cluster, namespace, replicas=0, nodeSelector={"no-such-node-label": "x"})

    async def main() -> None:
        async with AsyncSandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig, cleanup=False) as c:
            with pytest.raises(TimeoutError) as info:
                await asyncio.wait_for(c.create_sandbox("pool", namespace, sandbox_ready_timeout=60), 3)
            assert not isinstance(info.value, SandboxTimeoutError)  # the caller's timeout, not the SDK's
            assert await c.list_all_sandboxes(namespace) == []

    asyncio.run(main())


def test_ctrl_c_during_create_removes_the_claim(
    cluster: DevCluster, namespace: str, controller: Started
) -> None:
    apply_pool(cluster, namespace, replicas=0, nodeSelector={"no-such-node-label": "x"})
    script = (
        "import sys; from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig as D\n"
        "with SandboxClient(D(api_url='http://127.0.0.1:9'), kubeconfig=sys.argv[1]) as c:\n"
        "    c.create_sandbox('pool', sys.argv[2], sandbox_ready_timeout=60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(cluster.kubeconfig), namespace],
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: a child of a non-interactive shell could otherwise inherit SIGINT ignored.
        preexec_fn=signals_as_from_a_shell,
    )
    try:
        with client(cluster) as c:
            deadline = time.monotonic() + 30
            while not c.list_all_sandboxes(namespace):
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the claim never appeared"
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=30)
            assert proc.returncode != 0
            assert stderr.rstrip().endswith("KeyboardInterrupt"), stderr
            assert "GeneratorExit" not in stderr, stderr
            assert c.list_all_sandboxes(namespace) == []
    finally:
        proc.kill()
        proc.wait()


_FORK_THEN_EXIT = """
import asyncio, os, sys
from agent_sandbox_sdk import AsyncSandboxClient, SandboxDirectConnectionConfig
client = AsyncSandboxClient(SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9"), kubeconfig=sys.argv[1])
sandbox = asyncio.run(client.create_sandbox("pool", sys.argv[2], sandbox_ready_timeout=90))
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a prefork server's worker ending normally: the inherited atexit cleanup runs
os.waitpid(pid, 0)
print(asyncio.run(client.list_all_sandboxes(sys.argv[2])) == [sandbox.claim_name], flush=True)
"""


def test_a_forked_child_exiting_leaves_its_parents_claims(
    cluster: DevCluster, namespace: str, controller: Started
) -> None:
    """`cleanup=True` deletes at exit only what this process created: a forked child that exits normally
    does not delete the claim its parent is using (it did before December 5); the parent's own exit does."""
    apply_pool(cluster, namespace)
    out = subprocess.run(
        [sys.executable, "-c", _FORK_THEN_EXIT, str(cluster.kubeconfig), namespace],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True", (out.stdout, out.stderr)  # the child left the parent's claim
    with client(cluster) as c:
        assert c.list_all_sandboxes(namespace) == []  # the parent's exit deleted it
