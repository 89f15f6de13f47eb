"""`agent_sandboxes` label derivation and aggregation (spec §5.8; upstream sandbox_collector_test.go)."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent_sandbox.api.constants import ANNOTATION_SANDBOX_TEMPLATE_REF, LABEL_CREATED_BY, LABEL_LAUNCH_TYPE
from agent_sandbox.controllers.sandbox import SandboxCollector, sandbox_metric_labels
from agent_sandbox.controllers.sandbox.metrics import register_collector
from tests.unit.controllers.sandbox.builders import ref, sandbox

pytestmark = pytest.mark.unit


def _ready(status: str, reason: str) -> dict[str, Any]:
    return {"conditions": [{"type": "Ready", "status": status, "reason": reason, "message": ""}]}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, ("ns", "false", "false", "cold", "unknown", "None", "unknown")),
        (
            {"status": _ready("True", "DependenciesReady")},
            ("ns", "true", "false", "cold", "unknown", "None", "unknown"),
        ),
        (
            {"status": _ready("False", "SandboxExpired")},
            ("ns", "false", "true", "cold", "unknown", "None", "unknown"),
        ),
        (
            {
                "labels": {LABEL_LAUNCH_TYPE: "warm", LABEL_CREATED_BY: "python-client"},
                "annotations": {ANNOTATION_SANDBOX_TEMPLATE_REF: "tmpl"},
            },
            ("ns", "false", "false", "warm", "tmpl", "None", "python-client"),
        ),
        (
            {"labels": {LABEL_CREATED_BY: "custom"}},
            ("ns", "false", "false", "cold", "unknown", "None", "unknown"),
        ),
        (
            {"owner": ref("SandboxClaim", "c", "u", api_version="extensions.agents.x-k8s.io/v1beta1")},
            ("ns", "false", "false", "cold", "unknown", "SandboxClaim", "unknown"),
        ),
        (
            {"owner": ref("SandboxWarmPool", "p", "u", api_version="extensions.agents.x-k8s.io/v1alpha1")},
            ("ns", "false", "false", "cold", "unknown", "SandboxWarmPool", "unknown"),
        ),
        (
            {"owner": ref("SandboxClaim", "c", "u", api_version="other.io/v1")},
            ("ns", "false", "false", "cold", "unknown", "None", "unknown"),
        ),
    ],
    ids=[
        "defaults",
        "ready",
        "expired",
        "warm-template-created-by",
        "created-by-normalized",
        "claim-owned",
        "pool-owned-v1alpha1",
        "foreign-group",
    ],
)
def test_labels(kwargs: dict[str, Any], expected: tuple[str, ...]) -> None:
    assert sandbox_metric_labels(sandbox(**kwargs)) == expected


class _Store:
    def __init__(self, objects: list[dict[str, Any]], synced: bool = True) -> None:
        self.objects = objects
        self.has_synced = synced

    def list(self) -> list[dict[str, Any]]:
        return self.objects


def _samples(registry: CollectorRegistry) -> dict[tuple[str, ...], float]:
    out = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name == "agent_sandboxes":
                out[tuple(s.labels[k] for k in ("namespace", "ready_condition", "launch_type"))] = s.value
    return out


def test_collector_aggregates_per_label_combination() -> None:
    objects = [sandbox("a"), sandbox("b"), sandbox("c", status=_ready("True", "DependenciesReady"))]
    registry = CollectorRegistry()
    register_collector(registry, _Store(objects))  # type: ignore[arg-type]
    assert _samples(registry) == {("ns", "false", "cold"): 2.0, ("ns", "true", "cold"): 1.0}
    # Re-registering replaces the previous collector instead of failing on duplicates.
    register_collector(registry, _Store([]))  # type: ignore[arg-type]
    assert _samples(registry) == {}


def test_collector_emits_nothing_before_sync() -> None:
    registry = CollectorRegistry()
    registry.register(SandboxCollector(_Store([sandbox()], synced=False)))  # type: ignore[arg-type]
    assert _samples(registry) == {}


def test_a_dropped_registry_leaves_no_collector_behind() -> None:
    """A collected registry's entry goes with it: an entry keyed by id() outlived it, and the next registry
    allocated at that address tried to unregister a collector it never held (KeyError in a test run)."""
    from agent_sandbox.kube import metrics

    registry = CollectorRegistry()
    register_collector(registry, _Store([]))  # type: ignore[arg-type]
    before = len(metrics._slots)
    del registry
    gc.collect()
    assert len(metrics._slots) == before - 1
