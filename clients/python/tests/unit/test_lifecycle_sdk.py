"""The SDK's part in our sandbox lifecycle (docs/lifecycle.md): what suspend() / resume() write, and what a
hibernated, expired or deleted Sandbox is called (one message at once, not a timeout or "deleted?")."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest

from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClaimFailedError,
    SandboxClient,
    SandboxdDirectConnectionConfig,
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
    #: a lifecycle router's refusal: every router request is answered 503 with this `detail`
    refusal: str | None = None

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        if self.refusal is not None and request.url.host != "kube.test":
            self.requests.append(request)
            return httpx2.Response(503, json={"detail": self.refusal}, headers={"Retry-After": "5"})
        return super().handle(request)

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
    # Refused before any write: until December 6 the archive kept the restore request (RESTORE Manual).
    assert "restore" not in fake.archives[sandbox.sandbox_id]["spec"]
    assert not _archive_writes(fake)


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


def _archive_writes(fake: FakeCluster) -> list[httpx2.Request]:
    return fake.find(lambda r: r.method != "GET" and "/sandboxarchives/" in r.url.path)


@pytest.mark.parametrize(
    ("kept", "meta", "error", "said"),
    [
        (  # its shutdownTime passed
            {"shutdownTime": "2026-01-01T00:00:00Z", "shutdownPolicy": "Retain"},
            {},
            SandboxClaimFailedError,
            r"has expired \(its shutdownTime .* it will not be restored",
        ),
        (  # marked by the controller, whose clock says it passed (this one does not)
            {"shutdownTime": "2999-01-01T00:00:00Z", "shutdownPolicy": "Retain"},
            {"annotations": {LC + "expired-at": "2026-12-06T10:00:00Z"}},
            SandboxClaimFailedError,
            r"marked lifecycle.agents.x-k8s.io/expired-at=2026-12-06T10:00:00Z\): it will not be restored",
        ),
        ({}, {"deletionTimestamp": "2026-12-06T10:00:00Z"}, SandboxNotFoundError, "is being deleted"),
    ],
    ids=["shutdown-time", "expired-at", "deleting"],
)
def test_an_archive_never_restored_gets_no_restore_request(
    kept: dict[str, Any], meta: dict[str, Any], error: type[Exception], said: str
) -> None:
    # Until December 6 resume() wrote `spec.restore` (RESTORE column Manual) on the archive it then said
    # would never be restored; the CLI, the router and the Go SDK refuse before any write.
    fake = LifecycleCluster()
    sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    _hibernated(fake, sandbox.sandbox_id, **kept)
    fake.archives[sandbox.sandbox_id]["metadata"].update(meta)
    with pytest.raises(error, match=said):
        sandbox.resume(timeout=30)
    assert "restore" not in fake.archives[sandbox.sandbox_id]["spec"]
    assert not _archive_writes(fake)


def test_a_restorable_hibernated_sandbox_gets_its_restore_request() -> None:
    fake = LifecycleCluster()
    sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    _hibernated(fake, sandbox.sandbox_id, shutdownTime="2999-01-01T00:00:00Z")
    sandbox.resume(wait=False)
    restore = fake.archives[sandbox.sandbox_id]["spec"]["restore"]
    assert restore["cause"] == "Manual"
    assert restore["requestedAt"].endswith("Z")
    (write,) = _archive_writes(fake)
    assert write.method == "PATCH"
    assert write.headers["content-type"] == "application/merge-patch+json"
    assert json.loads(write.content) == {"spec": {"restore": restore}}


def test_resume_without_sandbox_or_archive_is_not_found() -> None:
    fake = LifecycleCluster()
    sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    del fake.sandboxes[sandbox.sandbox_id]
    with pytest.raises(SandboxNotFoundError, match="no Sandbox or hibernated Sandbox named"):
        sandbox.resume(timeout=30)
    assert not _archive_writes(fake)


REFUSAL = (
    "Sandbox default/{} could not be resumed: it is hibernated and has expired "
    "(its archive is marked lifecycle.agents.x-k8s.io/expired-at=2026-12-06T10:00:00Z)"
)


def _refused(fake: LifecycleCluster, sandbox_id: str) -> str:
    """`sandbox_id` hibernated and expired, as a lifecycle router says of it from now on; the refusal."""
    _hibernated(fake, sandbox_id, shutdownTime="2026-01-01T00:00:00Z", shutdownPolicy="Retain")
    fake.refusal = REFUSAL.format(sandbox_id)
    fake.requests.clear()
    return fake.refusal


def _op(sandbox: Any, op: str) -> Any:
    """`op` on a `Sandbox` or `AsyncSandbox` (a coroutine for the latter)."""
    files, commands = sandbox.files, sandbox.commands
    calls: dict[str, Callable[[], Any]] = {
        "run": lambda: commands.run("true"),
        "read": lambda: files.read("a.txt"),
        "exists": lambda: files.exists("a.txt"),
        "list": lambda: files.list("."),
        "write": lambda: files.write("a.txt", b"x"),
        "delete": lambda: files.delete("a.txt"),
    }
    return calls[op]()


SANDBOXD = SandboxdDirectConnectionConfig(api_url=ROUTER)


@pytest.mark.parametrize(
    ("op", "config"),
    [
        *((op, CONFIG) for op in ("read", "exists", "list", "write", "delete", "run")),
        # sandboxd: HEAD (exists) and PUT (write); its commands go over gRPC, not this transport
        *((op, SANDBOXD) for op in ("read", "exists", "list", "write", "delete")),
    ],
    ids=lambda v: v if isinstance(v, str) else "sandboxd" if v is SANDBOXD else "legacy",
)
def test_a_routers_could_not_be_resumed_is_raised_as_it_is(op: str, config: Any) -> None:
    # The router said why, and that it never will: until December 6 a GET/HEAD/PUT/DELETE read the Sandbox
    # and its archive (two API reads), was retried, and then added "restore it with the handle's resume()"
    # (a POST, never retried, was raised as it is already).
    fake = LifecycleCluster()
    sandbox = SandboxClient(config, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    refusal = _refused(fake, sandbox.sandbox_id)
    with pytest.raises(SandboxRequestError) as info:
        _op(sandbox, op)
    assert info.value.status_code == 503
    assert str(info.value).endswith(f": HTTP 503: {refusal}"), str(info.value)
    assert "restore it with" not in str(info.value)
    assert len(fake.requests) == 1, fake.requests  # the router's answer: no retry, no Sandbox or archive read


@pytest.mark.parametrize("op", ["read", "exists", "list"])
def test_a_routers_could_not_be_resumed_is_raised_as_it_is_async(op: str) -> None:
    fake = LifecycleCluster()

    async def main() -> tuple[str, SandboxRequestError, list[httpx2.Request]]:
        client = AsyncSandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport(), cleanup=False)
        async with client:  # its exit deletes the claim: the requests of the call are taken before
            sandbox = await client.create_sandbox("p")
            refusal = _refused(fake, sandbox.sandbox_id)
            with pytest.raises(SandboxRequestError) as info:
                await _op(sandbox, op)
            return refusal, info.value, list(fake.requests)

    refusal, err, sent = asyncio.run(main())
    assert str(err).endswith(f": HTTP 503: {refusal}"), str(err)
    assert "restore it with" not in str(err)
    assert len(sent) == 1, sent
