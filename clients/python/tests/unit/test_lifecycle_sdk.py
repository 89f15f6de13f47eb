"""The SDK's part in our sandbox lifecycle (docs/lifecycle.md): what suspend() / resume() write, and what a
hibernated, expired or deleted Sandbox is called (one message at once, not a timeout or "deleted?")."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest

from agent_sandbox_sdk import (
    SandboxClaimFailedError,
    SandboxClient,
    SandboxDirectConnectionConfig,
    SandboxNotFoundError,
    SandboxRequestError,
    _calls,
)

from .fakes import NOT_FOUND, ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit

CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)
LC = "lifecycle.agents.x-k8s.io/"


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_calls, "BACKOFF_BASE", 0.001)


@dataclass
class LifecycleCluster(FakeCluster):
    """FakeCluster plus SandboxArchives, and Sandboxes that may be expired or being deleted."""

    archives: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: merged into the Sandbox a PATCH answers with (and the controller never confirms the new mode)
    stuck: dict[str, Any] | None = None

    def _kube(self, request: httpx2.Request, path: str) -> httpx2.Response:
        parts = path.split("/")
        if parts[6] == "sandboxarchives":
            obj = self.archives.get(parts[7])
            if obj is None:
                return httpx2.Response(404, json=NOT_FOUND)
            if request.method == "PATCH":
                obj["spec"].update(json.loads(request.content).get("spec", {}))
            return httpx2.Response(200, json=obj)
        if request.method == "PATCH" and self.stuck is not None and parts[6] == "sandboxes":
            obj = self.sandboxes[parts[7]]
            obj["metadata"].update(self.stuck.get("metadata", {}))
            obj["spec"].update(self.stuck.get("spec", {}))
            obj["status"] = self.stuck.get("status", {})
            return httpx2.Response(200, json=obj)
        return super()._kube(request, path)


def _patches(fake: FakeCluster) -> list[dict[str, Any]]:
    return [
        json.loads(r.content)
        for r in fake.find(lambda r: r.method == "PATCH" and "/sandboxes/" in r.url.path)
    ]


def test_suspend_records_manual_and_resume_cancels_a_pending_hibernation() -> None:
    # Until December 6 suspend() kept a previous `suspend-reason: Idle` and its time, and resume() left
    # `hibernate: "true"`: the lifecycle controller suspended and archived the resumed Sandbox again.
    fake = LifecycleCluster()
    sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    sandbox.suspend()
    sandbox.resume()
    suspend, resume = _patches(fake)
    assert suspend["metadata"]["annotations"][LC + "suspend-reason"] == "Manual"
    assert suspend["metadata"]["annotations"][LC + "suspended-at"].endswith("Z")
    assert resume["metadata"]["annotations"][LC + "resume-reason"] == "Manual"
    assert resume["metadata"]["annotations"][LC + "hibernate"] is None  # merge patch: removed


@pytest.mark.parametrize(
    ("stuck", "error", "said"),
    [
        (
            {
                "spec": {"shutdownTime": "2026-01-01T00:00:00Z"},
                "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "SandboxExpired"}]},
            },
            SandboxClaimFailedError,
            "has expired",
        ),
        ({"metadata": {"deletionTimestamp": "2026-12-05T00:00:00Z"}}, SandboxNotFoundError, "being deleted"),
    ],
)
@pytest.mark.parametrize("suspend", [True, False])
def test_an_expired_or_deleting_sandbox_fails_at_once(
    stuck: dict[str, Any], error: type[Exception], said: str, suspend: bool
) -> None:
    # Until December 6 both waited out the whole timeout (then suspend named a wrong reason, NotSuspended).
    fake = LifecycleCluster()
    sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    fake.stuck = stuck
    with pytest.raises(error, match=said):
        (sandbox.suspend if suspend else sandbox.resume)(timeout=30)
    assert not fake.find(lambda r: r.url.params.get("watch") == "true" and "/sandboxes" in r.url.path)


def _hibernated(fake: LifecycleCluster, name: str, **kept: Any) -> None:
    del fake.sandboxes[name]
    fake.archives[name] = {"metadata": {"name": name}, "spec": {"sandbox": {"spec": kept}}}


def test_a_hibernated_sandbox_is_called_hibernated_not_deleted() -> None:
    # Until December 6: "Sandbox ... not found (deleted?)" and "no longer exists (deleted, or its claim expired)".
    fake = LifecycleCluster()
    sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    assert sandbox.files is not None
    _hibernated(fake, sandbox.sandbox_id)
    with pytest.raises(SandboxNotFoundError, match=r"is hibernated .*lifecycle resume"):
        sandbox.suspend()
    fake.faults["/download/"] = [502] * 6
    with pytest.raises(SandboxRequestError, match=r"is hibernated .*agent-sandbox resume") as info:
        sandbox.files.read("a.txt")
    assert "no longer exists" not in str(info.value)


def test_an_expired_hibernated_sandbox_is_not_waited_for() -> None:
    fake = LifecycleCluster()
    sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    _hibernated(fake, sandbox.sandbox_id, shutdownTime="2026-01-01T00:00:00Z", shutdownPolicy="Retain")
    with pytest.raises(SandboxClaimFailedError, match="has expired"):
        sandbox.resume(timeout=30)


def test_a_sandbox_name_given_for_a_claim_says_so() -> None:
    # Until December 6 `agent-sandbox suspend SANDBOX` only said "SandboxClaim ... not found" (exit 3).
    fake = LifecycleCluster()
    client = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport())
    fake.sandboxes["bare"] = {"metadata": {"name": "bare"}, "spec": {}, "status": {}}
    with pytest.raises(SandboxNotFoundError, match=r"is a Sandbox, not a claim: .*lifecycle suspend"):
        client.get_sandbox("bare")
    with pytest.raises(SandboxNotFoundError, match=r"SandboxClaim default/nothing not found$"):
        client.get_sandbox("nothing")


EXPIRED_CLAIM = {"type": "Ready", "status": "False", "reason": "ClaimExpired", "message": "Claim expired."}


def test_a_hibernated_sandbox_under_an_expired_claim_is_not_restored() -> None:
    # Until December 6 the restore went ahead: a Ready Sandbox under an expired claim, or one its claim
    # controller deleted again at once.
    fake = LifecycleCluster()
    sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    claim = sandbox.claim_name
    assert claim is not None
    _hibernated(fake, sandbox.sandbox_id)
    owner = {"kind": "SandboxClaim", "name": claim, "uid": f"uid-{claim}", "controller": True}
    fake.archives[sandbox.sandbox_id]["metadata"]["ownerReferences"] = [owner]
    fake.claims[claim]["status"] = {"conditions": [EXPIRED_CLAIM]}
    fake.claims[claim]["metadata"]["uid"] = f"uid-{claim}"
    # Expiry as the claim controller reckons it (the deadline); the condition alone lags behind a moved one.
    fake.claims[claim].setdefault("spec", {})["lifecycle"] = {"shutdownTime": "2026-01-01T00:00:00Z"}
    with pytest.raises(SandboxClaimFailedError, match="has expired: it will not be restored"):
        sandbox.resume(timeout=30)
    assert not fake.find(lambda r: r.url.params.get("watch") == "true" and "/sandboxes" in r.url.path)


def test_an_expired_claim_without_its_sandbox_is_said_at_once() -> None:
    # Until December 6 `agent-sandbox resume CLAIM` waited the whole resolve timeout, then said "not bound".
    fake = LifecycleCluster(bind=False, claim_conditions=[EXPIRED_CLAIM])
    client = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport())
    fake.claims["gone"] = {"metadata": {"name": "gone", "resourceVersion": "5"}, "spec": {}, "status": {}}
    fake.claims["gone"]["status"] = {"conditions": [EXPIRED_CLAIM]}
    with pytest.raises(SandboxNotFoundError, match="has expired"):
        client.get_sandbox("gone", resolve_timeout=5)
    assert not fake.find(lambda r: r.url.params.get("watch") == "true")


def test_claim_expiry_is_the_claim_controllers_deadline_not_the_condition() -> None:
    from datetime import UTC, datetime

    from agent_sandbox_sdk._lifecycle import _claim_is_expired

    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    moved = {
        "spec": {"lifecycle": {"shutdownTime": "2026-12-06T13:00:00Z"}},
        "status": {"conditions": [EXPIRED_CLAIM]},
    }
    assert not _claim_is_expired(moved, now)  # marked, then its deadline moved later: not expired
    finished = {"type": "Finished", "status": "True", "lastTransitionTime": "2026-12-06T11:59:00Z"}
    ttl = {"spec": {"lifecycle": {"ttlSecondsAfterFinished": 30}}, "status": {"conditions": [finished]}}
    assert _claim_is_expired(ttl, now)
    assert _claim_is_expired({"spec": {"lifecycle": {"shutdownTime": "2026-12-06T11:00:00z"}}}, now)
    assert not _claim_is_expired({"spec": {}}, now)
