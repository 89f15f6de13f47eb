"""Tracing (spec §3.12) against the in-memory API/router/runtime (fakes.py), through both drivers.

Spans go to an `InMemorySpanExporter` on a tracer provider these tests install (never an OTLP exporter).
What must hold without OpenTelemetry, or with tracing off, runs in a subprocess (a clean `sys.modules`).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClient,
    SandboxDirectConnectionConfig,
    SandboxRequestError,
    SandboxTracerConfig,
)

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit

CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)
TRACED = SandboxTracerConfig(enable_tracing=True, trace_service_name="agent-x")
ANNOTATION = "opentelemetry.io/trace-context"
HERE = Path(__file__).parent


def memory_exporter() -> InMemorySpanExporter:
    """An exporter on the process's global SDK provider (installed here if none is set yet)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture(scope="module")
def module_exporter() -> InMemorySpanExporter:
    return memory_exporter()


@pytest.fixture
def exporter(module_exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    module_exporter.clear()
    yield module_exporter
    module_exporter.clear()


def journey_sync(fake: FakeCluster, tracer_config: SandboxTracerConfig) -> str:
    with SandboxClient(CONFIG, tracer_config, api_client=endpoint(), transport=fake.transport()) as client:
        sandbox = client.create_sandbox("python-pool")
        assert sandbox.commands is not None
        assert sandbox.files is not None
        assert sandbox.commands.run("LANG=C /usr/bin/python3 -c 'print(1)'").exit_code == 0
        sandbox.files.write("notes.txt", "hello")
        assert sandbox.files.read("notes.txt") == b"hello"
        assert sandbox.files.exists("notes.txt")
        claim = sandbox.claim_name
        sandbox.terminate()
        assert claim is not None
        return claim


def journey_async(fake: FakeCluster, tracer_config: SandboxTracerConfig) -> str:
    async def main() -> str:
        client = AsyncSandboxClient(
            CONFIG, tracer_config, api_client=endpoint(), transport=fake.transport(), cleanup=False
        )
        try:
            sandbox = await client.create_sandbox("python-pool")
            assert sandbox.commands is not None
            assert sandbox.files is not None
            assert (await sandbox.commands.run("LANG=C /usr/bin/python3 -c 'print(1)'")).exit_code == 0
            await sandbox.files.write("notes.txt", "hello")
            assert await sandbox.files.read("notes.txt") == b"hello"
            assert await sandbox.files.exists("notes.txt")
            claim = sandbox.claim_name
            await sandbox.terminate()
            assert claim is not None
            return claim
        finally:
            await client.close()

    return asyncio.run(main())


JOURNEYS = {"sync": journey_sync, "async": journey_async}


def traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_spans_names_parents_attributes_annotation_and_headers(
    mode: str, exporter: InMemorySpanExporter
) -> None:
    fake = FakeCluster()
    with trace.get_tracer("test").start_as_current_span("caller") as caller:
        claim = JOURNEYS[mode](fake, TRACED)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    ops = ["create_claim", "wait_for_claim_ready", "run", "write", "read", "exists", "delete_claim"]
    assert sorted(spans) == sorted(["caller", *(f"agent-x.{op}" for op in ops)])
    root = caller.get_span_context()
    for op in ops:
        span = spans[f"agent-x.{op}"]
        assert span.parent is not None, op
        assert span.parent.span_id == root.span_id, op
        assert span.context is not None, op
        assert span.context.trace_id == root.trace_id, op
        assert span.instrumentation_scope is not None
        assert span.instrumentation_scope.name == "agent_x"
        assert span.status.status_code == trace.StatusCode.UNSET, op
    order = sorted(ops, key=lambda op: spans[f"agent-x.{op}"].start_time or 0)
    assert order == ops
    assert dict(spans["agent-x.create_claim"].attributes or {}) == {"sandbox.claim.name": claim}
    assert dict(spans["agent-x.run"].attributes or {}) == {
        "sandbox.command.executable": "python3",
        "sandbox.exit_code": 0,
    }
    assert dict(spans["agent-x.write"].attributes or {}) == {
        "sandbox.file.path": "notes.txt",
        "sandbox.file.size": 5,
    }
    assert dict(spans["agent-x.read"].attributes or {}) == {
        "sandbox.file.path": "notes.txt",
        "sandbox.file.size": 5,
    }
    assert dict(spans["agent-x.exists"].attributes or {}) == {
        "sandbox.file.path": "notes.txt",
        "sandbox.file.exists": True,
    }

    # The claim carries the create span's context, as upstream writes it (JSON, traceparent only here).
    post = fake.find(lambda r: r.method == "POST" and r.url.path.endswith("/sandboxclaims"))[0]
    annotations = json.loads(post.content)["metadata"]["annotations"]
    assert json.loads(annotations[ANNOTATION]) == {"traceparent": traceparent(spans["agent-x.create_claim"])}

    # Every request carries the W3C context of the span it was made in.
    expected = {
        ("POST", "/sandboxclaims"): "create_claim",
        ("GET", "watch"): "wait_for_claim_ready",
        ("POST", "/execute"): "run",
        ("POST", "/upload"): "write",
        ("GET", "/download/notes.txt"): "read",
        ("GET", "/exists/notes.txt"): "exists",
        ("DELETE", f"/sandboxclaims/{claim}"): "delete_claim",
    }
    for request in fake.requests:
        key = next(
            k
            for k in expected
            if request.method == k[0]
            and (request.url.path.endswith(k[1]) or (k[1] == "watch" and request.url.params.get("watch")))
        )
        assert request.headers["traceparent"] == traceparent(spans[f"agent-x.{expected[key]}"]), key


def test_a_failed_operation_ends_its_span_with_the_error(exporter: InMemorySpanExporter) -> None:
    fake = FakeCluster()
    with SandboxClient(CONFIG, TRACED, api_client=endpoint(), transport=fake.transport()) as client:
        sandbox = client.create_sandbox("python-pool")
        assert sandbox.files is not None
        with pytest.raises(SandboxRequestError):
            sandbox.files.read("missing.txt")
    read = next(s for s in exporter.get_finished_spans() if s.name == "agent-x.read")
    assert read.status.status_code == trace.StatusCode.ERROR
    assert read.status.description is not None
    assert "404" in read.status.description
    assert [e.name for e in read.events] == ["exception"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tracing_off_makes_no_spans_headers_or_annotation(mode: str, exporter: InMemorySpanExporter) -> None:
    fake = FakeCluster()
    JOURNEYS[mode](fake, SandboxTracerConfig())
    assert exporter.get_finished_spans() == ()
    assert not fake.find(lambda r: "traceparent" in r.headers)
    post = fake.find(lambda r: r.method == "POST" and r.url.path.endswith("/sandboxclaims"))[0]
    assert ANNOTATION not in json.loads(post.content)["metadata"]["annotations"]


def run_python(script: str) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter that can import fakes.py and has no OTLP endpoint to dial."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"  # never reached: no span is exported
    prelude = f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


JOURNEY_SCRIPT = """
    from fakes import ROUTER, FakeCluster, endpoint
    from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig, SandboxTracerConfig
    fake = FakeCluster()
    client = SandboxClient(SandboxDirectConnectionConfig(api_url=ROUTER), {config},
                           api_client=endpoint(), transport=fake.transport())
    sandbox = client.create_sandbox("python-pool")
    sandbox.commands.run("echo hi")
    sandbox.files.write("a.txt", "x")
    sandbox.files.read("a.txt")
    sandbox.terminate()
"""


def test_tracing_off_never_imports_opentelemetry() -> None:
    script = textwrap.dedent(JOURNEY_SCRIPT).format(config="SandboxTracerConfig()") + textwrap.dedent("""
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
        print("LOADED", loaded)
        assert not loaded, loaded
    """)
    out = run_python(script)
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout


@pytest.mark.parametrize(
    "missing", ["opentelemetry", "opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"]
)
@pytest.mark.parametrize("client", ["SandboxClient", "AsyncSandboxClient", "Sandbox"])
def test_enabled_without_the_extra_is_a_clear_error(missing: str, client: str) -> None:
    make = {
        "SandboxClient": "SandboxClient(CONFIG, TRACED, api_client=endpoint())",
        "AsyncSandboxClient": "AsyncSandboxClient(CONFIG, TRACED, api_client=endpoint())",
        "Sandbox": "Sandbox('c', 's', 'default', CONFIG, TRACED, endpoint())",
    }[client]
    out = run_python(f"""
        sys.modules[{missing!r}] = None  # as if the package were not installed
        from fakes import ROUTER, endpoint
        from agent_sandbox_sdk import *
        CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)
        TRACED = SandboxTracerConfig(enable_tracing=True)
        try:
            {make}
        except ImportError as err:
            print("ERROR", err)
        else:
            print("NO ERROR")
    """)
    assert out.returncode == 0, out.stderr
    assert "ERROR SandboxTracerConfig(enable_tracing=True) needs OpenTelemetry" in out.stdout
    assert "pip install 'agent-sandbox-sdk[tracing]'" in out.stdout


def test_the_default_provider_is_installed_only_when_the_application_has_none() -> None:
    out = run_python("""
        from opentelemetry import trace
        from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig, SandboxTracerConfig
        from fakes import ROUTER, endpoint
        CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)
        SandboxClient(CONFIG, SandboxTracerConfig(enable_tracing=True, trace_service_name="svc-a"),
                      api_client=endpoint())
        provider = trace.get_tracer_provider()
        processors = provider._active_span_processor._span_processors
        print("NAME", provider.resource.attributes["service.name"])
        print("EXPORTERS", [type(p.span_exporter).__module__ for p in processors])
        SandboxClient(CONFIG, SandboxTracerConfig(enable_tracing=True, trace_service_name="svc-b"),
                      api_client=endpoint())
        print("SAME", trace.get_tracer_provider() is provider)
    """)
    assert out.returncode == 0, out.stderr
    assert "NAME svc-a" in out.stdout
    assert "EXPORTERS ['opentelemetry.exporter.otlp.proto.grpc.trace_exporter']" in out.stdout
    assert "SAME True" in out.stdout
    assert "spans of 'svc-b' go there" in out.stderr  # the second service name is not silently dropped

    out = run_python("""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        mine = TracerProvider()
        trace.set_tracer_provider(mine)
        from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig, SandboxTracerConfig
        from fakes import ROUTER, endpoint
        SandboxClient(SandboxDirectConnectionConfig(api_url=ROUTER), SandboxTracerConfig(enable_tracing=True),
                      api_client=endpoint())
        print("KEPT", trace.get_tracer_provider() is mine)
    """)
    assert out.returncode == 0, out.stderr
    assert "KEPT True" in out.stdout


def test_trace_steps_cost_no_import_and_answer_empty_without_tracing() -> None:
    """A driver without tracing answers `Trace` with {} (what keeps flows identical with tracing off)."""
    from agent_sandbox_sdk._driver import SyncDriver
    from agent_sandbox_sdk._steps import Flow, Trace

    def flow() -> Flow[Any]:
        first = yield Trace("op", {"a": 1})
        second = yield Trace(None, {"b": 2})
        return first, second

    assert SyncDriver(None).run(flow()) == ({}, {})


def test_a_stream_closed_early_is_not_an_error_but_a_cancelled_call_is(
    exporter: InMemorySpanExporter,
) -> None:
    from agent_sandbox_sdk._driver import AsyncDriver, SyncDriver
    from agent_sandbox_sdk._steps import Emit, Flow, Sleep, Trace
    from agent_sandbox_sdk._tracing import Tracing

    def chunks() -> Flow[None]:
        yield Trace("stream")
        for n in range(3):
            yield Emit(n)

    events = SyncDriver(None, tracing=Tracing("unit")).iterate(chunks())
    assert next(events) == 0
    events.close()  # type: ignore[attr-defined]  # the reader stops early

    def slow() -> Flow[None]:
        yield Trace("run")
        yield Sleep(30)

    async def cancelled() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(AsyncDriver(None, tracing=Tracing("unit")).run(slow()), 0.05)

    asyncio.run(cancelled())
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["unit.stream"].status.status_code == trace.StatusCode.UNSET
    assert spans["unit.run"].status.status_code == trace.StatusCode.ERROR
    assert "CancelledError" in (spans["unit.run"].status.description or "")
