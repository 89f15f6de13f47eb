"""The SDK's flows against an in-memory API/router/runtime (fakes.py), through both drivers.

Checks request shapes (claim body, watch parameters, routing headers), the retry policy and the error
mapping. Every scenario runs once with `SandboxClient` and once with `AsyncSandboxClient`: they share
the flows, and these tests keep it so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx2
import pytest

from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClient,
    SandboxDirectConnectionConfig,
    SandboxError,
    SandboxRequestError,
    SandboxTimeoutError,
    SandboxWarmPoolNotFoundError,
    _calls,
)

from .fakes import ROUTER, FakeCluster, endpoint, ready_condition

pytestmark = pytest.mark.unit

CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_calls, "BACKOFF_BASE", 0.001)


def sync_client(fake: FakeCluster) -> SandboxClient:
    return SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport())


def run_async(fake: FakeCluster, body: Callable[[AsyncSandboxClient], Any]) -> Any:
    async def main() -> Any:
        client = AsyncSandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport(), cleanup=False)
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(main())


def create(mode: str, fake: FakeCluster, pool: str, **kw: Any) -> Any:
    if mode == "sync":
        return sync_client(fake).create_sandbox(pool, **kw)
    return run_async(fake, lambda c: c.create_sandbox(pool, **kw))


def _check_create_and_run(fake: FakeCluster, sandbox: Any, result: Any) -> None:
    post = fake.find(lambda r: r.method == "POST" and r.url.path.endswith("/sandboxclaims"))[0]
    body = json.loads(post.content)
    assert body["spec"] == {"warmPoolRef": {"name": "python-pool"}}
    assert body["metadata"]["labels"] == {"agents.x-k8s.io/created-by": "python-client"}
    watch = fake.find(lambda r: r.url.params.get("watch") == "true")[0]
    assert watch.url.params["fieldSelector"] == f"metadata.name={sandbox.claim_name}"
    assert watch.url.params["resourceVersion"] == fake_rv_after_create(fake)
    execute = fake.find(lambda r: r.url.path == "/execute")[0]
    assert execute.headers["X-Sandbox-ID"] == sandbox.sandbox_id
    assert execute.headers["X-Sandbox-Namespace"] == "default"
    assert execute.headers["X-Sandbox-Port"] == "8888"
    assert execute.headers["X-Sandbox-Pod-IP"] == "127.10.0.5"  # taken from the claim: no extra GET
    assert execute.headers["X-Sandbox-Timeout"] == "60"
    assert json.loads(execute.content) == {"command": "echo hi"}
    assert not fake.find(lambda r: r.method == "GET" and "/sandboxes/" in r.url.path)
    assert result.stdout == "ran echo hi\n"
    assert result.exit_code == 0


def fake_rv_after_create(fake: FakeCluster) -> str:
    post = fake.find(lambda r: r.method == "POST" and r.url.path.endswith("/sandboxclaims"))[0]
    return str(101 if post else 0)


def test_create_run_terminate_sync() -> None:
    fake = FakeCluster()
    with sync_client(fake) as client:
        sandbox = client.create_sandbox("python-pool")
        assert sandbox.commands is not None
        result = sandbox.commands.run("echo hi")
        _check_create_and_run(fake, sandbox, result)
        assert client.list_active_sandboxes() == [("default", sandbox.claim_name)]
        claim = sandbox.claim_name
        sandbox.terminate()
        sandbox.terminate()  # idempotent
        assert claim not in fake.claims
        assert sandbox.commands is None
        assert not sandbox.is_active


def test_create_run_terminate_async() -> None:
    fake = FakeCluster()

    async def body(client: AsyncSandboxClient) -> None:
        sandbox = await client.create_sandbox("python-pool")
        assert sandbox.commands is not None
        result = await sandbox.commands.run("echo hi")
        _check_create_and_run(fake, sandbox, result)
        claim = sandbox.claim_name
        await sandbox.terminate()
        await sandbox.terminate()
        assert claim not in fake.claims

    run_async(fake, body)


def test_context_exit_deletes_auto_named_claims_only() -> None:
    fake = FakeCluster()
    with sync_client(fake) as client:
        auto = client.create_sandbox("python-pool")
        named = client.create_sandbox("python-pool", claim_name="keep-me")
    assert auto.claim_name not in fake.claims
    assert "keep-me" in fake.claims
    assert not named.is_active


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_wrong_pool_raises_at_once_and_rolls_the_claim_back(mode: str) -> None:
    fake = FakeCluster(
        claim_conditions=[ready_condition("False", "WarmPoolNotFound", "warm pool nope not found")],
        bind=False,
    )
    with pytest.raises(SandboxWarmPoolNotFoundError, match="nope") as info:
        create(mode, fake, "nope", sandbox_ready_timeout=30)
    assert info.value.reason == "WarmPoolNotFound"
    assert fake.claims == {}
    delete = fake.find(lambda r: r.method == "DELETE")[0]
    assert json.loads(delete.content)["preconditions"]["uid"].startswith("uid-sandbox-claim-")


def _interruption(mode: str) -> BaseException:
    """What interrupts a caller: Ctrl-C for the sync client, task cancellation for the async one."""
    return KeyboardInterrupt() if mode == "sync" else asyncio.CancelledError()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_interrupted_wait_raises_the_interruption_and_rolls_the_claim_back(mode: str) -> None:
    fake = FakeCluster(claim_conditions=[ready_condition("False", "SandboxNotReady")], bind=False)
    fake.interrupt = lambda r: _interruption(mode) if r.url.params.get("watch") == "true" else None
    with pytest.raises(type(_interruption(mode))):
        create(mode, fake, "python-pool", sandbox_ready_timeout=30)
    assert fake.claims == {}
    delete = fake.find(lambda r: r.method == "DELETE")[0]
    assert json.loads(delete.content)["preconditions"]["uid"].startswith("uid-sandbox-claim-")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_interruption_during_the_rollback_does_not_leave_the_claim_behind(mode: str) -> None:
    """The cancel (or Ctrl-C) lands while the failed create's DELETE is in flight: the DELETE is sent again and
    then the interruption goes on. Until December 6 the claim was left behind."""
    fake = FakeCluster(
        claim_conditions=[ready_condition("False", "WarmPoolNotFound", "warm pool nope not found")],
        bind=False,
    )
    fake.interrupt_before = lambda r: _interruption(mode) if r.method == "DELETE" else None
    with pytest.raises(type(_interruption(mode))):
        create(mode, fake, "nope", sandbox_ready_timeout=30)
    assert fake.claims == {}
    assert len(fake.find(lambda r: r.method == "DELETE")) == 2


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_interrupted_post_rolls_back_the_claim_it_may_have_created(mode: str) -> None:
    fake = FakeCluster()
    fake.interrupt = lambda r: _interruption(mode) if r.method == "POST" else None
    with pytest.raises(type(_interruption(mode))):
        create(mode, fake, "python-pool", sandbox_ready_timeout=30)
    assert fake.claims == {}  # the POST was applied; its answer never arrived
    [delete] = fake.find(lambda r: r.method == "DELETE")
    assert not delete.content  # the UID is unknown: the random name is ours alone


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_post_whose_answer_is_lost_rolls_back_the_claim(mode: str) -> None:
    fake = FakeCluster()
    fake.interrupt = lambda r: httpx2.ReadTimeout("lost", request=r) if r.method == "POST" else None
    with pytest.raises(SandboxRequestError, match="timed out"):
        create(mode, fake, "python-pool", sandbox_ready_timeout=30)
    assert fake.claims == {}
    assert len(fake.find(lambda r: r.method == "DELETE")) == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_interrupted_create_keeps_a_claim_the_caller_named(mode: str) -> None:
    fake = FakeCluster(claim_conditions=[ready_condition("False", "SandboxNotReady")], bind=False)
    fake.interrupt = lambda r: _interruption(mode) if r.url.params.get("watch") == "true" else None
    with pytest.raises(type(_interruption(mode))):
        create(mode, fake, "python-pool", claim_name="mine", sandbox_ready_timeout=30)
    assert list(fake.claims) == ["mine"]
    assert not fake.find(lambda r: r.method == "DELETE")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_timeout_names_the_last_condition(mode: str) -> None:
    fake = FakeCluster(
        claim_conditions=[ready_condition("False", "SandboxNotReady", "0/2 nodes are available")], bind=False
    )
    with pytest.raises(SandboxTimeoutError, match="0/2 nodes are available") as info:
        create(mode, fake, "python-pool", sandbox_ready_timeout=0.3)
    assert isinstance(info.value, TimeoutError)
    assert info.value.reason == "SandboxNotReady"
    assert fake.claims == {}


def test_idempotent_reads_are_retried_on_5xx_but_execute_is_not() -> None:
    fake = FakeCluster()
    client = sync_client(fake)
    sandbox = client.create_sandbox("python-pool")
    assert sandbox.files is not None
    assert sandbox.commands is not None
    sandbox.files.write("dir/a.txt", "hello")
    fake.faults["/download/"] = [503, 502]
    assert sandbox.files.read("dir/a.txt") == b"hello"
    assert len(fake.find(lambda r: r.url.path.startswith("/download/"))) == 3
    fake.faults["/execute"] = [502]
    with pytest.raises(SandboxRequestError, match="fault for /execute") as info:
        sandbox.commands.run("true")
    assert info.value.status_code == 502
    assert len(fake.find(lambda r: r.url.path == "/execute")) == 1
    # A 5xx drops the cached pod IP: the next call looks it up again from the Sandbox.
    sandbox.commands.run("true")
    assert fake.find(lambda r: r.method == "GET" and "/sandboxes/" in r.url.path)


def test_a_read_from_a_sandbox_that_no_longer_exists_is_not_retried() -> None:
    """Deleted behind the handle's back (another process, its claim's expiry): the router's 502 cannot turn
    into an answer. The Sandbox is read once after the first 502 and the error says it is gone; a read was
    retried five times first (15.5 s of backoff, 24 s through a real router)."""
    fake = FakeCluster()
    sandbox = sync_client(fake).create_sandbox("python-pool")
    assert sandbox.files is not None
    fake.sandboxes.clear()
    fake.faults["/download/"] = [502] * 6
    with pytest.raises(SandboxRequestError, match="no longer exists") as info:
        sandbox.files.read("a.txt")
    assert info.value.status_code == 502
    assert len(fake.find(lambda r: r.url.path.startswith("/download/"))) == 1


def test_a_read_from_a_suspended_sandbox_is_not_retried() -> None:
    """Suspended behind the handle's back (the CLI, the idle-timeout controller) and a router that does not
    resume: retries cannot help either. `agent-sandbox cp` from one took 26 s to fail, `exec` 2 s."""
    fake = FakeCluster()
    sandbox = sync_client(fake).create_sandbox("python-pool")
    assert sandbox.files is not None
    for obj in fake.sandboxes.values():
        obj.setdefault("spec", {})["operatingMode"] = "Suspended"
    fake.faults["/download/"] = [502] * 6
    with pytest.raises(SandboxRequestError, match=r"is suspended .*agent-sandbox resume") as info:
        sandbox.files.read("a.txt")
    assert info.value.status_code == 502
    assert len(fake.find(lambda r: r.url.path.startswith("/download/"))) == 1


def test_a_sandbox_nothing_answers_for_is_explained_at_once_when_suspended() -> None:
    """A direct mode (in-cluster: the pod IP, else the Service name, which does not resolve for a suspended
    Sandbox): no answer at all. Until December 6: 15 s of retries, then only "Name or service not known"."""
    fake = FakeCluster()
    handle = fake.handle

    def no_answer(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.startswith("/download/"):
            fake.requests.append(request)
            raise httpx2.ConnectError("[Errno -2] Name or service not known", request=request)
        return handle(request)

    fake.handle = no_answer  # type: ignore[method-assign]
    sandbox = sync_client(fake).create_sandbox("python-pool")
    assert sandbox.files is not None
    for obj in fake.sandboxes.values():
        obj.setdefault("spec", {})["operatingMode"] = "Suspended"
    with pytest.raises(
        SandboxRequestError, match=r"Name or service not known.* - the Sandbox .* is suspended"
    ):
        sandbox.files.read("a.txt")
    assert len(fake.find(lambda r: r.url.path.startswith("/download/"))) == 1


def test_a_listing_over_the_limit_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory of 100,000 files (~9 MB of listing) was refused by an 8 MiB limit with only "the answer is
    larger than 8388608 bytes"; the limit is 32 MiB now, and the error says what to do instead."""
    from agent_sandbox_sdk import _calls, _files

    assert _calls.MAX_LIST_RESPONSE == _files.MAX_LIST_RESPONSE == 32 << 20
    fake = FakeCluster()
    sandbox = sync_client(fake).create_sandbox("python-pool")
    assert sandbox.files is not None
    for i in range(50):
        sandbox.files.write(f"many/f{i:03d}.txt", b"")
    assert len(sandbox.files.list("many")) == 50
    monkeypatch.setattr(_files, "MAX_LIST_RESPONSE", 1 << 10)
    with pytest.raises(
        SandboxRequestError, match=r"listing of 'many' is over this SDK's .*\(`ls DIR \| wc -l`"
    ):
        sandbox.files.list("many")


