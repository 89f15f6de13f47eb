"""kube-apiserver, and separately etcd, restarted in place in the middle of a claim burst.

Real control plane (the fault cluster, audit log on) and the real controller running as its ServiceAccount
with only the rendered RBAC. Half the burst is bound when the component goes down; the other half is sent
while it is down or coming back (creates retried, as a client would). Then, counted from the API server's
audit log and the final objects (benchmarks/reliability/invariants.py): every claim Ready, no Sandbox bound
twice, no claim bound twice, creates == replicas + refills + cold claims, no Sandbox deleted.

After an API server restart the controller's watches resume from resourceVersions the new watch cache
does not have: they must end in 410 and a relist (the controller logs each), not in a stuck informer.
Each run is one trial per component (there is no long version yet).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from benchmarks.reliability import controllers
from benchmarks.reliability.burst import create_claims, create_template_and_pool, ready_count, settle
from benchmarks.reliability.invariants import check_burst

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.audit import AuditLog
from agent_sandbox.devcluster.faults import restart_component
from agent_sandbox.devcluster.processes import Started, is_ours, stop
from agent_sandbox.kube import ApiClient
from tests.helpers import eventually

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("faults")]

POOL = 20
CLAIMS = 60
RELIST = "expired, relisting"


@pytest.fixture(scope="module")
def controller(fault_cluster: DevCluster) -> Iterator[Started]:
    with controllers.as_serviceaccount():
        started = controllers.start(fault_cluster)
    try:
        yield started
    finally:
        stop(started)


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
async def test_burst_survives_a_restart(
    fault_cluster: DevCluster,
    fault_kube: ApiClient,
    fault_namespace: str,
    controller: Started,
    component: str,
) -> None:
    cluster, api, ns = fault_cluster, fault_kube, fault_namespace
    audit = AuditLog(cluster.audit_log)
    mark, log_mark = audit.mark(), controller.log.stat().st_size
    await create_template_and_pool(api, ns, POOL)
    await settle(api, ns, claims=0, replicas=POOL, within=120)
    first = [f"c-{i:03d}" for i in range(CLAIMS // 2)]
    second = [f"c-{i:03d}" for i in range(CLAIMS // 2, CLAIMS)]

    await create_claims(api, ns, first)

    async def some_ready() -> int | None:
        return n if (n := await ready_count(api, ns)) >= 10 else None

    bound_before = await eventually(some_ready, "the first claims Ready", within=120)
    restart = asyncio.create_task(asyncio.to_thread(restart_component, cluster, component, kill=True))
    await asyncio.sleep(0.05)  # the component is going down while the second half is sent
    burst = await create_claims(api, ns, second)
    outage = (await restart).outage_s
    print(f"{component}: restart with {bound_before}/{CLAIMS // 2} Ready, outage {outage:.1f}s, "
          f"{burst.already_existed} creates applied before their response was lost")  # fmt: skip

    settled = await settle(api, ns, claims=CLAIMS, replicas=POOL, within=240)
    check = check_burst(settled, audit.since(mark, unfinished=True), namespace=ns, replicas=POOL)
    print(check.as_dict())
    assert check.ok, check.violations
    assert check.warm + check.cold == CLAIMS
    assert is_ours(controller.pid, controller.exe), "the controller exited instead of riding out the restart"
    if component == "kube-apiserver":
        with controller.log.open() as fh:
            fh.seek(log_mark)
            relists = sum(RELIST in line for line in fh)
        assert relists > 0, "no informer relisted after the API server restart"
