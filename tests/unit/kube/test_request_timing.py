"""`rest_client_request_duration_seconds` measures sub-millisecond requests (not in loop-time steps).

The controllers run on uvloop, whose `loop.time()` has millisecond resolution and is cached per loop
iteration: durations taken with it were 0 or whole milliseconds. The API client's session is replaced by an
in-process stand-in answering after a ~0.2 ms busy wait without yielding to the loop, and the test runs
on uvloop, as production does.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import pytest
import uvloop

from agent_sandbox.kube import ApiClient
from agent_sandbox.kube._config import ClusterConfig, NoAuth
from agent_sandbox.kube._resources import CONFIG_MAP
from agent_sandbox.kube.metrics import REGISTRY

#: How long the stand-in server takes to answer: well under a millisecond.
BUSY = 0.0002


class _Content:
    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in (b'{"type":"BOOKMARK","object":{"kind":"ConfigMap","metadata":{}}}\n',):
            yield chunk


class _Response:
    status = 200
    headers: dict[str, str] = {}
    content = _Content()

    async def read(self) -> bytes:
        return b"{}"


class _Answer:
    """The `async with session.request(...)` of one request: answers after `BUSY`, never yielding."""

    async def __aenter__(self) -> _Response:
        start = time.perf_counter()
        while time.perf_counter() - start < BUSY:
            pass
        return _Response()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class _Session:
    def request(self, method: str, url: Any, **kw: Any) -> _Answer:
        return _Answer()

    def get(self, url: Any, **kw: Any) -> _Answer:
        return _Answer()


def _check(elapsed: float) -> None:
    """At least the stand-in's busy wait, and not a whole number of milliseconds (what loop time gave: 0 or
    k ms, give or take float rounding). No tight upper bound: a loaded machine may preempt the test."""
    assert elapsed >= BUSY, elapsed
    assert abs(elapsed - round(elapsed, 3)) > 1e-7, elapsed
    assert elapsed < 0.05, elapsed


def _sum(verb: str, host: str) -> float:
    return (
        REGISTRY.get_sample_value("rest_client_request_duration_seconds_sum", {"verb": verb, "host": host})
        or 0.0
    )


def _client(monkeypatch: pytest.MonkeyPatch, server: str) -> ApiClient:
    api = ApiClient(ClusterConfig(server=server, ssl=None, auth=NoAuth()))
    monkeypatch.setattr(api, "_session", lambda watch=False: _Session())
    return api


def test_a_sub_millisecond_request_is_timed_in_sub_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _client(monkeypatch, "http://timing-request.test:6443")
    host = api._host
    before = _sum("GET", host)

    async def main() -> None:
        await api.request("GET", "/api/v1/namespaces/default/configmaps/x")

    uvloop.run(main())
    elapsed = _sum("GET", host) - before
    _check(elapsed)


def test_a_watch_is_timed_in_sub_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _client(monkeypatch, "http://timing-watch.test:6443")
    host = api._host
    before = _sum("GET", host)  # a watch is the GET it is sent as (client-go)

    async def main() -> None:
        stream = api.watch(CONFIG_MAP, namespace="default")
        assert [event async for event in stream]

    uvloop.run(main())
    elapsed = _sum("GET", host) - before
    _check(elapsed)