def test_files_wire_shapes() -> None:
    fake = FakeCluster()
    sandbox = sync_client(fake).create_sandbox("python-pool")
    files = sandbox.files
    assert files is not None
    files.write("/dir/hello.txt", b"\x00bin\r\n--x")
    assert fake.files == {"dir/hello.txt": b"\x00bin\r\n--x"}
    download = fake.find(lambda r: r.method == "POST" and r.url.path == "/upload")[0]
    assert download.headers["X-Sandbox-ID"] == sandbox.sandbox_id
    assert files.exists("dir/hello.txt") is True
    assert fake.requests[-1].url.raw_path == b"/exists/dir%2Fhello.txt"
    assert files.exists("nope") is False
    with pytest.raises(ValueError, match=r"'\.\.' segment"):
        files.read("../etc/passwd")
    with pytest.raises(SandboxRequestError) as info:
        files.read("missing")
    assert info.value.status_code == 404


def test_env_on_a_runtime_that_ignores_it_raises() -> None:
    fake = FakeCluster(execute_extra={})  # an upstream python-runtime: no `truncated` in the answer
    sandbox = sync_client(fake).create_sandbox("python-pool")
    assert sandbox.commands is not None
    assert sandbox.commands.run("true").exit_code == 0
    with pytest.raises(SandboxError, match="ignored env/cwd"):
        sandbox.commands.run("env", env={"A": "1"})


