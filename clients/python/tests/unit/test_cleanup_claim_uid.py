"""Exit cleanup deletes the auto-named claims this client created - those claims, by UID, and no other.

A claim name is not an identity: an auto-named claim can be deleted behind the client's back (expiry, kubectl,
the CLI) and its name used again, by another program or by this one with an explicit `claim_name`. Until
December 6 (a) `get_sandbox()` of such a re-creation got a handle "auto-named" after the tracked one, (b) so did
an explicitly named `create_sandbox()`, and (c) a closed stale handle's cleanup deleted the re-creation by name:
each deleted a claim this client never created at exit.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx2
import pytest

from agent_sandbox_sdk import AsyncSandboxClient, SandboxClient, SandboxDirectConnectionConfig
from agent_sandbox_sdk._driver import SyncDriver

from .fakes import ROUTER, FakeCluster, endpoint, ready_condition

CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)
MODES = ["sync", "async", "async-atexit"]


class Client:
    """One client driven the same way in each mode; `exit()` is its cleanup: the sync client's `with` exit,
    the async client's `async with` exit, or the async client's interpreter-exit hook (`cleanup=True`)."""

    def __init__(self, fake: FakeCluster, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mode = mode
        self.sync: SandboxClient | None = None
        self.aio: AsyncSandboxClient | None = None
        if mode == "sync":
            self.sync = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport())
            return
        from agent_sandbox_sdk import async_sandbox_client

        monkeypatch.setattr(
            async_sandbox_client, "SyncDriver", lambda kube: SyncDriver(kube, transport=fake.transport())
        )
        self.loop = asyncio.new_event_loop()
        self.aio = AsyncSandboxClient(
            CONFIG, api_client=endpoint(), transport=fake.transport(), cleanup=False
        )

    def _run(self, sync_call: Any, async_call: Any) -> Any:
        if self.sync is not None:
            return sync_call(self.sync)
        return self.loop.run_until_complete(async_call(self.aio))

    def create(self, **kw: Any) -> Any:
        return self._run(
            lambda c: c.create_sandbox("python-pool", **kw), lambda c: c.create_sandbox("python-pool", **kw)
        )

    def get(self, name: str) -> Any:
        return self._run(lambda c: c.get_sandbox(name), lambda c: c.get_sandbox(name))

    def close(self) -> None:
        self._run(lambda c: c.close(), lambda c: c.close())

    def exit(self) -> None:
        if self.sync is not None:
            self.sync.__exit__(None, None, None)
            return
        assert self.aio is not None
        if self.mode == "async":
            self.loop.run_until_complete(self.aio.__aexit__(None, None, None))
        else:
            self.aio._cleanup_at_exit()
            self.loop.run_until_complete(self.aio._driver.aclose())  # the loop's pooled connections
        self.loop.close()


def recreate_elsewhere(fake: FakeCluster, name: str) -> None:
    """Another program deletes the claim and creates its own under the same name (a new UID)."""
    del fake.claims[name]
    fake.claims[name] = {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": name, "namespace": "default", "uid": "someone-elses", "resourceVersion": "999"},
        "spec": {"warmPoolRef": {"name": "python-pool"}},
        "status": {
            "sandbox": {"name": name, "podIPs": [fake.pod_ip]},
            "conditions": [ready_condition()],
        },
    }


def claim_deletes(fake: FakeCluster) -> list[httpx2.Request]:
    return fake.find(lambda r: r.method == "DELETE" and "/sandboxclaims/" in r.url.path)


def precondition(request: httpx2.Request) -> Any:
    return (json.loads(request.content) if request.content else {}).get("preconditions", {}).get("uid")


@pytest.mark.parametrize("mode", MODES)
def test_an_auto_named_claim_is_deleted_at_exit_with_its_uid_as_precondition(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCluster()
    client = Client(fake, mode, monkeypatch)
    sandbox = client.create()
    name = sandbox.claim_name
    uid = fake.claims[name]["metadata"]["uid"]
    client.exit()
    assert name not in fake.claims
    assert [precondition(r) for r in claim_deletes(fake)] == [uid]


@pytest.mark.parametrize("mode", MODES)
def test_a_same_name_claim_of_someone_else_got_after_close_is_not_deleted_at_exit(
    mode: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """(a) The auto-named claim this client created is replaced by another program's (same name, new UID);
    `get_sandbox()` of it is a handle on someone else's claim, which cleanup leaves alone."""
    fake = FakeCluster()
    client = Client(fake, mode, monkeypatch)
    name = client.create().claim_name
    client.close()
    recreate_elsewhere(fake, name)
    again = client.get(name)
    assert again.is_active
    assert not again._state.auto_named
    with caplog.at_level(logging.WARNING, logger="agent_sandbox_sdk"):
        client.exit()
    assert fake.claims[name]["metadata"]["uid"] == "someone-elses"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


