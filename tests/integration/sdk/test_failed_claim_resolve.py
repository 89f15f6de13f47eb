"""A claim the real claim controller refused, used again: `get_sandbox` (sync and async) and the CLI commands
built on it fail at once with what `create_sandbox` raised, the claim named once.

Until December 6 `agent-sandbox create pool --name envc --env FOO=bar` (a template that does not allow env)
failed at once (`EnvVarsInjectionRejected`) and kept the named claim, and then `agent-sandbox exec envc -- true`
took 30.7 s to say `error: SandboxClaim p1/envc: SandboxClaim p1/envc was not bound to a Sandbox within 30 s:
Ready=False, reason EnvVarsInjectionRejected ...` (exit 3, "not found"), as did `cp` and `suspend`.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClaimFailedError,
    SandboxClient,
    SandboxDirectConnectionConfig,
    SandboxNotFoundError,
)

from .conftest import apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Nothing listens here: these tests never reach a sandbox, only the Kubernetes API.
UNUSED_ROUTER = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")


def _check(err: SandboxClaimFailedError, namespace: str) -> None:
    assert isinstance(err, SandboxNotFoundError)  # upstream's contract for get_sandbox: every failure is one
    assert err.reason == "EnvVarsInjectionRejected"
    message = str(err)
    assert message.startswith(
        f"SandboxClaim {namespace}/envc failed: Ready=False, reason EnvVarsInjectionRejected"
    )
    assert message.count(f"SandboxClaim {namespace}/envc") == 1, message


def test_a_claim_the_controller_rejected_fails_at_once_when_used_again(
    cluster: DevCluster, namespace: str, controller: Started
) -> None:
    apply_pool(cluster, namespace, replicas=0)  # its template leaves envVarsInjectionPolicy at Disallowed
    with SandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig) as c:
        with pytest.raises(SandboxClaimFailedError) as created:
            c.create_sandbox(
                "pool", namespace, sandbox_ready_timeout=60, claim_name="envc", env={"FOO": "bar"}
            )
        assert created.value.reason == "EnvVarsInjectionRejected"
        assert c.list_all_sandboxes(namespace) == ["envc"]  # an explicit name is never rolled back

        start = time.monotonic()
        with pytest.raises(SandboxClaimFailedError) as info:
            c.get_sandbox("envc", namespace)  # resolve_timeout 30 s: it used to be waited out
        assert time.monotonic() - start < 5
        _check(info.value, namespace)

    async def attach() -> None:
        async with AsyncSandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig) as c:
            start = time.monotonic()
            with pytest.raises(SandboxClaimFailedError) as info:
                await c.get_sandbox("envc", namespace)
            assert time.monotonic() - start < 5
            _check(info.value, namespace)

    asyncio.run(attach())

    # The CLI: what `create` said, exit 1 as `create`'s, at once.
    cli = str(Path(sys.executable).with_name("agent-sandbox"))
    common = ["-n", namespace, "--kubeconfig", str(cluster.kubeconfig), "--router-url", "http://127.0.0.1:9"]
    for argv in (["exec", "envc", *common, "--", "true"], ["suspend", "envc", *common]):
        start = time.monotonic()
        out = subprocess.run([cli, *argv], capture_output=True, text=True, timeout=60)
        assert time.monotonic() - start < 15, (argv, out.stderr)
        assert out.returncode == 1, (argv, out.stderr)
        assert (
            f"error: SandboxClaim {namespace}/envc failed: Ready=False, reason EnvVarsInjectionRejected"
            in (out.stderr)
        ), out.stderr