def test_suspend_and_resume_wait_for_the_new_generation() -> None:
    fake = FakeCluster()
    sandbox = sync_client(fake).create_sandbox("python-pool")
    sandbox.suspend()
    assert fake.sandboxes[sandbox.sandbox_id]["spec"]["operatingMode"] == "Suspended"
    sandbox.resume()
    assert fake.sandboxes[sandbox.sandbox_id]["spec"]["operatingMode"] == "Running"


def test_suspending_a_deleted_sandbox_is_not_found() -> None:
    """Spec §3.10; until December 6 suspend() raised the API server's 404 as a plain SandboxRequestError."""
    from agent_sandbox_sdk import SandboxNotFoundError

    fake = FakeCluster()
    sandbox = sync_client(fake).create_sandbox("python-pool")
    del fake.sandboxes[sandbox.sandbox_id]
    with pytest.raises(SandboxNotFoundError, match=f"Sandbox default/{sandbox.sandbox_id} not found"):
        sandbox.suspend()


def test_get_sandbox_reuses_the_tracked_handle_and_unknown_claims_raise() -> None:
    fake = FakeCluster()
    client = sync_client(fake)
    sandbox = client.create_sandbox("python-pool")
    assert client.get_sandbox(sandbox.claim_name or "") is sandbox
    from agent_sandbox_sdk import SandboxNotFoundError

    with pytest.raises(SandboxNotFoundError, match="not found"):
        client.get_sandbox("nobody")
    assert client.get_sandbox_claim_warmpool_name(sandbox.claim_name or "", "default") == "python-pool"
    assert client.list_all_sandboxes() == [sandbox.claim_name]
    infos = client.list_sandboxes()
    assert [(i.claim_name, i.ready, i.pod_ip) for i in infos] == [(sandbox.claim_name, True, "127.10.0.5")]