@pytest.mark.parametrize("mode", MODES)
def test_an_explicitly_named_create_over_a_vanished_auto_named_claim_is_only_disconnected(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(b) The auto-named claim goes away without this client; the program creates one under that name
    explicitly. An explicit name is the caller's: cleanup only disconnects it."""
    fake = FakeCluster()
    client = Client(fake, mode, monkeypatch)
    name = client.create().claim_name
    del fake.claims[name]  # expired, or deleted with kubectl / the CLI
    explicit = client.create(claim_name=name)
    assert not explicit._state.auto_named
    client.exit()
    assert name in fake.claims
    assert not explicit.is_active or mode == "async-atexit"  # the exit hook only deletes


@pytest.mark.parametrize("mode", MODES)
def test_an_explicitly_named_adoption_of_an_own_auto_named_claim_is_only_disconnected(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`create_sandbox(claim_name=X, adopt_existing=True)` names the claim explicitly, whoever made it: the
    documented rule (explicit names are only disconnected) holds."""
    fake = FakeCluster()
    client = Client(fake, mode, monkeypatch)
    name = client.create().claim_name
    client.close()
    adopted = client.create(claim_name=name, adopt_existing=True)
    assert not adopted._state.auto_named
    client.exit()
    assert name in fake.claims


@pytest.mark.parametrize("mode", MODES)
def test_a_stale_auto_named_handle_does_not_delete_a_same_name_recreation_at_exit(
    mode: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """(c) Nothing got it again: the closed handle's claim was replaced by another program's under the same
    name. Cleanup's DELETE carries the UID of the claim this client created; the API server refuses it (409,
    precondition failed), and that is left alone quietly - it is not this client's claim."""
    fake = FakeCluster()
    client = Client(fake, mode, monkeypatch)
    sandbox = client.create()
    name = sandbox.claim_name
    uid = fake.claims[name]["metadata"]["uid"]
    client.close()
    recreate_elsewhere(fake, name)
    with caplog.at_level(logging.WARNING, logger="agent_sandbox_sdk"):
        client.exit()
    assert fake.claims[name]["metadata"]["uid"] == "someone-elses"
    assert [precondition(r) for r in claim_deletes(fake)] == [uid]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_terminate_of_a_stale_handle_leaves_a_same_name_recreation_alone(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An explicit `terminate()` means "delete this sandbox": the claim the handle was made for, by UID. Its
    claim replaced by another program's under the same name, the handle's terminate left that one alone only
    at the client's exit; until December 6 an explicit `terminate()` deleted it by name."""
    fake = FakeCluster()
    client = Client(fake, mode, monkeypatch)
    sandbox = client.create(claim_name="mine")
    uid = fake.claims["mine"]["metadata"]["uid"]
    recreate_elsewhere(fake, "mine")
    if mode == "sync":
        sandbox.terminate()
    else:
        client.loop.run_until_complete(sandbox.terminate())
    assert fake.claims["mine"]["metadata"]["uid"] == "someone-elses"
    assert [precondition(r) for r in claim_deletes(fake)] == [uid]
    assert not sandbox.is_active
    sandbox.terminate() if mode == "sync" else client.loop.run_until_complete(sandbox.terminate())
    assert len(claim_deletes(fake)) == 1  # idempotent: nothing left to delete
    client.exit()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_get_sandbox_of_a_claim_made_again_under_the_name_is_a_new_handle_on_it(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold start's Sandbox is named after its claim, so a claim made again under the name has a Sandbox of
    the same name: `get_sandbox` returned the tracked handle of the old claim (its UID), whose `terminate()`
    then left the new claim alone (a review of the terminate-by-UID change). It is a new handle on the new
    claim now, and the stale one is disconnected."""
    fake = FakeCluster()
    client = Client(fake, mode, monkeypatch)
    old = client.create(claim_name="mine")
    old_uid = fake.claims["mine"]["metadata"]["uid"]
    recreate_elsewhere(fake, "mine")
    again = client.get("mine")
    assert again is not old
    assert again._state.claim_uid == "someone-elses"
    assert not old.is_active
    if mode == "sync":
        again.terminate()
    else:
        client.loop.run_until_complete(again.terminate())
    assert "mine" not in fake.claims
    assert [precondition(r) for r in claim_deletes(fake)] == ["someone-elses"]
    assert old_uid != "someone-elses"
    client.exit()
