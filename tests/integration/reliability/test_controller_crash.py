"""The controller SIGKILLed at random moments during a claim burst (the CI-sized trial).

Real control plane (fault cluster, audit log on) and the real controller running as its ServiceAccount
with only the rendered RBAC. While a burst of claims against a warm pool is being created and bound, the
controller is killed with SIGKILL (no drain, nothing flushed) and started again with the same argv, twice
at random moments. Then, counted from the API server's audit log and the final objects
(benchmarks/reliability/invariants.py): 0 lost claims, 0 Sandboxes bound to two claims, 0 claims bound
twice, Sandbox creates == replicas + refills + cold claims, no Sandbox deleted.

The full version (10 trials of 500 claims) is `python -m benchmarks.reliability crash`; its numbers are in
docs/reliability.md.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from benchmarks.reliability import controllers
from benchmarks.reliability.crash import crash_trial

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started, is_ours, stop
from agent_sandbox.kube import ApiClient

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("faults")]

POOL = 20
CLAIMS = 80
KILLS = 2


@pytest.fixture
def controller(fault_cluster: DevCluster) -> Iterator[list[Started]]:
    """The controller as a one-element list: the trial replaces it with each restart; stopped by PID after."""
    with controllers.as_serviceaccount():
        current = [controllers.start(fault_cluster)]
    try:
        yield current
    finally:
        for started in current:
            stop(started)


async def test_sigkill_at_random_moments_mid_burst(
    fault_cluster: DevCluster, fault_kube: ApiClient, fault_namespace: str, controller: list[Started]
) -> None:
    seed = random.randrange(1 << 30)
    trial, controller[0] = await crash_trial(
        fault_cluster, fault_kube, fault_namespace, controller[0],
        claims=CLAIMS, replicas=POOL, kills=KILLS, window_s=15.0, rng=random.Random(seed), settle_within=240,
        at_ready_share=True,
    )  # fmt: skip
    print(f"seed {seed}: {trial.as_dict()}")
    assert len(trial.kills) == KILLS
    # Mid-burst: at every kill some claims of the burst existed and were not Ready yet.
    assert all(k.ready_claims < k.created_claims for k in trial.kills), (
        "a kill landed with no claim outstanding"
    )
    assert is_ours(controller[0].pid, controller[0].exe)
    assert trial.complete, trial.check.violations
    assert trial.check.ok, trial.check.violations
    assert trial.check.ready == CLAIMS
    assert trial.check.warm + trial.check.cold == CLAIMS