@pytest.mark.parametrize("timeout", [0, -5, float("nan"), float("inf"), 2**31, 1e10])
def test_a_command_timeout_must_be_positive_and_finite(timeout: float) -> None:
    """Until December 6 `inf` / `1e10` / `2**31` got past this and failed below the SDK: an OverflowError from
    the socket layer, a timeout at once, a false "timed out" from sandboxd's gRPC deadline before the command
    ever ran."""
    fake = FakeCluster()
    with sync_client(fake) as client:
        sandbox = client.create_sandbox("python-pool")
        assert sandbox.commands is not None
        sent = len(fake.requests)
        for call in (
            lambda: sandbox.commands.run("true", timeout=timeout),  # type: ignore[union-attr]
            lambda: sandbox.commands.run("true", command_timeout=timeout),  # type: ignore[union-attr]
            lambda: list(sandbox.commands.stream("true", timeout=timeout)),  # type: ignore[union-attr]
            lambda: sandbox.files.exists("x", timeout=timeout),
        ):
            with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
                call()
        assert len(fake.requests) == sent  # refused before anything was sent


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("timeout", [0, float("inf"), 1e10])
def test_a_suspend_or_resume_timeout_is_refused_before_the_change_is_made(mode: str, timeout: float) -> None:
    """Until December 7 `suspend(timeout=1e10)` patched the Sandbox, then failed with an OverflowError from the
    wait (the CLI printed its traceback after the sandbox was suspended)."""
    fake = FakeCluster()

    async def attempt_async(client: AsyncSandboxClient) -> None:
        sandbox = await client.create_sandbox("python-pool")
        sent = len(fake.requests)
        for call in (sandbox.suspend, sandbox.resume):
            with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
                await call(timeout=timeout)
        assert len(fake.requests) == sent

    if mode == "async":
        run_async(fake, attempt_async)
        return
    with sync_client(fake) as client:
        sandbox = client.create_sandbox("python-pool")
        sent = len(fake.requests)
        for call in (sandbox.suspend, sandbox.resume):
            with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
                call(timeout=timeout)
        assert len(fake.requests) == sent  # refused before anything was sent


