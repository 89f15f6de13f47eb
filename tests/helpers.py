"""Small helpers shared by tests (polling with a bound, never a fixed sleep)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.allocation import allocation_lock, free_port
from agent_sandbox.kube import (
    SANDBOX,
    ApiClient,
    PatchType,
    ResourceKind,
    ServerError,
    TooManyRequests,
    TransportError,
)


def wait_for(predicate: Any, *, timeout: float = 30.0, interval: float = 0.1, what: str = "condition") -> Any:
    """Poll `predicate()` until it returns a truthy value; fail the test with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


T = TypeVar("T")


def controller_metrics(cluster: DevCluster) -> str:
    """The `/metrics` text of the controller `start_controller` started for `cluster`."""
    port = cluster.state.extra_ports["controller_metrics"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text: str = resp.read().decode()
        return text


async def eventually(
    probe: Callable[[], Awaitable[T | None]], what: str, within: float = 60.0, *, interval: float = 0.2
) -> T:
    """Await `probe()` until it returns a truthy value; fail the test with `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


async def apply_labelled(
    kube: ApiClient, kind: ResourceKind, body: dict[str, Any], labels: dict[str, str], namespace: str
) -> dict[str, Any]:
    """Server-side apply `body` with `labels` as field manager "gitops"; asserts the labels landed and that
    the apply is tracked (an `Apply` entry of "gitops"): what applying an object whose managedFields our
    controllers dropped must still do (docs/design/managed-fields.md)."""
    if labels:
        body = {**body, "metadata": {**body["metadata"], "labels": labels}}
    name = body["metadata"]["name"]
    applied: dict[str, Any] = await kube.patch(
        kind, name, body, namespace=namespace, patch_type=PatchType.APPLY, field_manager="gitops"
    )
    landed = applied["metadata"].get("labels") or {}
    assert all(landed.get(key) == value for key, value in labels.items()), landed
    entries = {(e["manager"], e["operation"]) for e in applied["metadata"].get("managedFields") or ()}
    assert ("gitops", "Apply") in entries
    return applied


def is_ready(obj: Mapping[str, Any]) -> bool:
    """True when the object's status carries condition Ready=True."""
    return any(
        cd["type"] == "Ready" and cd["status"] == "True"
        for cd in (obj.get("status") or {}).get("conditions") or ()
    )


class CreationLog:
    """Every Sandbox ADDED in a namespace (in order), from a watch started before anything exists.

    Counting creates this way is exact across controller restarts: the watch resumes from its last
    resourceVersion; a 410 would lose events and is surfaced on exit instead of being swallowed.
    """

    def __init__(self, kube: ApiClient, namespace: str) -> None:
        self.kube, self.ns = kube, namespace
        self.added: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> CreationLog:
        page = await self.kube.list_page(SANDBOX, namespace=self.ns, limit=1)
        assert not page.items
        self._task = asyncio.create_task(self._run(page.resource_version))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        if self._task.done():
            self._task.result()  # a failed watch (e.g. 410) would make the count incomplete
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self, rv: str) -> None:
        while True:
            try:
                async for event in self.kube.watch(
                    SANDBOX, namespace=self.ns, resource_version=rv, timeout_seconds=60
                ):
                    rv = event.object["metadata"].get("resourceVersion") or rv
                    if event.type == "ADDED":
                        self.added.append(event.object["metadata"]["name"])
            except (TooManyRequests, ServerError, TransportError):
                # A controller start re-patches the CRDs (brief 429/503); resuming from the last
                # resourceVersion loses nothing. A 410 would, and is deliberately not caught.
                await asyncio.sleep(0.2)


def fuzz_settings(env: str, default: int) -> Any:
    """Hypothesis settings of the property tests against real servers: `default` examples (the environment
    variable `env` overrides it, for long local runs), no per-example deadline (a real server's latency
    varies with the machine), no example database (CI runs are independent)."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=int(os.environ.get(env, str(default))),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
    )


class ErrorRecords(logging.Handler):
    """Collects ERROR records of every logger while installed (`with ErrorRecords() as errors:`): what an
    exception escaping a protocol callback or a task looks like (asyncio logs it)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> ErrorRecords:
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().removeHandler(self)

    @property
    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


def listen_port(cluster: DevCluster | None = None) -> int:
    """A loopback port for a process a test starts itself (reserved in `cluster`'s state when given).

    Below the kernel's ephemeral range and chosen under the clusters' allocation lock (the dev cluster's
    own rule): a port picked by binding port 0 comes from the ephemeral range, where any outgoing
    connection on the machine can take it as its source port before the test's process binds it (CI saw
    `address already in use` for a controller's metrics port that way).
    """
    if cluster is not None:
        return cluster.reserve_port(f"test-{uuid.uuid4().hex[:12]}")
    with allocation_lock():
        taken = {
            p for c in DevCluster.list() for p in (*c.state.ports.values(), *c.state.extra_ports.values())
        }
        return free_port(taken)


def signals_as_from_a_shell() -> None:
    """A child's `preexec_fn`: SIGINT, SIGTERM and SIGHUP at their defaults, as a terminal's shell starts programs.

    A test run started in the background by a shell without job control (`cmd &` in a script, `nohup`) inherits
    SIGINT ignored (POSIX) and SIGHUP ignored (nohup); a Python started with SIGINT ignored keeps it ignored and
    never raises KeyboardInterrupt, so a test that sends a Ctrl-C would measure the harness, not the CLI.
    """
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
