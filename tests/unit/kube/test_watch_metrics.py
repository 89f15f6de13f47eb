"""`rest_client_requests_total` counts watches as client-go does: labelled with the verb they are sent as
(`method="GET"`), and a watch that gets no response (connection refused) as `code="<error>"`.

Until December 7 watches were labelled `method="WATCH"` and a refused one was not counted at all: during a
30 s API server outage the controller's `code="<error>"` moved by one while its informers failed 43 watches.
Real loopback sockets: a port nothing listens on, and an aiohttp server that answers a watch 200.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest

from agent_sandbox.kube import ApiClient, TransportError
from agent_sandbox.kube._config import ClusterConfig, NoAuth
from agent_sandbox.kube._resources import CONFIG_MAP
from agent_sandbox.kube.metrics import REGISTRY
from tests.unit.kube.test_watch_silence import watch_server

pytestmark = pytest.mark.unit


def _count(host: str, method: str, code: str) -> float:
    value = REGISTRY.get_sample_value(
        "rest_client_requests_total", {"code": code, "method": method, "host": host}
    )
    return value or 0.0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: a connection to it is refused


@pytest.fixture
async def one_event_server() -> AsyncIterator[str]:
    async with watch_server(then_silent=False) as host:
        yield host  # the watch ends after one event


async def test_a_refused_watch_is_an_error_of_its_get() -> None:
    host = f"127.0.0.1:{_closed_port()}"
    api = ApiClient(ClusterConfig(server=f"http://{host}", ssl=None, auth=NoAuth()))
    try:
        with pytest.raises(TransportError):
            async for _ in api.watch(CONFIG_MAP, namespace="n", timeout_seconds=5):
                pass
    finally:
        await api.close()
    assert _count(host, "GET", "<error>") == 1
    assert _count(host, "WATCH", "<error>") == 0


async def test_an_answered_watch_is_a_get_counted_once(one_event_server: str) -> None:
    host = one_event_server
    api = ApiClient(ClusterConfig(server=f"http://{host}", ssl=None, auth=NoAuth()))
    try:
        events = [e async for e in api.watch(CONFIG_MAP, namespace="n", timeout_seconds=5)]
    finally:
        await api.close()
    assert len(events) == 1
    assert _count(host, "GET", "200") == 1
    assert _count(host, "WATCH", "200") == 0
    assert _count(host, "GET", "<error>") == 0