class _StaleAddress(FakeCluster):
    """A router that refuses the first `refusals` requests: the pod IP sent is no longer the sandbox's."""

    refusals = 1

    def _runtime(self, request: httpx2.Request, path: str) -> httpx2.Response:
        if self.refusals:
            self.refusals -= 1
            ip = request.headers.get("x-sandbox-pod-ip")
            return httpx2.Response(
                403, json={"detail": f"X-Sandbox-Pod-IP {ip} does not belong to sandbox ns/x."}
            )
        return super()._runtime(request, path)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_refused_stale_pod_ip_is_dropped_and_the_call_sent_again_once(mode: str) -> None:
    fake = _StaleAddress()

    async def run_async_call(client: AsyncSandboxClient) -> Any:
        sandbox = await client.create_sandbox("python-pool")
        return await sandbox.commands.run("echo hi")  # type: ignore[union-attr]

    if mode == "sync":
        result = sync_client(fake).create_sandbox("python-pool").commands.run("echo hi")  # type: ignore[union-attr]
    else:
        result = run_async(fake, run_async_call)
    assert result.exit_code == 0
    posts = fake.find(lambda r: r.method == "POST" and r.url.path == "/execute")
    assert len(posts) == 2  # refused unforwarded, then sent again (a POST: safe, nothing ran)
    sandbox_gets = fake.find(lambda r: r.method == "GET" and "/sandboxes/" in r.url.path)
    assert sandbox_gets  # the address was read again before the second attempt
    fake_twice = _StaleAddress()
    fake_twice.refusals = 2
    with pytest.raises(SandboxRequestError, match="does not belong to sandbox"):
        sync_client(fake_twice).create_sandbox("python-pool").commands.run("echo hi")  # type: ignore[union-attr]
    assert len(fake_twice.find(lambda r: r.method == "POST" and r.url.path == "/execute")) == 2


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_successful_answer_is_not_read_for_an_error_message(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a 403 can be the router's stale-address refusal. Reading every answer for one decoded a whole
    download twice more (a 300 MiB `files.read` took 3.3 s and 1.8 GiB instead of 0.6 s and 0.65 GiB)."""
    examined: list[int] = []
    detail = _calls.error_detail

    def recording(resp: Any) -> str:
        examined.append(resp.status_code)
        return detail(resp)

    monkeypatch.setattr(_calls, "error_detail", recording)
    fake = FakeCluster()

    async def use(client: AsyncSandboxClient) -> None:
        sandbox = await client.create_sandbox("python-pool")
        await sandbox.files.write("a.bin", b"x" * 1000)  # type: ignore[union-attr]
        assert await sandbox.files.read("a.bin") == b"x" * 1000  # type: ignore[union-attr]
        assert (await sandbox.commands.run("echo hi")).exit_code == 0  # type: ignore[union-attr]

    if mode == "sync":
        sandbox = sync_client(fake).create_sandbox("python-pool")
        sandbox.files.write("a.bin", b"x" * 1000)  # type: ignore[union-attr]
        assert sandbox.files.read("a.bin") == b"x" * 1000  # type: ignore[union-attr]
        assert sandbox.commands.run("echo hi").exit_code == 0  # type: ignore[union-attr]
    else:
        run_async(fake, use)
    assert examined == []
    fake.faults["/download/"] = [404]
    with pytest.raises(SandboxRequestError):
        sync_client(fake).create_sandbox("python-pool").files.read("a.bin")  # type: ignore[union-attr]
    assert examined == [404]  # an error still gets its message


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_large_in_memory_write_is_streamed_with_its_length(mode: str) -> None:
    """Over `STREAM_ABOVE` bytes are sent from the caller's buffer (a 200 MiB write took 590 MiB more memory
    when the multipart framing was joined around it), as one Content-Length body, not chunked: a server or
    proxy that refuses chunked uploads takes it as before."""
    fake = FakeCluster()
    big = bytes(range(256)) * 8192 + b"tail"

    async def use(client: AsyncSandboxClient) -> None:
        sandbox = await client.create_sandbox("python-pool")
        await sandbox.files.write("big.bin", big)  # type: ignore[union-attr]

    if mode == "sync":
        sync_client(fake).create_sandbox("python-pool").files.write("big.bin", big)  # type: ignore[union-attr]
    else:
        run_async(fake, use)
    assert fake.files == {"big.bin": big}
    upload = fake.find(lambda r: r.method == "POST" and r.url.path == "/upload")[0]
    assert "transfer-encoding" not in upload.headers
    assert int(upload.headers["content-length"]) == len(upload.content) > len(big)


def test_a_mode_on_the_legacy_runtime_is_set_by_a_chmod_after_the_upload() -> None:
    fake = FakeCluster()
    sandbox = sync_client(fake).create_sandbox("python-pool")
    assert sandbox.files is not None
    sent = len(fake.requests)
    for bad in (0o1000, -1, True, "755", 7.5):
        with pytest.raises(ValueError, match="mode must be permission bits"):
            sandbox.files.write("run.sh", "x", mode=bad)  # type: ignore[arg-type]
    assert len(fake.requests) == sent  # refused before anything was sent
    sandbox.files.write("/bin dir/run.sh", "#!/bin/sh\n", mode=0o755)
    upload, chmod = fake.requests[-2:]
    assert upload.url.path == "/upload"
    assert upload.url.params["mode"] == "0755"  # this project's runtime sets it as it writes
    assert json.loads(chmod.content) == {"command": "chmod 0755 -- 'bin dir/run.sh'"}
    fake.execute_extra = {"exit_code": 1, "stderr": "chmod: not permitted\n"}
    with pytest.raises(
        SandboxError, match=r"run\.sh: written, but setting its mode 0700 failed: chmod: not permitted"
    ):
        sandbox.files.write("run.sh", "x", mode=0o700)


class _CutStream(httpx2.SyncByteStream, httpx2.AsyncByteStream):
    """A streamed answer that stops mid-way, as when a router's idle limit or a dying pod closes it."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield b'{"type": "start", "pid": 7}\n{"type": "stdout", "data": "half"}\n'
        raise httpx2.RemoteProtocolError("peer closed connection without sending complete message body")

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        for chunk in self.__iter__():
            yield chunk


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stream_cut_off_mid_way_says_so_not_no_response(mode: str) -> None:
    """Until December 5 it read `no response (RemoteProtocolError ...)` after output had already arrived."""
    fake = FakeCluster()
    handle = fake.handle

    def cut(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/execute/stream":
            fake.requests.append(request)
            return httpx2.Response(200, headers={"content-type": "application/x-ndjson"}, stream=_CutStream())
        return handle(request)

    fake.handle = cut  # type: ignore[method-assign]
    seen: list[Any] = []

    def consume(sb: Any) -> None:
        for event in sb.commands.stream("sleep 300"):
            seen.append(event)

    async def consume_async(sb: Any) -> None:
        async for event in sb.commands.stream("sleep 300"):
            seen.append(event)

    def run() -> None:
        if mode == "sync":
            consume(sync_client(fake).create_sandbox("pool"))
        else:
            run_async(fake, lambda c: _then(c.create_sandbox("pool"), consume_async))

    with pytest.raises(SandboxError) as info:
        run()
    assert [e.data for e in seen if e.type == "stdout"] == [b"half"]
    message = str(info.value)
    assert "no response" not in message
    assert "the response was cut off (RemoteProtocolError" in message
    assert "--proxy-timeout" in message


async def _then(created: Any, body: Callable[[Any], Any]) -> Any:
    return await body(await created)


def test_signals_and_stdin_on_a_legacy_stream_say_the_runtime_has_none() -> None:
    """As `stream(stdin=...)` does; until December 6 `send_signal` said the (running) process had not started."""
    fake = FakeCluster()
    sandbox = sync_client(fake).create_sandbox("python-pool")
    assert sandbox.commands is not None
    stream = sandbox.commands.stream("sleep 30")
    for call in (lambda: stream.send_signal(15), stream.close_stdin, lambda: stream.send_stdin(b"x")):
        with pytest.raises(NotImplementedError, match="need the sandboxd runtime"):
            call()


def test_a_text_mode_file_is_refused_naming_binary_mode(tmp_path: Any) -> None:
    fake = FakeCluster()
    sandbox = sync_client(fake).create_sandbox("python-pool")
    assert sandbox.files is not None
    source = tmp_path / "notes.txt"
    source.write_text("hello")
    with source.open() as text, pytest.raises(TypeError, match=r"text-mode file: open it in binary mode"):
        sandbox.files.write("notes.txt", text)  # type: ignore[arg-type]
    with source.open("rb") as binary:
        sandbox.files.write("notes.txt", binary)
    assert fake.files["notes.txt"] == b"hello"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_status_of_a_deleted_sandbox_is_upstreams_answer(mode: str) -> None:
    """spec §3.4 (upstream 1.0.8, both handles): ("SandboxNotFound", "Sandbox object not found in Kubernetes.").
    Until December 6 `AsyncSandbox.status()` said "AsyncSandbox object ..." (a rename that reached the text)."""
    fake = FakeCluster()
    if mode == "sync":
        sandbox = sync_client(fake).create_sandbox("python-pool")
        fake.sandboxes.clear()
        status = sandbox.status()
    else:

        async def body(client: AsyncSandboxClient) -> tuple[str, str]:
            sandbox = await client.create_sandbox("python-pool")
            fake.sandboxes.clear()
            return await sandbox.status()

        status = run_async(fake, body)
    assert status == ("SandboxNotFound", "Sandbox object not found in Kubernetes.")
