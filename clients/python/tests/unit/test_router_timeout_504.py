"""A router's 504 that says the request's own `X-Sandbox-Timeout` ran out is the call's timeout
(`SandboxRequestTimeoutError`), raised at once for every method: the caller's budget is spent. Until December 7
a GET retried it five times (`files.read(p, timeout=1)` took 21.5 s against a stuck runtime) and every method
raised a plain `SandboxRequestError` "HTTP 504". The router's other 504s (its own --proxy-timeout, its header
timeout when the request set none) are retried as before. The texts are the router's
(`agent_sandbox/router/_outcome.py` `timeout_error`); against the real router: tests/integration/sdk/
test_close_in_flight.py."""

from __future__ import annotations

import httpx2
import pytest

from agent_sandbox_sdk import (
    SandboxClient,
    SandboxDirectConnectionConfig,
    SandboxRequestError,
    SandboxRequestTimeoutError,
    _calls,
)

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit

CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)
WAITING = "Timed out waiting for the backend sandbox: sb"
#: The request's own X-Sandbox-Timeout ran out: before any response head, before a connection, or in silence.
CALLERS = [
    f"{WAITING} (no response within 1 s: X-Sandbox-Timeout)",
    f"{WAITING} (no connection within 2.5 s: X-Sandbox-Timeout)",
    f"{WAITING} (nothing relayed either way for 1 s: X-Sandbox-Timeout)",
]
#: The router's own limits: retried as any 504.
ROUTERS = [
    f"{WAITING} (no response within 180 s: the router's --proxy-timeout)",
    f"{WAITING} (no response within 180 s: X-Sandbox-Timeout 600 s, capped by the router's --proxy-timeout)",
    f"{WAITING} (no response within 60 s: the router's --response-header-timeout; a client may ask for up "
    "to 180 s with X-Sandbox-Timeout)",
]


def _client(fake: FakeCluster, detail: str, paths: tuple[str, ...]) -> SandboxClient:
    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.host != "kube.test" and request.url.path.startswith(paths):
            fake.requests.append(request)
            return httpx2.Response(504, json={"detail": detail})
        return fake.handle(request)

    return SandboxClient(CONFIG, api_client=endpoint(), transport=httpx2.MockTransport(handle), cleanup=False)


def _sent(fake: FakeCluster, prefix: str) -> int:
    return len(fake.find(lambda r: r.url.host != "kube.test" and r.url.path.startswith(prefix)))


@pytest.mark.parametrize("detail", CALLERS, ids=["response", "connection", "silence"])
def test_a_504_for_the_calls_own_timeout_is_a_timeout_not_retried(detail: str) -> None:
    fake = FakeCluster()
    client = _client(fake, detail, ("/download/", "/execute", "/upload"))
    sandbox = client.create_sandbox("python-pool")
    with pytest.raises(SandboxRequestTimeoutError) as read:
        sandbox.files.read("a.txt", timeout=1)
    assert read.value.status_code == 504
    assert "X-Sandbox-Timeout" in str(read.value)
    assert isinstance(read.value, TimeoutError)
    assert _sent(fake, "/download/") == 1, "the GET was sent again after its own timeout ran out"
    with pytest.raises(SandboxRequestTimeoutError):
        sandbox.commands.run("sleep 5", timeout=1)
    with pytest.raises(SandboxRequestTimeoutError):
        sandbox.files.write("b.txt", b"x", timeout=1)
    assert _sent(fake, "/execute") == 1
    assert _sent(fake, "/upload") == 1


@pytest.mark.parametrize("detail", ROUTERS, ids=["proxy-timeout", "capped", "header-timeout"])
def test_the_routers_own_504s_are_retried_as_before(detail: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_calls, "BACKOFF_BASE", 0.0)
    fake = FakeCluster()
    client = _client(fake, detail, ("/download/",))
    sandbox = client.create_sandbox("python-pool")
    with pytest.raises(SandboxRequestError) as read:
        sandbox.files.read("a.txt", timeout=1)
    assert not isinstance(read.value, SandboxRequestTimeoutError)
    assert read.value.status_code == 504
    assert _sent(fake, "/download/") == 1 + _calls.MAX_RETRIES
