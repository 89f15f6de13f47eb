"""`RouterLifecycle.hold` of a hibernated Sandbox the lifecycle controller will never restore.

Until December 6 the router wrote the restore request of an archive whose SandboxClaim had expired (or that
was marked `expired-at`), then held the request for the whole resume timeout while the controller deleted
the archive instead; now the 503 comes at once, before any write. The real controller's side:
tests/integration/lifecycle/test_restore_refused.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.kube import SANDBOX_CLAIM, Forbidden
from agent_sandbox.kube.testing import FakeClient
from agent_sandbox.router._lifecycle import ResumeFailed, RouterLifecycle
from agent_sandbox.router._lifecycle_state import LifecycleState, _diet_archive, archive_view
from agent_sandbox.router._metrics import RouterMetrics
from agent_sandbox.router._podcache import PodCache
from agent_sandbox.router._routing import Route

pytestmark = pytest.mark.unit

ROUTE = Route("sb", "team", 8888)
PAST = "2026-01-01T00:00:00Z"
FUTURE = "2999-01-01T00:00:00Z"


def archive(*, annotations: dict[str, str] | None = None, claim: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "sb", "namespace": "team", "annotations": annotations or {}}
    if claim:
        meta["ownerReferences"] = [
            {
                "apiVersion": SANDBOX_CLAIM.api_version,
                "kind": "SandboxClaim",
                "name": claim,
                "uid": f"uid-{claim}",
                "controller": True,
            }
        ]
    kept = {
        "metadata": {"annotations": {lc.ANNOTATION_AUTO_RESUME: "true"}},
        "spec": {"shutdownTime": FUTURE},
    }
    return {
        "apiVersion": lc.ARCHIVE.api_version,
        "kind": lc.ARCHIVE.kind,
        "metadata": meta,
        "spec": {"sandbox": kept, "sandboxUID": "old-uid", "archivedAt": PAST, "children": []},
    }


def claim(name: str, shutdown_time: str) -> dict[str, Any]:
    return {
        "apiVersion": SANDBOX_CLAIM.api_version,
        "kind": "SandboxClaim",
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},  # the archive's owner
        "spec": {"lifecycle": {"shutdownTime": shutdown_time, "shutdownPolicy": "Retain"}},
    }


def lifecycle_over(
    api: FakeClient, stored: dict[str, Any], clock: Callable[[], float] | None = None
) -> RouterLifecycle:
    """A router lifecycle whose archive informer already shows `stored` (the fake API server holds it)."""
    state = LifecycleState(api)
    state.archives[("team", "sb")] = archive_view(_diet_archive(stored))
    return RouterLifecycle(
        api,  # type: ignore[arg-type]
        state,
        PodCache(api),
        RouterMetrics(),
        resume_timeout=30,
        activity_interval=0,
        clock=clock or time.time,
    )


async def hold_fails(lifecycle: RouterLifecycle, said: str) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    with pytest.raises(ResumeFailed, match=said):
        await asyncio.wait_for(lifecycle.hold(ROUTE, deadline), 3)
    await lifecycle.close()


async def test_an_archive_under_an_expired_claim_is_not_restored() -> None:
    api = FakeClient()
    await api.create(SANDBOX_CLAIM, claim("c1", PAST), namespace="team")
    stored = await api.create(lc.ARCHIVE, archive(claim="c1"), namespace="team")
    lifecycle = lifecycle_over(api, stored)
    await hold_fails(
        lifecycle,
        r"^Sandbox team/sb could not be resumed: it is hibernated and its SandboxClaim 'c1' has expired at "
        r"2026-01-01T00:00:00",
    )
    after = await api.get(lc.ARCHIVE, "sb", namespace="team")
    assert "restore" not in after["spec"]  # no restore request written


@pytest.mark.parametrize("shutdown_time", ["0001-01-01T00:00:00Z", "0000-01-01T00:00:00Z"])
async def test_a_claim_expired_at_the_start_of_time_is_refused_naming_it(shutdown_time: str) -> None:
    """`now + seconds left` fell a rounding error below datetime's minimum (year 0000 is clamped there):
    OverflowError instead of the refusal (until December 6)."""
    api = FakeClient()
    await api.create(SANDBOX_CLAIM, claim("c1", shutdown_time), namespace="team")
    stored = await api.create(lc.ARCHIVE, archive(claim="c1"), namespace="team")
    lifecycle = lifecycle_over(api, stored)
    await hold_fails(lifecycle, r"its SandboxClaim 'c1' has expired at 0001-01-01T00:00:00")


async def test_an_archive_marked_expired_at_is_not_restored() -> None:
    # Its own shutdownTime (FUTURE here: another clock) does not say so; the controller's mark does.
    api = FakeClient()
    marked = archive(annotations={lc.ANNOTATION_EXPIRED_AT: "2026-12-06T10:00:00Z"})
    stored = await api.create(lc.ARCHIVE, marked, namespace="team")
    lifecycle = lifecycle_over(api, stored)
    await hold_fails(
        lifecycle, "could not be resumed: it is hibernated and has expired .*expired-at=2026-12-06T10:00:00Z"
    )
    assert "restore" not in (await api.get(lc.ARCHIVE, "sb", namespace="team"))["spec"]


async def test_a_claim_not_expired_or_not_readable_lets_the_restore_be_asked() -> None:
    api = FakeClient()
    await api.create(SANDBOX_CLAIM, claim("c1", FUTURE), namespace="team")
    stored = await api.create(lc.ARCHIVE, archive(claim="c1"), namespace="team")
    for forbidden in (False, True):
        if forbidden:  # a router role without claims: the controller still decides
            api.inject_error("get", Forbidden(403, "Forbidden", "no grant"), kind=SANDBOX_CLAIM)
            stored = await api.patch(lc.ARCHIVE, "sb", {"spec": {"restore": None}}, namespace="team")
        lifecycle = lifecycle_over(api, stored)
        held = asyncio.create_task(lifecycle.hold(ROUTE, asyncio.get_running_loop().time() + 30))
        for _ in range(100):
            if (await api.get(lc.ARCHIVE, "sb", namespace="team"))["spec"].get("restore"):
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail(f"no restore request written (claims forbidden: {forbidden})")
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held
        await lifecycle.close()


async def test_a_restore_whose_archive_goes_without_a_sandbox_ends_at_once() -> None:
    # A claim the router may not read, expired: the controller deletes the archive instead of restoring.
    # Until December 6 the request waited out the resume timeout ("was not Ready within 30s").
    api = FakeClient()
    stored = await api.create(lc.ARCHIVE, archive(claim="c1"), namespace="team")
    api.inject_error("get", Forbidden(403, "Forbidden", "no grant"), kind=SANDBOX_CLAIM)
    lifecycle = lifecycle_over(api, stored)
    held = asyncio.create_task(lifecycle.hold(ROUTE, asyncio.get_running_loop().time() + 30))
    for _ in range(100):
        if (await api.get(lc.ARCHIVE, "sb", namespace="team"))["spec"].get("restore"):
            break
        await asyncio.sleep(0.02)
    await api.delete(lc.ARCHIVE, "sb", namespace="team")
    lifecycle.state.archives.pop(("team", "sb"))
    lifecycle.state._changes.notify()
    with pytest.raises(ResumeFailed, match="its archive was deleted with no Sandbox coming back"):
        await asyncio.wait_for(held, 3)
    await lifecycle.close()


async def refusal_of(case: str) -> str:
    """The detail of the router's 503 for a hibernated Sandbox in `case`."""
    api = FakeClient()
    annotations: dict[str, str] = {}
    owner: str | None = None
    if case == "claim expired":
        await api.create(SANDBOX_CLAIM, claim("c1", PAST), namespace="team")
        owner = "c1"
    if case == "marked expired-at":
        annotations = {lc.ANNOTATION_EXPIRED_AT: "2026-12-06T10:00:00Z"}
    body = archive(annotations=annotations, claim=owner)
    if case == "shutdownTime passed":
        body["spec"]["sandbox"]["spec"]["shutdownTime"] = PAST
    if case == "archive being deleted":
        body["metadata"]["deletionTimestamp"] = PAST
    stored = await api.create(lc.ARCHIVE, body, namespace="team")
    lifecycle = lifecycle_over(api, stored)
    if case == "archive deleted without a restore":
        api.inject_error("get", Forbidden(403, "Forbidden", "no grant"), kind=SANDBOX_CLAIM)
        held = asyncio.create_task(lifecycle.hold(ROUTE, asyncio.get_running_loop().time() + 30))
        for _ in range(100):
            if (await api.get(lc.ARCHIVE, "sb", namespace="team"))["spec"].get("restore"):
                break
            await asyncio.sleep(0.02)
        await api.delete(lc.ARCHIVE, "sb", namespace="team")
        lifecycle.state.archives.pop(("team", "sb"))
        lifecycle.state._changes.notify()
    else:
        held = asyncio.create_task(lifecycle.hold(ROUTE, asyncio.get_running_loop().time() + 30))
    with pytest.raises(ResumeFailed) as failed:
        await asyncio.wait_for(held, 3)
    await lifecycle.close()
    return failed.value.detail


