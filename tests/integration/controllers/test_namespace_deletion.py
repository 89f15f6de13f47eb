"""Deleting a namespace with a pool and claims in it is no error storm in the controller's log.

While a namespace is being deleted, kube-apiserver refuses every create in it (403 with the
`NamespaceTerminating` cause). The pool's member creates, the Sandboxes' child creates, the claims' cold
creates and their FailedCreate Events were each logged as an error (or a warning) and retried with
backoff until the objects were gone: dozens of lines per namespace. As kube's ReplicaSet and Job
controllers do, the controllers now take such a refusal as nothing to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import (
    CONFIG_MAP,
    NAMESPACE,
    POD,
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    ApiClient,
    Forbidden,
    NotFound,
    Object,
)
from agent_sandbox.kube.errors import is_namespace_terminating
from tests.conftest import new_namespace
from tests.helpers import eventually
from tests.integration.controllers.builders import claim_body, pool_body, template_body

pytestmark = pytest.mark.integration

HOLD = "tests.agents.x-k8s.io/hold"


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    """The controller at debug level: the refusals it meets show in a kept log, quietly."""
    started = start_controller(cluster, extra=("--zap-log-level=debug",))
    try:
        yield started
    finally:
        stop(started)


def _ready(obj: Object) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _loud_lines(log_text: str, ns: str) -> list[str]:
    """The controller's error lines, and its warnings, that concern namespace `ns`."""
    found = []
    for line in log_text.splitlines():
        try:
            entry: dict[str, Any] = json.loads(line)
        except ValueError:
            continue
        if entry.get("level") not in ("error", "warn", "warning"):
            continue
        if entry.get("namespace") == ns or ns in line:
            found.append(line[:600])
    return found


async def test_deleting_a_namespace_with_a_pool_and_claims_logs_no_errors(
    kube: ApiClient, cluster: DevCluster, controller: Started
) -> None:
    ns = new_namespace(cluster)
    try:
        template = template_body()  # its NetworkPolicy managed: the template controller's create too
        await kube.create(SANDBOX_TEMPLATE, template, namespace=ns)
        await kube.create(SANDBOX_WARM_POOL, pool_body(replicas=3), namespace=ns)
        await kube.create(SANDBOX_WARM_POOL, pool_body("cold", replicas=0), namespace=ns)
        for name, pool in (("warm-1", "pool"), ("warm-2", "pool"), ("cold-1", "cold")):
            await kube.create(SANDBOX_CLAIM, claim_body(name, pool=pool), namespace=ns)

        async def settled() -> bool:
            claims = await kube.list(SANDBOX_CLAIM, namespace=ns)
            sandboxes = await kube.list(SANDBOX, namespace=ns)
            # 3 claims bound and Ready, and the pool refilled to 3 Ready members besides them.
            return len(claims) == 3 and all(map(_ready, claims)) and sum(map(_ready, sandboxes)) == 6

        await eventually(settled, "claims Ready and the pool refilled", within=90)
        # Keeps the namespace Terminating after everything else is gone (the window we look at, and one
        # in which a create shows the API server's refusal as it is on the wire).
        held = {"metadata": {"name": "hold", "finalizers": [HOLD]}}
        await kube.create(CONFIG_MAP, held, namespace=ns)
        offset = len(controller.log.read_bytes())

        await kube.delete(NAMESPACE, ns)

        async def emptied() -> bool:
            left = 0
            for kind in (SANDBOX_CLAIM, SANDBOX_WARM_POOL, SANDBOX, POD):
                left += len(await kube.list(kind, namespace=ns))
            return left == 0

        await eventually(emptied, "the namespace's objects deleted", within=90)
        await asyncio.sleep(3)  # retries with backoff of what was refused would show by now
        with pytest.raises(Forbidden) as refused:
            await kube.create(CONFIG_MAP, {"metadata": {"name": "late"}}, namespace=ns)
        assert is_namespace_terminating(refused.value), refused.value.details

        text = controller.log.read_bytes()[offset:].decode(errors="replace")
        # Before the fix: ~120 such lines. The refusals the controllers still meet are at debug level.
        assert _loud_lines(text, ns) == []
    finally:
        with contextlib.suppress(NotFound):
            await kube.patch(CONFIG_MAP, "hold", {"metadata": {"finalizers": None}}, namespace=ns)
        cluster.admin().request("DELETE", f"/api/v1/namespaces/{ns}")
