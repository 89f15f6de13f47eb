"""Hibernated Sandboxes that are never restored, as a lifecycle router and `kubectl get sbarchive` see them.

A router asked for a hibernated Sandbox (auto-resume) whose SandboxClaim has expired, or whose archive is
marked `expired-at`, answers 503 at once, naming why, and writes no restore request. Until December 6 it
wrote the request and held the client for the whole resume timeout while the lifecycle controller deleted
the archive instead. `kubectl get sbarchive` shows the `expired-at` mark (column Expired).

The lifecycle controller is left out of this module (the CRD and grants are installed): it deletes an
archive at its claim's expiry, so with it the archive the router must meet would be gone in a moment. Its
own side (archive deleted, restore never carried out) is in test_hibernate_races.py.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import format_time
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.lifecycle import install_lifecycle
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import SANDBOX_CLAIM, ApiClient, Object
from agent_sandbox.router import Router
from tests.helpers import eventually
from tests.integration.lifecycle.helpers import claim_body, get_or_none, through

pytestmark = pytest.mark.integration

StartRouter = Callable[..., Awaitable[Router]]
LATER = format_time(datetime.now(UTC) + timedelta(days=365))


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    """The controller without its lifecycle controller; the SandboxArchive CRD (as generated) installed."""
    started = start_controller(cluster)
    install_lifecycle(cluster)
    try:
        yield started
    finally:
        stop(started)


def archive_body(
    name: str, *, claim: Object | None = None, annotations: dict[str, str] | None = None
) -> Object:
    """A hibernated Sandbox (auto-resume) whose own shutdownTime is a year away."""
    meta: dict[str, Any] = {"name": name, "annotations": annotations or {}}
    if claim is not None:
        owner = {
            "apiVersion": SANDBOX_CLAIM.api_version,
            "kind": "SandboxClaim",
            "name": claim["metadata"]["name"],
            "uid": claim["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        meta["ownerReferences"] = [owner]
    kept = {"metadata": {"annotations": {lc.ANNOTATION_AUTO_RESUME: "true"}}, "spec": {"shutdownTime": LATER}}
    return {
        "apiVersion": lc.ARCHIVE.api_version,
        "kind": lc.ARCHIVE.kind,
        "metadata": meta,
        "spec": {
            "sandbox": kept,
            "sandboxUID": f"old-{name}",
            "archivedAt": format_time(datetime.now(UTC)),
            "reason": str(lc.Cause.REQUESTED),
            "children": [],
        },
    }


async def refused(http: aiohttp.ClientSession, router: Router, name: str, namespace: str) -> str:
    """The 503 detail once the router knows the archive (before, the request is not held at all)."""

    async def attempt() -> str | None:
        status, body = await through(http, router, name, namespace)
        detail = str((body or {}).get("detail", "")) if isinstance(body, dict) else ""
        assert "not Ready within" not in detail, detail  # held for the resume timeout: the old behaviour
        return detail if status == 503 and "could not be resumed: it is hibernated" in detail else None

    return await eventually(attempt, f"the router's 503 for {name}", within=30)


async def test_a_hibernated_sandbox_under_an_expired_claim_is_refused_at_once(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    lifecycle = {
        "shutdownTime": format_time(datetime.now(UTC) + timedelta(seconds=1)),
        "shutdownPolicy": "Retain",
    }
    await kube.create(SANDBOX_CLAIM, claim_body("gone", "no-pool", lifecycle=lifecycle), namespace=namespace)

    async def expired() -> Object | None:
        claim = await kube.get(SANDBOX_CLAIM, "gone", namespace=namespace)
        conditions = (claim.get("status") or {}).get("conditions") or []
        return claim if any(c.get("reason") == "ClaimExpired" for c in conditions) else None

    claim = await eventually(expired, "claim Ready=False/ClaimExpired", within=30)
    await kube.create(lc.ARCHIVE, archive_body("sleeper", claim=claim), namespace=namespace)
    router = await start_router()
    detail = await refused(http, router, "sleeper", namespace)
    assert detail.startswith(
        f"Sandbox {namespace}/sleeper could not be resumed: it is hibernated and its SandboxClaim 'gone' has "
        "expired at "
    ), detail
    archive = await kube.get(lc.ARCHIVE, "sleeper", namespace=namespace)
    assert "restore" not in archive["spec"]  # no restore request written


async def test_an_archive_marked_expired_is_refused_and_shown_expired(
    kube: ApiClient,
    namespace: str,
    cluster: DevCluster,
    start_router: StartRouter,
    http: aiohttp.ClientSession,
) -> None:
    # Marked by the controller (its clock); the archived shutdownTime, as this router reads it, not passed.
    mark = {lc.ANNOTATION_EXPIRED_AT: format_time(datetime.now(UTC) - timedelta(minutes=5))}
    await kube.create(lc.ARCHIVE, archive_body("kept", annotations=mark), namespace=namespace)
    await kube.create(lc.ARCHIVE, archive_body("restorable"), namespace=namespace)
    router = await start_router()
    detail = await refused(http, router, "kept", namespace)
    assert "it is hibernated and has expired" in detail, detail
    assert lc.ANNOTATION_EXPIRED_AT in detail, detail
    kept = await get_or_none(kube, lc.ARCHIVE, "kept", namespace)
    assert kept is not None
    assert "restore" not in kept["spec"]

    # The printer column, as the API server renders it (the JSONPath's escaped dots must resolve).
    table = cluster.kubectl("get", "sbarchive", "-n", namespace, check=True).stdout.strip().splitlines()
    assert table[0].split() == ["NAME", "REASON", "ARCHIVED", "RESTORE", "EXPIRED"], table
    expired = {line.split()[0]: line[table[0].index("EXPIRED") :].strip() for line in table[1:]}
    assert re.fullmatch(r"[456]m(\d+s)?", expired["kept"]), table  # its age: marked 5 minutes ago
    assert expired["restorable"] == "", table  # no mark: not expired
