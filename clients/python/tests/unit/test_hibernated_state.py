"""A hibernated Sandbox (only its SandboxArchive left, the claim `Ready=False/SandboxHibernated`) is called
hibernated by `list_sandboxes`/`get_sandbox_info` (`suspended` True) and `Sandbox.status()`, not deleted
(docs/lifecycle.md). Until December 6 `agent-sandbox list` showed it `SUSPENDED false` and `status()` said
`("SandboxNotFound", "Sandbox object not found in Kubernetes.")`."""

from __future__ import annotations

from typing import Any

import pytest

from agent_sandbox_sdk import AsyncSandboxClient, SandboxClient
from agent_sandbox_sdk._inventory import sandbox_info

from .fakes import FakeCluster, endpoint, ready_condition
from .test_flows import CONFIG, run_async
from .test_lifecycle_sdk import LifecycleCluster

pytestmark = pytest.mark.unit

HIBERNATED_SANDBOX = "lifecycle.agents.x-k8s.io/hibernated-sandbox"
HIBERNATED = ready_condition(
    "False",
    "SandboxHibernated",
    'Sandbox "sb" is hibernated; a request through the router (auto-resume) or '
    "`agent-sandbox lifecycle resume sb` restores it",
)


def _claim(
    *, bound: str | None = "sb", conditions: list[dict[str, Any]], marked: bool = False
) -> dict[str, Any]:
    annotations = {HIBERNATED_SANDBOX: "sb"} if marked else {}
    status: dict[str, Any] = {"conditions": conditions}
    if bound:
        status["sandbox"] = {"name": bound}
    return {
        "metadata": {"name": "c", "namespace": "ns", "annotations": annotations},
        "spec": {"warmPoolRef": {"name": "pool"}},
        "status": status,
    }


def test_a_hibernated_claims_row_says_suspended() -> None:
    assert sandbox_info(_claim(conditions=[HIBERNATED], marked=True), {}).suspended is True
    # The condition alone (the annotation not read: an older controller), or the mark alone (the condition
    # not written yet): hibernated all the same.
    assert sandbox_info(_claim(conditions=[HIBERNATED]), {}).suspended is True
    assert sandbox_info(_claim(conditions=[ready_condition()], marked=True), {}).suspended is True


def test_a_missing_sandbox_not_hibernated_is_not_suspended() -> None:
    # Deleted, or not in the list yet (the claim controller makes it again): not suspended, as before. None
    # stays "Sandboxes not readable", which the CLI explains in a note (it would be wrong here).
    assert sandbox_info(_claim(conditions=[ready_condition()]), {}).suspended is False


def test_rows_with_their_sandbox_or_without_one_are_unchanged() -> None:
    claim = _claim(conditions=[ready_condition()])
    running = {"metadata": {"name": "sb", "namespace": "ns"}, "spec": {"operatingMode": "Running"}}
    suspended = {"metadata": {"name": "sb", "namespace": "ns"}, "spec": {"operatingMode": "Suspended"}}
    assert sandbox_info(claim, {("ns", "sb"): running}).suspended is False
    assert sandbox_info(claim, {("ns", "sb"): suspended}).suspended is True
    # Restored (the Sandbox is back, the claim not unmarked yet): the Sandbox's own mode.
    marked = _claim(conditions=[HIBERNATED], marked=True)
    assert sandbox_info(marked, {("ns", "sb"): running}).suspended is False
    # Not bound yet: no Sandbox to be suspended.
    assert sandbox_info(_claim(bound=None, conditions=[]), {}).suspended is False
    # Sandboxes not readable (a role granting claims only): unknown, as before.
    assert sandbox_info(claim, None).suspended is None


def _hibernate(fake: FakeCluster, claim: str, sandbox: str, *, archive: bool) -> None:
    """As the lifecycle controller leaves it: the Sandbox gone (into an archive), the claim marked."""
    del fake.sandboxes[sandbox]
    if archive:
        assert isinstance(fake, LifecycleCluster)
        fake.archives[sandbox] = {"metadata": {"name": sandbox}, "spec": {"sandbox": {"spec": {}}}}
    meta = fake.claims[claim]["metadata"]
    meta.setdefault("annotations", {})[HIBERNATED_SANDBOX] = sandbox
    fake.claims[claim]["status"] = {"sandbox": {"name": sandbox}, "conditions": [HIBERNATED]}


def test_list_and_get_say_a_hibernated_sandbox_is_suspended() -> None:
    fake = LifecycleCluster()
    client = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport())
    sandbox = client.create_sandbox("p")
    claim = sandbox.claim_name
    assert claim is not None
    _hibernate(fake, claim, sandbox.sandbox_id, archive=True)
    (row,) = client.list_sandboxes("default")
    assert (row.sandbox_id, row.suspended, row.reason) == (sandbox.sandbox_id, True, "SandboxHibernated")
    assert client.get_sandbox_info(claim).suspended is True


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("archive", [True, False], ids=["archive", "claim-mark-only"])
def test_status_of_a_hibernated_sandbox_says_hibernated(mode: str, archive: bool) -> None:
    """Upstream's shape, (status, message): not ready, and how to restore it. The claim's mark suffices when
    the archive cannot be read (a role without `get sandboxarchives`, here: none served)."""
    fake = LifecycleCluster() if archive else FakeCluster()
    if mode == "sync":
        sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
        assert sandbox.claim_name is not None
        _hibernate(fake, sandbox.claim_name, sandbox.sandbox_id, archive=archive)
        status = sandbox.status()
    else:

        async def body(client: AsyncSandboxClient) -> tuple[str, str]:
            sandbox = await client.create_sandbox("p")
            assert sandbox.claim_name is not None
            _hibernate(fake, sandbox.claim_name, sandbox.sandbox_id, archive=archive)
            return await sandbox.status()

        status = run_async(fake, body)
    state, message = status
    assert state == "SandboxNotReady"
    assert message.startswith("Sandbox default/sandbox-claim-"), message
    assert "is hibernated (archived, volumes kept): restore it with the handle's resume()" in message


def test_status_of_a_deleted_sandbox_with_a_claim_not_marked_is_not_found() -> None:
    fake = LifecycleCluster()
    sandbox = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox("p")
    del fake.sandboxes[sandbox.sandbox_id]
    assert sandbox.status() == ("SandboxNotFound", "Sandbox object not found in Kubernetes.")
