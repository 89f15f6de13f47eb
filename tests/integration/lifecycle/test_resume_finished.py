"""`agent-sandbox lifecycle resume` of a running Sandbox whose Pod has completed (cli/lifecycle.py), on the real
control plane: refused at once, saying the Pod finished. Until December 6 it waited out its whole timeout
("not Ready within 120s", exit 4)."""

from __future__ import annotations

import time

import pytest

from agent_sandbox.cli.lifecycle import Refused, resume
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import SANDBOX, ApiClient
from tests.helpers import eventually

pytestmark = pytest.mark.integration


async def test_resuming_a_sandbox_whose_pod_completed_is_refused_at_once(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    pod = {"restartPolicy": "Never", "containers": [{"name": "job", "image": "busybox", "command": ["true"]}]}
    body = {
        "apiVersion": SANDBOX.api_version,
        "kind": "Sandbox",
        "metadata": {"name": "job"},
        "spec": {"podTemplate": {"spec": pod}},
    }
    await kube.create(SANDBOX, body, namespace=namespace)

    async def finished() -> bool:
        sb = await kube.get(SANDBOX, "job", namespace=namespace)
        conditions = (sb.get("status") or {}).get("conditions") or []
        return any(cd["type"] == "Finished" and cd["status"] == "True" for cd in conditions)

    await eventually(finished, "the Sandbox's Pod completes (Finished=True)", within=60)
    started = time.monotonic()
    with pytest.raises(Refused, match="has finished"):
        await resume(kube, "job", namespace, wait=60)
    assert time.monotonic() - started < 10
