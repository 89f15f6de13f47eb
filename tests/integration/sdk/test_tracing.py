"""SDK tracing against the real control plane: the claim in the API server carries the create span's
W3C context (`opentelemetry.io/trace-context`), and the spans of create → run → terminate are exported.

Spans go to an in-memory exporter on the process's tracer provider (nothing is sent over the network);
the sandbox is reached at its pod IP, served by the dev cluster's local runner.
"""

from __future__ import annotations

import json
import re

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import SandboxClient, SandboxInClusterConnectionConfig, SandboxTracerConfig

from .conftest import EXT, RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


def memory_exporter() -> InMemorySpanExporter:
    """An exporter on the process's global SDK provider (installed here if none is set yet)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def test_claim_carries_the_create_span_context_and_spans_are_exported(
    cluster: DevCluster, namespace: str, controller: Started
) -> None:
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    exporter = memory_exporter()
    tracer_config = SandboxTracerConfig(enable_tracing=True, trace_service_name="it-client")
    with SandboxClient(
        SandboxInClusterConnectionConfig(), tracer_config, kubeconfig=cluster.kubeconfig
    ) as client:
        sandbox = client.create_sandbox("pool", namespace, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        assert sandbox.commands.run("echo traced").stdout == "traced\n"
        status, claim = cluster.admin().request(
            "GET", f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims/{sandbox.claim_name}"
        )
        assert status == 200, claim
        sandbox.terminate()

    spans = {s.name: s for s in exporter.get_finished_spans() if s.name.startswith("it-client.")}
    assert sorted(spans) == [
        "it-client.create_claim",
        "it-client.delete_claim",
        "it-client.run",
        "it-client.wait_for_claim_ready",
    ]
    assert dict(spans["it-client.run"].attributes or {}) == {
        "sandbox.command.executable": "echo",
        "sandbox.exit_code": 0,
    }

    context = json.loads(claim["metadata"]["annotations"]["opentelemetry.io/trace-context"])
    match = TRACEPARENT.match(context["traceparent"])
    assert match is not None, context
    create = spans["it-client.create_claim"].get_span_context()
    assert create is not None
    assert match.group(1) == f"{create.trace_id:032x}"
    assert match.group(2) == f"{create.span_id:016x}"