@pytest.mark.parametrize(
    "case",
    [
        "claim expired",
        "marked expired-at",
        "shutdownTime passed",
        "archive being deleted",
        "archive deleted without a restore",
    ],
)
async def test_a_restore_refusal_carries_the_sdks_marker(case: str) -> None:
    # Until December 6 these said "could not be restored": the Python SDK then added "is hibernated: restore
    # it with resume()" to a refusal saying it never would be, and the Go SDK replaced it with "deleted".
    # "could not be resumed" is what both SDKs take for "the router said why" (and add nothing).
    from agent_sandbox_sdk._calls import explain_unreachable
    from agent_sandbox_sdk.exceptions import SandboxRequestError

    detail = await refusal_of(case)
    assert detail.startswith("Sandbox team/sb could not be resumed: it "), detail
    assert "hibernated" in detail, detail
    err = SandboxRequestError(f"GET http://router/files/a: HTTP 503: {detail}", 503)
    explaining = explain_unreachable(None, err)  # type: ignore[arg-type]  # no read: no connection needed
    with pytest.raises(StopIteration) as passed:
        next(explaining)  # a first step would be the SDK's read of the Sandbox
    assert passed.value.value is err  # the router's reason, as it was


async def test_an_expired_claim_created_again_under_the_name_is_not_the_archives() -> None:
    """The archive's claim was deleted (orphaning it) and a new claim took the name and expired: its expiry
    does not end this archive (the controller ignores it too), so the restore is not refused for it."""
    api = FakeClient()
    stored = archive(claim="c1")
    await api.create(lc.ARCHIVE, stored, namespace="team")
    other = claim("c1", PAST)
    other["metadata"]["uid"] = "a-new-claim"
    await api.create(SANDBOX_CLAIM, other, namespace="team")
    lifecycle = lifecycle_over(api, stored)
    assert await lifecycle._restore_refused("team", "sb", datetime.now(UTC)) == ""
