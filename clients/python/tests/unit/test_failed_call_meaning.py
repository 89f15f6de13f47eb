"""What a call that could not reach its sandbox means (probe faults10, December 7):

- its Sandbox is gone (deleted, its claim expired): `SandboxDeletedError`, both the `SandboxNotFoundError` the
  documented tree promises for a deleted sandbox and the `SandboxRequestError` it was (upstream's callers catch
  that), with the call's status and `request_sent`. It was a plain `SandboxRequestError`;
- its Sandbox exists and runs, and a POST was answered 502 (the router's text for any failure of its exchange
  with the sandbox, also a runtime that died mid-command): the error says the command may have started, so
  that nobody runs it again blindly. It read "Could not connect to the backend sandbox" only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx2
import pytest

from agent_sandbox_sdk import (
    AsyncSandboxClient,
    Sandbox,
    SandboxClient,
    SandboxConnectionError,
    SandboxDeletedError,
    SandboxDirectConnectionConfig,
    SandboxNotFoundError,
    SandboxRequestError,
    _calls,
)

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit

CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_calls, "BACKOFF_BASE", 0.001)


def router_502(fake: FakeCluster, prefix: str) -> None:
    """Requests under `prefix` answered as the router answers when its exchange with the sandbox failed."""
    handle = fake.handle

    def answer(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.startswith(prefix):
            fake.requests.append(request)
            sandbox_id = request.headers.get("X-Sandbox-ID", "?")
            return httpx2.Response(
                502, json={"detail": f"Could not connect to the backend sandbox: {sandbox_id}"}
            )
        return handle(request)

    fake.handle = answer  # type: ignore[method-assign]


def sent_to(fake: FakeCluster, prefix: str) -> int:
    return len(fake.find(lambda r: r.url.path.startswith(prefix)))


def new_sandbox(fake: FakeCluster) -> Sandbox:
    return SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()).create_sandbox(
        "python-pool"
    )


def _run(sb: Sandbox) -> object:
    assert sb.commands is not None
    return sb.commands.run("echo hi")


def _stream(sb: Sandbox) -> object:
    assert sb.commands is not None
    return list(sb.commands.stream("echo hi"))


def _write(sb: Sandbox) -> object:
    assert sb.files is not None
    return sb.files.write("x", b"1")


def _read(sb: Sandbox) -> object:
    assert sb.files is not None
    return sb.files.read("x")


#: name -> (the path it is sent to, the call)
CALLS: dict[str, tuple[str, Callable[[Sandbox], object]]] = {
    "run": ("/execute", _run),
    "stream": ("/execute/stream", _stream),
    "write": ("/upload", _write),
    "read": ("/download/", _read),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_on_a_deleted_sandbox_is_not_found_and_still_a_request_error(name: str) -> None:
    prefix, call = CALLS[name]
    fake = FakeCluster()
    router_502(fake, prefix)
    sandbox = new_sandbox(fake)
    fake.sandboxes.clear()
    with pytest.raises(SandboxNotFoundError, match="no longer exists") as info:
        call(sandbox)
    err = info.value
    assert isinstance(err, SandboxDeletedError)
    assert isinstance(err, SandboxRequestError)
    assert (err.status_code, err.request_sent) == (502, True)
    assert err.response is not None
    assert err.response.status_code == 502
    assert "Could not connect to the backend sandbox" in str(err)
    assert "may have started" not in str(err)  # gone: nothing to run again
    assert sent_to(fake, prefix) == 1


def test_a_deleted_sandbox_nothing_answers_for_keeps_request_sent_false() -> None:
    """A direct mode's connect failure sent nothing: the error says so (repeating it is safe)."""
    fake = FakeCluster()
    handle = fake.handle

    def no_answer(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/execute":
            fake.requests.append(request)
            raise httpx2.ConnectError("[Errno 111] Connection refused", request=request)
        return handle(request)

    fake.handle = no_answer  # type: ignore[method-assign]
    sandbox = new_sandbox(fake)
    assert sandbox.commands is not None
    fake.sandboxes.clear()
    with pytest.raises(
        SandboxDeletedError, match=r"Connection refused.* - the Sandbox .* no longer exists"
    ) as info:
        sandbox.commands.run("echo hi")
    assert (info.value.status_code, info.value.request_sent) == (None, False)
    assert sent_to(fake, "/execute") == 1


def test_a_call_on_a_deleted_sandbox_async() -> None:
    fake = FakeCluster()
    router_502(fake, "/execute")

    async def main() -> BaseException | None:
        async with AsyncSandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()) as client:
            sandbox = await client.create_sandbox("python-pool")
            assert sandbox.commands is not None
            fake.sandboxes.clear()
            try:
                await sandbox.commands.run("echo hi")
            except SandboxRequestError as err:
                return err
        return None

    err = asyncio.run(main())
    assert isinstance(err, SandboxDeletedError)
    assert isinstance(err, SandboxRequestError)
    assert err.status_code == 502


def test_a_suspended_sandbox_is_not_said_to_be_missing() -> None:
    fake = FakeCluster()
    router_502(fake, "/execute")
    sandbox = new_sandbox(fake)
    assert sandbox.commands is not None
    for obj in fake.sandboxes.values():
        obj.setdefault("spec", {})["operatingMode"] = "Suspended"
    with pytest.raises(SandboxRequestError, match="is suspended") as info:
        sandbox.commands.run("echo hi")
    assert not isinstance(info.value, SandboxNotFoundError)
    assert "may have started" not in str(info.value)


@pytest.mark.parametrize("name", ["run", "stream", "write"])
def test_a_post_answered_502_while_the_sandbox_runs_may_have_run(name: str) -> None:
    """The runtime died under the command (the router: "Could not connect to the backend sandbox"): it had
    started. Said, and not retried."""
    prefix, call = CALLS[name]
    fake = FakeCluster()
    router_502(fake, prefix)
    sandbox = new_sandbox(fake)
    with pytest.raises(SandboxRequestError) as info:
        call(sandbox)
    err = info.value
    assert type(err) is SandboxRequestError
    assert (err.status_code, err.request_sent) == (502, True)
    message = str(err)
    assert message.startswith(f"POST {ROUTER}{prefix}: HTTP 502: Could not connect to the backend sandbox: ")
    assert "the request reached the router" in message
    assert "the command may have started" in message
    assert "not retried" in message
    assert sent_to(fake, prefix) == 1


def test_a_read_answered_502_is_retried_and_not_said_to_have_run() -> None:
    fake = FakeCluster()
    sandbox = new_sandbox(fake)
    assert sandbox.files is not None
    fake.faults["/download/"] = [502] * 6
    with pytest.raises(SandboxRequestError) as info:
        sandbox.files.read("x")
    assert "may have started" not in str(info.value)
    assert sent_to(fake, "/download/") == 6


def test_a_post_that_got_no_answer_is_unchanged() -> None:
    """No HTTP answer is a `SandboxConnectionError` whose own text says what happened; only a 502 is explained."""
    fake = FakeCluster()
    handle = fake.handle

    def cut(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/execute":
            raise httpx2.RemoteProtocolError(
                "Server disconnected without sending a response.", request=request
            )
        return handle(request)

    fake.handle = cut  # type: ignore[method-assign]
    sandbox = new_sandbox(fake)
    assert sandbox.commands is not None
    with pytest.raises(SandboxConnectionError) as info:
        sandbox.commands.run("echo hi")
    assert "may have started" not in str(info.value)
