"""The runtime's part in sandbox lifecycle (docs/lifecycle.md): `GET /v1/activity` and the claim env file.

Real servers on 127.0.0.1, real commands. Activity: every non-probe request and every command start/exit
counts; a running command or an in-flight request keeps the sandbox busy. Claim env: the file a downward
API volume projects from the pod annotation `runtime.agents.x-k8s.io/claim-env` is applied to every command
(legacy, streamed and gRPC), re-read when it changes, waited for while empty, and refused when malformed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import grpc
import orjson
import pytest

from agent_sandbox.api.lifecycle import HEADER_NOT_STARTED
from agent_sandbox.runtime import RuntimeServer
from tests.helpers import eventually
from tests.integration.runtime.conftest import MakeRuntime, url
from tests.integration.runtime.helpers import ProcessClient

pytestmark = pytest.mark.integration


async def _activity(http: aiohttp.ClientSession, server: RuntimeServer) -> dict[str, float]:
    async with http.get(url(server, "rest", "/v1/activity")) as resp:
        assert resp.status == 200
        body: dict[str, float] = await resp.json()
        return body


async def _run(
    http: aiohttp.ClientSession, server: RuntimeServer, command: str, **extra: object
) -> dict[str, object]:
    async with http.post(
        url(server, "legacy", "/execute"), data=orjson.dumps({"command": command, **extra})
    ) as resp:
        assert resp.status == 200
        body: dict[str, object] = await resp.json()
        return body


async def test_activity_counts_requests_not_probes(
    runtime: RuntimeServer, http: aiohttp.ClientSession
) -> None:
    await asyncio.sleep(0.3)
    first = await _activity(http, runtime)
    assert first["idleSeconds"] >= 0.25
    assert (first["runningCommands"], first["inflightRequests"]) == (0, 0)
    # Probes are not activity: health on both listeners, metadata, the activity endpoint itself.
    for port, path in (("legacy", "/"), ("rest", "/v1/health"), ("rest", "/v1/metadata")):
        async with http.get(url(runtime, port, path)) as resp:
            assert resp.status == 200
    assert (await _activity(http, runtime))["idleSeconds"] >= first["idleSeconds"]
    # A file read is.
    async with http.get(url(runtime, "rest", "/v1/files/")) as resp:
        assert resp.status == 200
    assert (await _activity(http, runtime))["idleSeconds"] < 0.2


async def test_running_command_keeps_the_sandbox_busy(
    runtime: RuntimeServer, http: aiohttp.ClientSession, grpc_client: ProcessClient
) -> None:
    call = grpc_client.start("sleep", "1")
    events = grpc_client.events(call)
    await anext(events)  # init: the command runs
    await asyncio.sleep(0.5)
    busy = await _activity(http, runtime)
    assert busy["runningCommands"] == 1
    assert busy["idleSeconds"] == 0
    async for _ in events:
        pass
    await asyncio.sleep(0.3)
    after = await _activity(http, runtime)
    assert after["runningCommands"] == 0
    assert 0.25 <= after["idleSeconds"] < 5  # counted from the command's exit, not its start


async def test_claim_env_applies_to_every_command(
    make_runtime: MakeRuntime, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    env_file = tmp_path / "claim-env"
    env_file.write_text(json.dumps({"CLAIM_A": "one", "SHARED": "claim"}))
    server = await make_runtime(
        claim_env_file=str(env_file), command_env={"PATH": "/usr/bin:/bin", "SHARED": "base"}
    )
    body = await _run(http, server, "sh -c 'echo $CLAIM_A $SHARED'")
    assert body["stdout"] == "one claim\n"
    # A request's own env wins over the claim's.
    body = await _run(http, server, "sh -c 'echo $SHARED'", env={"SHARED": "request"})
    assert body["stdout"] == "request\n"
    # Streamed exec and gRPC get it too.
    async with http.post(
        url(server, "legacy", "/execute/stream"), data=orjson.dumps({"command": "sh -c 'echo $CLAIM_A'"})
    ) as resp:
        lines = [json.loads(line) for line in (await resp.read()).splitlines()]
    assert {"type": "stdout", "data": "one\n"} in lines
    from grpc import aio

    async with aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        result = await ProcessClient(channel).execute("sh", "-c", "echo $CLAIM_A")
    assert result.stdout == b"one\n"
    # The file changes (the kubelet swaps it): the next command sees the new value.
    tmp = tmp_path / "claim-env.new"
    tmp.write_text(json.dumps({"CLAIM_A": "two"}))
    tmp.replace(env_file)
    body = await _run(http, server, "sh -c 'echo $CLAIM_A $SHARED'")
    assert body["stdout"] == "two base\n"


async def test_claim_env_not_delivered_yet_waits_then_fails(
    make_runtime: MakeRuntime, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    env_file = tmp_path / "claim-env"
    env_file.write_text("")  # the pod has no annotation yet
    server = await make_runtime(claim_env_file=str(env_file), claim_env_wait=5.0)

    async def deliver() -> None:
        await asyncio.sleep(0.5)
        env_file.write_text(json.dumps({"LATE": "yes"}))

    task = asyncio.create_task(deliver())
    body = await _run(http, server, "sh -c 'echo $LATE'")
    await task
    assert body["stdout"] == "yes\n"  # the command waited for its env instead of running without it

    env_file.write_text("")
    short = await make_runtime(claim_env_file=str(env_file), claim_env_wait=0.3)
    body = await _run(http, short, "echo never")
    assert body["exit_code"] == 1
    assert "claim environment was not delivered within 0.3s" in str(body["stderr"])


async def test_malformed_claim_env_refuses_commands(
    make_runtime: MakeRuntime, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    env_file = tmp_path / "claim-env"
    env_file.write_text('["not", "an", "object"]')
    server = await make_runtime(claim_env_file=str(env_file))
    body = await _run(http, server, "echo never")
    assert body["exit_code"] == 1
    assert "is not usable: want a JSON object" in str(body["stderr"])


async def test_no_claim_env_file_means_no_claim_env(
    make_runtime: MakeRuntime, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    server = await make_runtime(
        claim_env_file=str(tmp_path / "absent"), command_env={"PATH": "/usr/bin:/bin"}
    )
    body = await _run(http, server, "sh -c 'echo [$CLAIM_A]'")
    assert body["stdout"] == "[]\n"


async def test_a_command_asked_for_while_draining_is_not_run_and_answered_so(
    runtime: RuntimeServer, http: aiohttp.ClientSession, grpc_client: ProcessClient
) -> None:
    """Between SIGTERM and the listeners closing, a request already read (or just arriving) asks for a command
    the draining runtime no longer starts. It is answered `503` with `X-Sandbox-Not-Started`, which a lifecycle
    router takes for a request it may send whole to the resumed pod. Until December 7 the connection was closed
    unanswered (and before that answered `429`, which a router relayed as the request's failure): a close
    cannot be told from a runtime killed while running the command, so the router sent both again, and such a
    command ran twice. gRPC says UNAVAILABLE, the code clients retry. Nothing runs."""
    marker = Path(runtime.config.root_dir) / "ran"
    await runtime.state.supervisor.shutdown(0.5)  # the drain's first step; the listeners are still open
    for path in ("/execute", "/execute/stream"):
        async with http.post(
            url(runtime, "legacy", path), data=orjson.dumps({"command": f"touch {marker}"})
        ) as resp:
            assert resp.status == 503
            assert resp.headers[HEADER_NOT_STARTED] == "shutting down"
            assert resp.headers["Retry-After"] == "1"
            assert await resp.json() == {"message": "runtime is shutting down: the command was not started"}
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await grpc_client.execute("touch", str(marker))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not marker.exists()


async def test_a_command_waiting_for_its_claim_env_is_answered_not_started_when_the_drain_begins(
    make_runtime: MakeRuntime, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A command still waiting for its claim env when the drain begins was not started: it is answered so at
    once, while the listener is open. Until December 7 it went on waiting past the stop's deadline and its
    connection was reset unanswered, which a router must take for a request that may have run."""
    env_file = tmp_path / "claim-env"
    env_file.write_text("")  # the pod has no annotation yet
    server = await make_runtime(claim_env_file=str(env_file), claim_env_wait=60.0)
    marker = tmp_path / "ran"
    asked = asyncio.ensure_future(
        http.post(url(server, "legacy", "/execute"), data=orjson.dumps({"command": f"touch {marker}"}))
    )

    async def waiting() -> bool:
        return server.state.activity.inflight >= 1

    await eventually(waiting, "the command waiting for its claim env")
    await server.state.supervisor.shutdown(0.5)  # the drain's first step; the listeners are still open
    # At once, not after the claim env's 60 s wait: bounded here so the old behaviour fails, not hangs.
    async with await asyncio.wait_for(asked, 10) as resp:
        assert resp.status == 503
        assert resp.headers[HEADER_NOT_STARTED] == "shutting down"
    assert not marker.exists()
