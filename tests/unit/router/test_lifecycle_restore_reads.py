"""What `RouterLifecycle.hold` of a hibernated Sandbox costs the API server, and how long it may take.

Until December 6 every resume task of an archive the controller will never restore read the archive and its
claim again (uncached: the router's archive view keeps neither its annotations nor its owners), and an
`expired-at` archive is kept indefinitely, so steady traffic cost two API reads per request forever; and a
held request checked whether its restore had ended with its own unbounded reads on every wake, so a slow API
server held it long past its deadline.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.kube import SANDBOX, SANDBOX_CLAIM, ResourceKind
from agent_sandbox.kube.testing import FakeClient
from agent_sandbox.router._lifecycle import ResumeFailed, RouterLifecycle
from agent_sandbox.router._lifecycle_state import _diet_archive, archive_view
from tests.unit.router.test_lifecycle_restore_refusal import PAST, ROUTE, archive, claim, lifecycle_over

pytestmark = pytest.mark.unit


class Clock:
    """The lifecycle's wall clock, moved by hand."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def lc_now(clock: Clock) -> datetime:
    return datetime.fromtimestamp(clock(), UTC)


def reads(api: FakeClient, kind: ResourceKind) -> int:
    return sum(1 for verb, k, _ns, _name in api.actions if verb == "get" and k == kind.kind)


async def refused(lifecycle: RouterLifecycle) -> None:
    with pytest.raises(ResumeFailed, match="could not be resumed: it is hibernated and"):
        await asyncio.wait_for(lifecycle.hold(ROUTE, asyncio.get_running_loop().time() + 30), 3)


async def test_an_expired_at_archive_is_read_once_not_per_request() -> None:
    api = FakeClient()
    marked = archive(annotations={lc.ANNOTATION_EXPIRED_AT: "2026-12-06T10:00:00Z"}, claim="c1")
    stored = await api.create(lc.ARCHIVE, marked, namespace="team")
    clock = Clock()
    lifecycle = lifecycle_over(api, stored, clock)
    for _ in range(5):
        await refused(lifecycle)
    clock.offset = 3600  # the mark is final: no time-to-live
    await refused(lifecycle)
    assert (reads(api, lc.ARCHIVE), reads(api, SANDBOX_CLAIM)) == (1, 0)

    # another version of the archive (the informer shows it): decided again
    stored = await api.patch(lc.ARCHIVE, "sb", {"metadata": {"labels": {"x": "y"}}}, namespace="team")
    lifecycle.state.archives[("team", "sb")] = archive_view(_diet_archive(stored))
    await refused(lifecycle)
    assert reads(api, lc.ARCHIVE) == 2
    await lifecycle.close()


async def test_a_claim_verdict_is_kept_for_a_while_then_read_again() -> None:
    api = FakeClient()
    await api.create(SANDBOX_CLAIM, claim("c1", PAST), namespace="team")
    stored = await api.create(lc.ARCHIVE, archive(claim="c1"), namespace="team")
    clock = Clock()
    lifecycle = lifecycle_over(api, stored, clock)
    for _ in range(5):
        await refused(lifecycle)
    assert (reads(api, lc.ARCHIVE), reads(api, SANDBOX_CLAIM)) == (1, 1)
    clock.offset = 60  # past the verdict's time-to-live: the claim may have been edited meanwhile
    await refused(lifecycle)
    assert (reads(api, lc.ARCHIVE), reads(api, SANDBOX_CLAIM)) == (2, 2)
    await lifecycle.close()


async def test_a_live_claim_is_read_again_at_its_expiry() -> None:
    # Not refused now; the claim expires before the verdict's time-to-live: refused from then on.
    api = FakeClient()
    soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 2))
    await api.create(SANDBOX_CLAIM, claim("c1", soon), namespace="team")
    stored = await api.create(lc.ARCHIVE, archive(claim="c1"), namespace="team")
    clock = Clock()
    lifecycle = lifecycle_over(api, stored, clock)
    assert await lifecycle._restore_refused("team", "sb", lc_now(clock)) == ""
    assert await lifecycle._restore_refused("team", "sb", lc_now(clock)) == ""
    assert reads(api, SANDBOX_CLAIM) == 1
    clock.offset = 5
    assert "its SandboxClaim 'c1' has expired" in await lifecycle._restore_refused(
        "team", "sb", lc_now(clock)
    )
    assert reads(api, SANDBOX_CLAIM) == 2
    await lifecycle.close()


