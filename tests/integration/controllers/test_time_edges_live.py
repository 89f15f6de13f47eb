"""Times and durations at the edges of what the API server admits, against the real controller process.

* `ttlSecondsAfterFinished` is int32 in the CRD, but the API server does not enforce the range: until
  December 6 a TTL of 1e12 raised OverflowError in every claim pass (status frozen: Finished never mirrored).
  Such a deadline is never; the pass completes.
* `spec.shutdownTime` the API server admits as `format: date-time` but `parse_time` rejected (an offset past
  23:59 such as "+24:00", any character before the fraction digits) counted as unset: the Sandbox never
  expired. Spec §1.2: expired iff shutdownTime is set and now >= shutdownTime, for every admitted value.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import (
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    ApiClient,
    NotFound,
)
from tests.helpers import eventually
from tests.integration.controllers.builders import claim_body, pool_body, template_body

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    started = start_controller(cluster)
    try:
        yield started
    finally:
        stop(started)


def _condition(obj: dict[str, object] | None, type_: str) -> dict[str, object] | None:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []  # type: ignore[attr-defined]
    return next((cd for cd in conditions if cd.get("type") == type_), None)


async def test_a_ttl_past_datetime_mirrors_finished_and_never_expires(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    offset = len(controller.log.read_bytes())
    pod = {"restartPolicy": "Never", "containers": [{"name": "job", "image": "busybox", "command": ["true"]}]}
    await kube.create(SANDBOX_TEMPLATE, template_body(labels={"app": "demo"}, pod=pod), namespace=namespace)
    await kube.create(SANDBOX_WARM_POOL, pool_body(replicas=0), namespace=namespace)
    lifecycle = {"ttlSecondsAfterFinished": 10**12, "shutdownPolicy": "Delete"}
    await kube.create(SANDBOX_CLAIM, claim_body("job", lifecycle=lifecycle), namespace=namespace)

    async def finished() -> dict[str, object] | None:
        claim = await kube.get(SANDBOX_CLAIM, "job", namespace=namespace)
        cond = _condition(claim, "Finished")
        return claim if cond is not None and cond.get("status") == "True" else None

    claim = await eventually(finished, "the claim mirrors Finished", within=60)
    assert (_condition(claim, "Ready") or {}).get("reason") != "ClaimExpired"
    await kube.get(SANDBOX, "job", namespace=namespace)  # not deleted: it never expires
    log = controller.log.read_bytes()[offset:].decode(errors="replace")
    assert "OverflowError" not in log, log[-3000:]
    assert "too large to convert" not in log, log[-3000:]


@pytest.mark.parametrize(
    ("name", "shutdown"),
    [
        # Local time now + 1h at +24:00 is 23 hours ago.
        ("offset-24", lambda now: (now + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S+24:00")),
        ("offset-99", lambda now: now.strftime("%Y-%m-%dT%H:%M:%S+99:99")),
        # The API server's pattern has an unescaped "." before the fraction digits.
        ("any-dot", lambda now: (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SX5Z")),
    ],
)
async def test_an_admitted_shutdown_time_in_the_past_expires_the_sandbox(
    kube: ApiClient, namespace: str, controller: Started, name: str, shutdown: object
) -> None:
    when = shutdown(datetime.now(UTC))  # type: ignore[operator]
    body = {
        "apiVersion": SANDBOX.api_version,
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {
            "podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
            "shutdownTime": when,
            "shutdownPolicy": "Delete",
        },
    }
    await kube.create(SANDBOX, body, namespace=namespace)  # admitted: the API server's date-time check

    async def gone() -> bool:
        try:
            await kube.get(SANDBOX, name, namespace=namespace)
        except NotFound:
            return True
        return False

    await eventually(gone, f"Sandbox with shutdownTime {when} expired and deleted", within=60)
