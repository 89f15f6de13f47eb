"""The SDK's part in our sandbox lifecycle (docs/lifecycle.md): what suspend() / resume() write, and what a
hibernated, expired or deleted Sandbox is called (one message at once, not a timeout or "deleted?")."""

from __future__ import annotations

import asyncio
import json
import re
import time
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
    SandboxModeChangedError,
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
    # A failed claim, as `create_sandbox` says it (until December 6 wrapped in SandboxNotFoundError, named twice).
    with pytest.raises(SandboxClaimFailedError, match=r"^SandboxClaim default/gone has expired"):
        client.get_sandbox("gone", resolve_timeout=5)
    assert not fake.find(lambda r: r.url.params.get("watch") == "true")


def test_claim_expiry_is_the_claim_controllers_deadline_not_the_condition() -> None:
    from datetime import UTC, datetime

    from agent_sandbox_sdk._expiry import claim_is_expired as _claim_is_expired

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


@dataclass
class OvertakenCluster(LifecycleCluster):
    """Our PATCH is applied (generation G) but not yet confirmed when another writer sets `spec.operatingMode`
    back (generation G+1) with its own record (`others`): a lifecycle router resuming the Sandbox for a
    request, the lifecycle controller suspending it as idle. `flip=False`: the other write leaves the mode as
    we set it (another spec field), and the controller then confirms it."""

    others: dict[str, str] = field(default_factory=dict)
    flip: bool = True

    def _kube(self, request: httpx2.Request, path: str) -> httpx2.Response:
        parts = path.split("/")
        if request.method != "PATCH" or len(parts) < 8 or parts[6] != "sandboxes":
            return super()._kube(request, path)
        obj = self.sandboxes[parts[7]]
        patch = json.loads(request.content)
        annotations = obj["metadata"].setdefault("annotations", {})
        for key, value in patch["metadata"]["annotations"].items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        obj["spec"].update(patch["spec"])
        gen = obj["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        obj["metadata"]["resourceVersion"] = self._next_rv()
        answer = json.loads(json.dumps(obj))  # ours, as the API server answered it
        mode = patch["spec"]["operatingMode"]
        if self.flip:
            obj["spec"]["operatingMode"] = "Running" if mode == "Suspended" else "Suspended"
        else:
            obj["spec"]["shutdownTime"] = "2999-01-01T00:00:00Z"
            want = "Suspended" if mode == "Suspended" else "Ready"
            obj["status"]["conditions"] = [{"type": want, "status": "True", "observedGeneration": gen + 1}]
        annotations.update(self.others)
        obj["metadata"]["generation"] = gen + 1
        obj["metadata"]["resourceVersion"] = self._next_rv()
        return httpx2.Response(200, json=answer)


def _suspend_or_resume(fake: FakeCluster, mode: str, suspend: bool) -> None:
    """`suspend(timeout=3)`, or `resume(timeout=3)` of a suspended Sandbox, through the sync or async client."""
    if mode == "sync":
        sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
        if not suspend:
            fake.sandboxes[sandbox.sandbox_id]["spec"]["operatingMode"] = "Suspended"
        (sandbox.suspend if suspend else sandbox.resume)(timeout=3)
        return

    async def main() -> None:
        client = AsyncSandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport(), cleanup=False)
        async with client:
            sandbox = await client.create_sandbox("p")
            if not suspend:
                fake.sandboxes[sandbox.sandbox_id]["spec"]["operatingMode"] = "Suspended"
            await (sandbox.suspend if suspend else sandbox.resume)(timeout=3)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("suspend", "others", "said"),
    [
        (
            True,
            {LC + "resume-reason": "Request", LC + "resumed-at": "2026-12-06T10:00:01.5Z"},
            r"was set back to Running .*resume-reason: Request.* a lifecycle router resumed it for a request",
        ),
        (
            False,
            {LC + "suspend-reason": "Idle", LC + "suspended-at": "2026-12-06T10:00:01.5Z"},
            r"was set back to Suspended .*suspend-reason: Idle.* the lifecycle controller suspended it as idle",
        ),
        (True, {}, r"was set back to Running .* by a writer that recorded no resume-reason"),
    ],
    ids=["suspend-resumed-by-a-request", "resume-suspended-as-idle", "suspend-undone-unrecorded"],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_suspend_or_resume_undone_by_another_writer_fails_at_once(
    suspend: bool, others: dict[str, str], said: str, mode: str
) -> None:
    """A suspend of an auto-resume Sandbox still in use is undone by the router within a second; a resume can
    be undone by the idle controller. Until December 6 the wait ran out its whole timeout and then said
    "not Suspended within 20 s: Suspended=False, reason NotSuspended", naming neither the undo nor its author."""
    fake = OvertakenCluster(others=others)
    started = time.monotonic()
    with pytest.raises(SandboxModeChangedError, match=said) as info:
        _suspend_or_resume(fake, mode, suspend)
    assert time.monotonic() - started < 2  # at once, not after the timeout
    assert info.value.operating_mode == ("Running" if suspend else "Suspended")
    assert info.value.changed_by == next((v for k, v in others.items() if k.endswith("-reason")), None)
    assert not isinstance(info.value, TimeoutError)


@pytest.mark.parametrize("suspend", [True, False])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_later_write_that_keeps_the_mode_is_waited_through(suspend: bool, mode: str) -> None:
    # Another spec field written after ours (generation G+1, the mode as we set it): not an undo.
    _suspend_or_resume(OvertakenCluster(flip=False), mode, suspend)


