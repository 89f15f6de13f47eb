"""gRPC server reflection of `agent-sandbox-runtime` as a process: both protocol versions, as sandboxd.

Upstream's sandboxd calls grpc-go's `reflection.Register`, which serves `grpc.reflection.v1.ServerReflection`
and `grpc.reflection.v1alpha.ServerReflection`. A client that speaks only v1 (grpc-java's
ProtoReflectionServiceV1 clients, `buf curl --reflect-protocol grpc-v1`) got UNIMPLEMENTED from us until
December 6: grpcio-reflection ships only v1alpha. The runtime runs as its own process here, so its descriptor
pool is not the test's (nothing imported by the test can make a missing descriptor appear).
"""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc import aio
from grpc_reflection.v1alpha import reflection_pb2 as rpb

from agent_sandbox.api import processv1
from tests.grpcurl import ensure_grpcurl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCRIPT = Path(sys.executable).with_name("agent-sandbox-runtime")
V1 = "grpc.reflection.v1.ServerReflection"
V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
ALL_SERVICES = sorted([V1, V1ALPHA, processv1.SERVICE])


def _free_ports(host: str, count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@pytest.fixture
async def grpc_target(tmp_path: Path) -> AsyncIterator[str]:
    """host:port of the gRPC listener of a started `agent-sandbox-runtime` process."""
    host = f"127.251.{random.randint(0, 255)}.{random.randint(2, 254)}"
    legacy, rest, grpc_port = _free_ports(host, 3)
    proc = await asyncio.create_subprocess_exec(
        str(SCRIPT), "--listen-host", host, "--root-dir", str(tmp_path / "workspace"),
        "--legacy-port", str(legacy), "--rest-port", str(rest), "--grpc-port", str(grpc_port),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    target = f"{host}:{grpc_port}"
    try:
        async with aio.insecure_channel(target) as channel:
            try:
                await asyncio.wait_for(channel.channel_ready(), 30)
            except TimeoutError:
                proc.kill()
                err = (await proc.stderr.read()).decode() if proc.stderr else ""
                pytest.fail(f"runtime did not listen on {target}: {err}")
        yield target
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _reflect(
    target: str, service: str, *requests: rpb.ServerReflectionRequest
) -> list[rpb.ServerReflectionResponse]:
    """One ServerReflectionInfo stream at `service`'s method path.

    v1 and v1alpha messages are wire-identical (same fields and numbers, only the package differs), so the
    v1alpha classes encode a v1 request byte for byte as a v1 client does.
    """
    async with aio.insecure_channel(target) as channel:
        call = channel.stream_stream(
            f"/{service}/ServerReflectionInfo",
            request_serializer=rpb.ServerReflectionRequest.SerializeToString,
            response_deserializer=rpb.ServerReflectionResponse.FromString,
        )
        return [resp async for resp in call(iter(requests), timeout=30)]


def _files(resp: rpb.ServerReflectionResponse) -> list[descriptor_pb2.FileDescriptorProto]:
    assert resp.WhichOneof("message_response") == "file_descriptor_response", resp
    return [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in resp.file_descriptor_response.file_descriptor_proto
    ]


def _pool(files: list[descriptor_pb2.FileDescriptorProto]) -> descriptor_pool.DescriptorPool:
    """A fresh pool built from the files a response sent, dependencies first (as a client builds one)."""
    pool, pending = descriptor_pool.DescriptorPool(), {f.name: f for f in files}
    while pending:
        ready = [f for f in pending.values() if all(d not in pending for d in f.dependency)]
        assert ready, f"unresolvable dependencies among {sorted(pending)}"
        for file in ready:
            pool.Add(file)
            del pending[file.name]
    return pool


@pytest.mark.parametrize("service", [V1, V1ALPHA])
async def test_list_services_on_both_versions(grpc_target: str, service: str) -> None:
    (resp,) = await _reflect(grpc_target, service, rpb.ServerReflectionRequest(list_services=""))
    assert sorted(s.name for s in resp.list_services_response.service) == ALL_SERVICES


async def test_v1_file_containing_symbol(grpc_target: str) -> None:
    process, reflection, request_type, missing = await _reflect(
        grpc_target,
        V1,
        rpb.ServerReflectionRequest(file_containing_symbol=processv1.SERVICE),
        rpb.ServerReflectionRequest(file_containing_symbol=V1),
        rpb.ServerReflectionRequest(file_containing_symbol="grpc.reflection.v1.ServerReflectionRequest"),
        rpb.ServerReflectionRequest(file_containing_symbol="no.such.Symbol"),
    )
    service = _pool(_files(process)).FindServiceByName(processv1.SERVICE)
    assert service.file.name == "process/v1/process.proto"
    assert sorted(m.name for m in service.methods) == sorted(processv1.METHODS)
    assert service.methods_by_name["Start"].server_streaming

    # The v1 service is described as itself (grpcurl's `describe` resolves every listed service).
    pool = _pool(_files(reflection))
    info = pool.FindServiceByName(V1).methods_by_name["ServerReflectionInfo"]
    assert info.containing_service.file.name == "grpc/reflection/v1/reflection.proto"
    assert info.containing_service.file.package == "grpc.reflection.v1"
    assert (info.client_streaming, info.server_streaming) == (True, True)
    assert info.input_type.full_name == "grpc.reflection.v1.ServerReflectionRequest"
    assert info.output_type.full_name == "grpc.reflection.v1.ServerReflectionResponse"
    # ... with the fields of v1alpha, which is why one servicer can serve both
    alpha = rpb.DESCRIPTOR.message_types_by_name["ServerReflectionRequest"]
    assert [(f.name, f.number, f.type) for f in info.input_type.fields] == [
        (f.name, f.number, f.type) for f in alpha.fields
    ]
    assert [f.name for f in _files(request_type)] == ["grpc/reflection/v1/reflection.proto"]

    assert missing.WhichOneof("message_response") == "error_response"
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
    assert missing.original_request.file_containing_symbol == "no.such.Symbol"


def test_grpcurl_lists_and_describes_every_service(grpc_target: str) -> None:
    """grpcurl (grpc-go's reflection client: v1 first, v1alpha when v1 is UNIMPLEMENTED) still works."""
    grpcurl = str(ensure_grpcurl())

    def run(*args: str) -> str:
        out = subprocess.run(
            [grpcurl, "-plaintext", "-max-time", "30", grpc_target, *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert sorted(run("list").split()) == ALL_SERVICES
    described = run("describe")  # every listed service, resolved through reflection
    for name in ALL_SERVICES:
        assert f"{name} is a service:" in described
    assert "rpc ServerReflectionInfo ( stream .grpc.reflection.v1.ServerReflectionRequest )" in described
    for rpc in processv1.METHODS:
        assert f"rpc {rpc} (" in described
