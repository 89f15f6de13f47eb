"""`agent-sandbox lifecycle resume|suspend|hibernate` (cli/lifecycle.py) over the in-memory FakeClient: a
resume cancels a pending hibernation; expired, deleted, hibernated and warm-pool Sandboxes are refused at
once, saying why."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import format_time
from agent_sandbox.cli.lifecycle import Refused, ResumeOutcome, hibernate, resume, suspend
from agent_sandbox.kube import SANDBOX, SANDBOX_CLAIM
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

NS = "lc"
POOL_REF = {
    "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
    "kind": "SandboxWarmPool",
    "name": "pool",
    "uid": "pool-uid",
    "controller": True,
}


def body(mode: str = "Running", annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "sb", "namespace": NS, "annotations": annotations or {}},
        "spec": {"operatingMode": mode, **spec},
    }


async def annotations_of(api: FakeClient) -> dict[str, str]:
    return dict((await api.get(SANDBOX, "sb", namespace=NS))["metadata"].get("annotations") or {})


@pytest.mark.parametrize("mode", ["Suspended", "Running"])
async def test_a_resume_cancels_a_pending_hibernation(mode: str) -> None:
    # Until December 6 `hibernate: "true"` stayed: the lifecycle controller archived it again right away.
    api = FakeClient()
    await api.create(SANDBOX, body(mode, {lc.ANNOTATION_HIBERNATE: "true"}), namespace=NS)
    outcome = await resume(api, "sb", NS)  # type: ignore[arg-type]
    assert outcome is (ResumeOutcome.RESUMED if mode == "Suspended" else ResumeOutcome.ALREADY_RUNNING)
    assert lc.ANNOTATION_HIBERNATE not in await annotations_of(api)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"shutdownTime": "2026-01-01T00:00:00Z"}, "has expired"),
        ({"deleting": True}, "is being deleted"),
    ],
)
async def test_expired_or_deleting_sandboxes_are_refused_at_once(change: dict[str, Any], said: str) -> None:
    # Until December 6 `lifecycle resume` waited out its whole timeout: "not Ready within 120s".
    api = FakeClient()
    obj = body("Suspended", shutdownTime=change.get("shutdownTime"))
    if change.get("deleting"):
        obj["metadata"]["finalizers"] = ["test/keep"]
    await api.create(SANDBOX, obj, namespace=NS)
    if change.get("deleting"):
        await api.delete(SANDBOX, "sb", namespace=NS)
    started = time.monotonic()
    for call in (resume, suspend, hibernate):
        with pytest.raises(Refused, match=said):
            await call(api, "sb", NS)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    assert (await api.get(SANDBOX, "sb", namespace=NS))["spec"]["operatingMode"] == "Suspended"


async def test_a_sandbox_that_expires_while_resuming_is_not_waited_for() -> None:
    api = FakeClient()
    soon = format_time(datetime.now(UTC) + timedelta(seconds=1))
    await api.create(SANDBOX, body("Suspended", shutdownTime=soon), namespace=NS)
    with pytest.raises(Refused, match="has expired"):
        await resume(api, "sb", NS, wait=30, poll=0.05)  # type: ignore[arg-type]


async def test_a_warm_pool_member_is_not_hibernated_or_suspended() -> None:
    # Until December 6 hibernate was accepted, did nothing, and hibernated whoever claimed the member; and
    # suspend was accepted, leaving the pool one warm member short for good.
    api = FakeClient()
    obj = body()
    obj["metadata"]["ownerReferences"] = [POOL_REF]
    await api.create(SANDBOX, obj, namespace=NS)
    for call in (hibernate, suspend):
        with pytest.raises(Refused, match="unclaimed member of warm pool 'pool'"):
            await call(api, "sb", NS)  # type: ignore[arg-type]
    assert lc.ANNOTATION_HIBERNATE not in await annotations_of(api)
    assert (await api.get(SANDBOX, "sb", namespace=NS))["spec"]["operatingMode"] == "Running"


CLAIM_REF = {**POOL_REF, "kind": "SandboxClaim", "name": "c", "uid": "claim-uid"}


@pytest.mark.parametrize("hibernated", [False, True])
async def test_nothing_under_an_expired_claim_is_resumed(hibernated: bool) -> None:
    # Until December 6 a restore under an expired claim was accepted: a Ready Sandbox under the expired
    # claim, or restored Sandboxes the claim controller deleted one after the other.
    api = FakeClient()
    expired = {"type": "Ready", "status": "False", "reason": "ClaimExpired", "message": "Claim expired."}
    past = {
        "lifecycle": {"shutdownTime": "2026-01-01T00:00:00Z"}
    }  # expiry is the deadline, as the claim controller's
    claim = {
        "metadata": {"name": "c", "namespace": NS, "uid": CLAIM_REF["uid"]},
        "spec": past,
        "status": {"conditions": [expired]},
    }
    await api.create(SANDBOX_CLAIM, claim, namespace=NS)
    obj = body("Suspended")
    obj["metadata"]["ownerReferences"] = [CLAIM_REF]
    if hibernated:
        archive = lc.archive_body(obj | {"metadata": {**obj["metadata"], "uid": "old"}}, cause=lc.Cause.AFTER,
                                  now=datetime.now(UTC), children=[])  # fmt: skip
        await api.create(lc.ARCHIVE, archive, namespace=NS)
    else:
        await api.create(SANDBOX, obj, namespace=NS)
    with pytest.raises(Refused, match="its SandboxClaim 'c' has expired"):
        await resume(api, "sb", NS)  # type: ignore[arg-type]
    if hibernated:
        assert "restore" not in (await api.get(lc.ARCHIVE, "sb", namespace=NS))["spec"]
    else:
        assert (await api.get(SANDBOX, "sb", namespace=NS))["spec"]["operatingMode"] == "Suspended"


async def test_a_hibernated_sandbox_is_not_suspended_or_hibernated_again() -> None:
    api = FakeClient()
    archive = {
        "apiVersion": lc.ARCHIVE.api_version,
        "kind": lc.ARCHIVE.kind,
        "metadata": {"name": "sb"},
        "spec": {},
    }
    await api.create(lc.ARCHIVE, archive, namespace=NS)
    for call in (suspend, hibernate):
        with pytest.raises(Refused, match="is hibernated already"):
            await call(api, "sb", NS)  # type: ignore[arg-type]
    past = {"sandbox": {"spec": {"shutdownTime": "2026-01-01T00:00:00Z"}}}
    await api.patch(lc.ARCHIVE, "sb", {"spec": past}, namespace=NS)
    with pytest.raises(Refused, match="has expired"):
        await resume(api, "sb", NS)  # type: ignore[arg-type]


async def test_an_expired_claim_created_again_under_the_name_is_not_the_sandboxs() -> None:
    """The Sandbox's claim was deleted (orphaning it) and a new claim took the name and expired: it is not
    the claim whose expiry ends this Sandbox, so the resume goes ahead."""
    api = FakeClient()
    expired = {"type": "Ready", "status": "False", "reason": "ClaimExpired", "message": "Claim expired."}
    claim = {
        "metadata": {"name": "c", "namespace": NS, "uid": "another-uid"},
        "spec": {"lifecycle": {"shutdownTime": "2026-01-01T00:00:00Z"}},
        "status": {"conditions": [expired]},
    }
    await api.create(SANDBOX_CLAIM, claim, namespace=NS)
    obj = body("Suspended")
    obj["metadata"]["ownerReferences"] = [CLAIM_REF]
    await api.create(SANDBOX, obj, namespace=NS)
    assert await resume(api, "sb", NS) is ResumeOutcome.RESUMED  # type: ignore[arg-type]
    assert (await api.get(SANDBOX, "sb", namespace=NS))["spec"]["operatingMode"] == "Running"