class SlowSandboxReads(FakeClient):
    """An API server whose Sandbox reads hang (a 60 s client timeout each, in a real router)."""

    slow = False

    async def get(
        self, kind: ResourceKind, name: str, *, namespace: str | None = None, subresource: str | None = None
    ) -> dict[str, Any]:
        if self.slow and kind == SANDBOX:
            self._record("get", kind, namespace, name)
            await asyncio.sleep(60)
        return await super().get(kind, name, namespace=namespace, subresource=subresource)


async def test_a_held_restore_ends_by_its_deadline_with_a_slow_api_server() -> None:
    api = SlowSandboxReads()
    stored = await api.create(lc.ARCHIVE, archive(), namespace="team")
    lifecycle = lifecycle_over(api, stored)
    loop = asyncio.get_running_loop()
    held = [asyncio.create_task(lifecycle.hold(ROUTE, loop.time() + 1.0)) for _ in range(3)]
    for _ in range(100):
        if (await api.get(lc.ARCHIVE, "sb", namespace="team"))["spec"].get("restore"):
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("no restore request written")
    # The archive goes (the router's cache shows it), no Sandbox yet: each wake asks the API server.
    api.slow = True
    await api.delete(lc.ARCHIVE, "sb", namespace="team")
    lifecycle.state.archives.pop(("team", "sb"))
    lifecycle.state._changes.notify()
    # Until December 6 each request awaited its own read, unbounded: held for the read's whole 60 s.
    done = await asyncio.wait_for(asyncio.gather(*held, return_exceptions=True), 10)
    for outcome in done:
        assert isinstance(outcome, ResumeFailed), outcome
        assert "is resuming but was not Ready within" in outcome.detail
    assert reads(api, SANDBOX) == 1  # one check for the three held requests, not one each
    await lifecycle.close()


class RestoreBetweenReads(FakeClient):
    """An API server on which the controller finishes a restore just after the router's first uncached Sandbox
    read: it creates the Sandbox, then deletes the archive (the router's informers have shown neither yet)."""

    armed = False

    async def get(
        self, kind: ResourceKind, name: str, *, namespace: str | None = None, subresource: str | None = None
    ) -> dict[str, Any]:
        try:
            return await super().get(kind, name, namespace=namespace, subresource=subresource)
        finally:
            if self.armed and kind == SANDBOX:
                self.armed = False
                await self.create(SANDBOX, {"metadata": {"name": name}, "spec": {}}, namespace=namespace)
                await self.delete(lc.ARCHIVE, name, namespace=namespace)


async def test_a_restore_finished_between_the_reads_is_not_taken_for_the_end() -> None:
    # The reads: Sandbox (not there yet), archive (already deleted), Sandbox again (there). With only the first
    # two (until December 7) the restore's end looked like a deletion: "its archive was deleted with no Sandbox
    # coming back", and a request held for a plain resume "it was deleted".
    api = RestoreBetweenReads()
    stored = await api.create(lc.ARCHIVE, archive(), namespace="team")
    lifecycle = lifecycle_over(api, stored)
    lifecycle.state.archives.clear()  # the informers lag: they show neither object
    api.armed = True
    assert await lifecycle._restore_ended(("team", "sb")) is False
    assert reads(api, SANDBOX) == 2
    await lifecycle.close()

    # Nothing there, nothing coming: ended.
    api = RestoreBetweenReads()
    lifecycle = lifecycle_over(api, await api.create(lc.ARCHIVE, archive(), namespace="team"))
    await api.delete(lc.ARCHIVE, "sb", namespace="team")
    lifecycle.state.archives.clear()
    assert await lifecycle._restore_ended(("team", "sb")) is True
    await lifecycle.close()