@dataclass
class TemplatedCluster(LifecycleCluster):
    """LifecycleCluster plus SandboxTemplates (the fake otherwise serves every other plural as Sandboxes)."""

    templates: dict[str, dict[str, Any]] = field(default_factory=dict)

    def _kube(self, request: httpx2.Request, path: str) -> httpx2.Response:
        parts = path.split("/")
        if len(parts) > 7 and parts[6] == "sandboxtemplates" and request.method == "GET":
            obj = self.templates.get(parts[7])
            return httpx2.Response(200, json=obj) if obj else httpx2.Response(404, json=NOT_FOUND)
        return super()._kube(request, path)


AUTO_RESUME = LC + "auto-resume"
TEMPLATE_REF = "agents.x-k8s.io/sandbox-template-ref"


@pytest.mark.parametrize(
    ("own", "template", "said", "not_said"),
    [
        (  # asked for, on the Sandbox: what is missing is a router that resumes
            {AUTO_RESUME: "true"},
            None,
            r'it asks to be resumed on request \(lifecycle.agents.x-k8s.io/auto-resume: "true" on the Sandbox\)'
            r".*this request did not go through a router running --sandbox-lifecycle",
            "annotate",
        ),
        (  # asked for on its template
            {},
            {AUTO_RESUME: "true"},
            r"it asks to be resumed on request \(lifecycle.agents.x-k8s.io/auto-resume: \"true\" on its "
            r"SandboxTemplate default/tmpl\).*did not go through a router running --sandbox-lifecycle",
            "annotate",
        ),
        (  # not asked for anywhere: what is missing is the opt-in (the router may well run the flag)
            {},
            {},
            r"for resume on request, annotate the Sandbox or its SandboxTemplate default/tmpl with "
            r'lifecycle.agents.x-k8s.io/auto-resume: "true" \(served by a router running --sandbox-lifecycle\)',
            "did not go through",
        ),
        (  # switched off on the Sandbox, over its template's
            {AUTO_RESUME: "false"},
            {AUTO_RESUME: "true"},
            r'resume on request is off: lifecycle.agents.x-k8s.io/auto-resume: "false" on the Sandbox',
            "did not go through",
        ),
        (  # the router's rule: "true" or "false" in any case, nothing else - "True" is on
            {AUTO_RESUME: "True"},
            None,
            r'it asks to be resumed on request \(lifecycle.agents.x-k8s.io/auto-resume: "True" on the Sandbox\)',
            "annotate",
        ),
        (  # ... and "true " (a trailing space) is not a value the router takes: off, and said why
            {AUTO_RESUME: "true "},
            {AUTO_RESUME: "true"},
            r'resume on request is off: lifecycle.agents.x-k8s.io/auto-resume: "true " on the Sandbox is not a '
            r'valid value \(want "true" or "false"; the router reads any other value as "false"\)',
            "did not go through",
        ),
        (  # an invalid value on the template, quoted as it is
            {},
            {AUTO_RESUME: "yes"},
            r'resume on request is off: lifecycle.agents.x-k8s.io/auto-resume: "yes" on its SandboxTemplate '
            r'default/tmpl is not a valid value \(want "true" or "false"',
            "did not go through",
        ),
    ],
    ids=["own", "template", "none", "own-off", "own-true-any-case", "own-invalid-space", "template-invalid"],
)
def test_the_suspended_advice_names_the_auto_resume_opt_in(
    own: dict[str, str], template: dict[str, str] | None, said: str, not_said: str
) -> None:
    """Until December 6 the advice was always "or run the router with --sandbox-lifecycle to resume it on
    request", also through a router that runs it: the missing piece was the Sandbox's opt-in annotation."""
    fake = TemplatedCluster()
    sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    assert sandbox.files is not None
    obj = fake.sandboxes[sandbox.sandbox_id]
    obj["spec"]["operatingMode"] = "Suspended"
    obj["metadata"]["annotations"] = {**own, TEMPLATE_REF: "tmpl"}
    fake.templates["tmpl"] = {"metadata": {"name": "tmpl", "annotations": template or {}}}
    fake.faults["/download/"] = [502] * 6
    with pytest.raises(
        SandboxRequestError, match=r"is suspended .*resume it \(the handle's resume\(\)"
    ) as info:
        sandbox.files.read("a.txt")
    assert re.search(said, str(info.value)), str(info.value)
    assert not_said not in str(info.value)
    template_reads = fake.find(lambda r: "/sandboxtemplates/" in r.url.path)
    assert len(template_reads) == (0 if AUTO_RESUME in own else 1)  # the Sandbox's own value wins


def test_the_suspended_advice_without_a_readable_template_names_both_places() -> None:
    fake = TemplatedCluster()
    sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    assert sandbox.files is not None
    fake.sandboxes[sandbox.sandbox_id]["spec"]["operatingMode"] = "Suspended"
    fake.faults["/download/"] = [502] * 6
    with pytest.raises(SandboxRequestError) as info:
        sandbox.files.read("a.txt")
    assert (
        "for resume on request, annotate the Sandbox or its SandboxTemplate with "
        'lifecycle.agents.x-k8s.io/auto-resume: "true"' in str(info.value)
    ), str(info.value)
