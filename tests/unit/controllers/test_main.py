"""Process wiring: manager options from the flags, and the setups' view of the manager (no cluster)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from prometheus_client import CollectorRegistry

from agent_sandbox.api.constants import LABEL_SANDBOX_NAME_HASH
from agent_sandbox.controllers import sandbox
from agent_sandbox.controllers.claim_pressure import ClaimPressure
from agent_sandbox.controllers.context import ControllerContext
from agent_sandbox.controllers.main import manager_options
from agent_sandbox.controllers.options import Options
from agent_sandbox.kube import POD, SANDBOX, Manager, ManagerOptions
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit


def test_event_hold_only_with_claim_pressure() -> None:
    opts = Options(cache_label_selectors=True)
    assert manager_options(opts).event_hold is None
    assert manager_options(opts, ClaimPressure(0.0)).event_hold is None
    assert manager_options(opts, ClaimPressure(15.0)).event_hold is not None
    # ... and its held writes are sent by a graceful stop before the Lease is released.
    pressure = ClaimPressure(15.0)
    assert manager_options(opts, pressure).held_writes == (pressure,)
    # With the hold off (--sandbox-claim-priority-hold=0) the first-ready stamps are still detached
    # (--extensions): the stop waits for them too, and counts those that fail.
    off = ClaimPressure(0.0)
    assert manager_options(opts, off).held_writes == (off,)
    assert manager_options(opts).held_writes == ()
    # Cache scoping is configured once, by the Sandbox controller's setup, not by the process options.
    assert manager_options(opts).cache.by_kind == {}


def _pod(name: str, labels: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": labels, "managedFields": [{"manager": "k"}]},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
    }


@pytest.mark.parametrize("scoped", [False, True])
async def test_sandbox_setup_scopes_and_trims_the_pod_cache(scoped: bool) -> None:
    fake = FakeClient((POD, _pod("tracked", {LABEL_SANDBOX_NAME_HASH: "h"})), (POD, _pod("other", {})))
    mgr = Manager(
        fake,  # type: ignore[arg-type]
        ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0", registry=CollectorRegistry()),
    )
    sandbox.setup(mgr, ControllerContext(Options(cache_label_selectors=scoped)))
    pods = mgr.cache.informer(POD)
    task = asyncio.create_task(pods.run())
    try:
        await asyncio.wait_for(pods.wait_for_sync(), 5)
        cached = {p["metadata"]["name"]: p for p in pods.list()}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert set(cached) == ({"tracked"} if scoped else {"tracked", "other"})
    assert cached["tracked"]["spec"] == {"nodeName": "n1"}  # the Pod diet
    assert "managedFields" not in cached["tracked"]["metadata"]


async def test_sandbox_setup_keeps_managed_fields_only_of_applied_sandboxes() -> None:
    """The pod-name patch resets a Sandbox's entries unless one is an Apply; the cache keeps what that reads."""
    update = {"manager": "kubectl-create", "operation": "Update"}
    apply = {"manager": "flux", "operation": "Apply"}

    def sb(name: str, entries: list[dict[str, str]]) -> dict[str, object]:
        return {"metadata": {"name": name, "namespace": "ns", "managedFields": entries}, "spec": {}}

    fake = FakeClient((SANDBOX, sb("posted", [update])), (SANDBOX, sb("applied", [update, apply])))
    mgr = Manager(
        fake,  # type: ignore[arg-type]
        ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0", registry=CollectorRegistry()),
    )
    sandbox.setup(mgr, ControllerContext(Options()))
    sandboxes = mgr.cache.informer(SANDBOX)
    task = asyncio.create_task(sandboxes.run())
    try:
        await asyncio.wait_for(sandboxes.wait_for_sync(), 5)
        cached = {s["metadata"]["name"]: s["metadata"] for s in sandboxes.list()}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert "managedFields" not in cached["posted"]
    assert cached["applied"]["managedFields"] == [update, apply]
