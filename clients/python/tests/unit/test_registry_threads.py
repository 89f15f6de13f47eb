"""A sync client shared by threads: handles terminated in some threads while another lists the active ones or
leaves the client's `with` block.

A `terminate()` that deleted its claim drops its handle from the client's registry (`HandleState.untrack`),
from whichever thread called it. Until December 7 (that change's first version) nothing guarded the registry:
`list_active_sandboxes()` and the `with` exit's `tracked_here()` iterated the dict while other threads
removed entries, and raised `RuntimeError: dictionary changed size during iteration` (the exit then deleted
nothing), and `list_active_sandboxes()` could raise `KeyError` deleting a closed handle another thread had
just dropped. The registry now takes a lock for each of its operations (never across I/O), and a forked
child gets a fresh one (the lock may have been held, at the fork, by a thread the child does not have).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig
from agent_sandbox_sdk._shared import Registry

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit

CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)


@pytest.fixture
def fast_switches() -> Iterator[None]:
    """Threads switch after (nearly) every bytecode: a race shows within a few rounds."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def test_handles_terminated_by_threads_while_another_lists_and_cleans_up(fast_switches: None) -> None:
    """Threads terminate handles (half explicitly named: closed ones are dropped by the listing, half
    auto-named) while the main thread calls `list_active_sandboxes()` and `tracked_here()` (what a `with`
    exit walks). No call may raise; run for a bounded time (the race showed within the first round)."""
    errors: dict[str, int] = {}
    deadline = time.monotonic() + 3
    rounds = 0
    while time.monotonic() < deadline and not errors:
        rounds += 1
        fake = FakeCluster()
        client = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport())
        handles = [client.create_sandbox("python-pool", claim_name=f"c-{rounds}-{i}") for i in range(30)]
        handles += [client.create_sandbox("python-pool") for _ in range(30)]

        def worker(mine: list[object]) -> None:
            for handle in mine:
                handle.terminate()  # type: ignore[attr-defined]

        threads = [threading.Thread(target=worker, args=(handles[i::4],)) for i in range(4)]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            for where, call in (
                ("list_active_sandboxes", client.list_active_sandboxes),
                ("tracked_here", client._registry.tracked_here),
            ):
                try:
                    call()
                except Exception as err:  # counted and reported
                    key = f"{where}: {type(err).__name__}: {err}"
                    errors[key] = errors.get(key, 0) + 1
        for thread in threads:
            thread.join()
        assert client.list_active_sandboxes() == []
        assert client._registry.handles == {}
        assert fake.claims == {}
        client.close()
    assert errors == {}, f"round {rounds}: {errors}"


def test_a_forked_child_can_use_a_registry_whose_lock_a_parent_thread_held_at_the_fork() -> None:
    """The fork happens while another thread of the parent holds the registry's lock: the child (which has
    only the forking thread) must not wait for it forever."""
    registry = Registry()
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with registry._lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(5)
        pid = os.fork()
        if pid == 0:  # the child: report by exit status only
            status = 2
            try:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                signal.alarm(5)  # waiting for a lock nobody will release: SIGALRM ends the child
                status = 0 if registry.tracked_here() == [] and registry.active_keys() == [] else 1
            finally:
                os._exit(status)
        _, wait_status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join()
    assert os.waitstatus_to_exitcode(wait_status) == 0
    assert registry.tracked_here() == []  # the parent's lock still works
