"""Claim observability: timestamps, latency rules, launch-type attribution (controllers spec §4.13, §5.8)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.claim.observability import (
    ClaimMetrics,
    latencies,
    launch_type_of,
    template_of,
)
from tests.unit.controllers.claim.builders import NS, T0, claim, member, ready_cond, sample, ts

pytestmark = pytest.mark.unit


def test_launch_type_comes_from_the_label_only() -> None:
    warm = member("pool-x")
    assert launch_type_of(warm) == "warm"
    unlabelled = member("pool-x")
    del unlabelled["metadata"]["labels"][c.LABEL_LAUNCH_TYPE]
    assert launch_type_of(unlabelled) == "cold"  # not guessed from the name
    assert launch_type_of(None) == "unknown"
    assert template_of(warm) == "tmpl"
    assert template_of(None) == "__unknown__"


NOW = T0 + timedelta(seconds=2)


@pytest.mark.parametrize(
    ("annotations", "want"),
    [
        ({}, (None, 2000.0, None)),
        ({c.ANNOTATION_WEBHOOK_FIRST_OBSERVED_AT: ts(T0 - timedelta(seconds=1))}, (3000.0, 2000.0, None)),
        ({c.ANNOTATION_WEBHOOK_FIRST_OBSERVED_AT: ts(NOW + timedelta(seconds=5))}, (None, 2000.0, None)),
        ({c.ANNOTATION_WEBHOOK_FIRST_OBSERVED_AT: "not-a-time"}, (None, 2000.0, None)),
        (
            {c.ANNOTATION_CLIENT_FIRST_REQUESTED_AT: "2026-01-01T12:00:00.250000+00:00"},
            (None, 2000.0, 1750.0),
        ),
        ({c.ANNOTATION_CLIENT_FIRST_REQUESTED_AT: "2026-01-01T12:00:00.5Z"}, (None, 2000.0, 1500.0)),
        ({c.ANNOTATION_CLIENT_FIRST_REQUESTED_AT: ts(NOW + timedelta(seconds=1))}, (None, 2000.0, None)),
        ({c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT: "2026-01-01T11:59:59Z"}, (None, 3000.0, None)),
    ],
)
def test_latency_sources(annotations: dict[str, str], want: tuple[float | None, ...]) -> None:
    lat = latencies(claim(annotations=annotations), None, now=NOW, first_observed=T0)
    assert (lat.webhook_ms, lat.controller_ms, lat.client_ms) == want
    assert lat.creation_ms is None  # no Sandbox


def test_creation_latency_from_sandbox_ready_transition() -> None:
    sb = member("s", created=T0)
    sb["status"]["conditions"] = [ready_cond(at=T0 + timedelta(seconds=3))]
    assert latencies(claim(), sb, now=NOW, first_observed=T0).creation_ms == 3000.0
    sb["status"]["conditions"] = [ready_cond(at=T0 - timedelta(seconds=3))]
    assert latencies(claim(), sb, now=NOW, first_observed=T0).creation_ms is None  # negative: skipped


def test_creation_counter_labels_normalise_created_by() -> None:
    metrics = ClaimMetrics()
    labels = {
        "namespace": NS,
        "sandbox_template": "t-obs",
        "launch_type": "cold",
        "warmpool_name": "p",
        "pod_condition": "not_ready",
        "created_by": "unknown",
    }
    before = sample("agent_sandbox_claim_creation_total", **labels)
    cl = claim(labels={c.LABEL_CREATED_BY: "some-script"})
    metrics.count_creation(cl, member("s"), launch_type="cold", pool="p", ready=False, template="t-obs")
    assert sample("agent_sandbox_claim_creation_total", **labels) == before + 1
