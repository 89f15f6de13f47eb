"""A client shared: by threads (one pool per destination, whoever creates it), and across `fork` - made in
the parent and used in the child (multiprocessing workers, prefork servers).

Pooled sockets are shared with the parent after `fork`: workers using a client made before the pool read each
other's answers (a command's output returned to another process's call), so the child starts with empty pools
and leaves the parent's untouched (`_driver_base._forget_inherited_connections`). And a child's cleanup - at exit or
at the end of an inherited `with` block - must not delete the claims its parent tracked (`Registry.tracked_here`).
"""

from __future__ import annotations

import os

import httpx2
import pytest

from agent_sandbox_sdk import _driver, _sync_driver
from agent_sandbox_sdk._steps import HttpRequest, Send

pytestmark = pytest.mark.unit


def _flow():  # type: ignore[no-untyped-def]
    response = yield Send(HttpRequest("GET", "http://127.0.0.1:9/healthz"))
    return response.status_code


def test_a_forked_child_drops_the_pools_it_inherited_and_the_parent_keeps_its_own() -> None:
    driver = _driver.SyncDriver(None, transport=httpx2.MockTransport(lambda r: httpx2.Response(204)))
    assert driver.run(_flow()) == 204
    inherited = dict(driver._clients)
    assert inherited
    pid = os.fork()
    if pid == 0:  # the child: report by exit status only
        status = 0 if driver._clients == {} and driver.run(_flow()) == 204 and driver._clients else 1
        status |= 0 if all(c not in driver._clients.values() for c in inherited.values()) else 2
        os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    assert driver._clients == inherited  # the parent's pools are untouched (and were not closed)
    assert not any(c.is_closed for c in inherited.values())


def test_a_forked_child_leaving_the_with_block_deletes_none_of_its_parents_claims() -> None:
    from .fakes import FakeCluster
    from .test_flows import sync_client

    fake = FakeCluster()
    pid = -1
    with sync_client(fake) as client:
        sandbox = client.create_sandbox("python-pool")
        pid = os.fork()
        if pid == 0:
            try:
                client.__exit__(None, None, None)  # the child runs to the end of the block
            finally:
                os._exit(0 if not fake.find(lambda r: r.method == "DELETE") else 3)
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    assert sandbox.claim_name not in fake.claims  # the parent's own exit deleted its claim


def test_threads_racing_for_a_new_pool_leave_one_open_and_close_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sync client shared by threads: the ones that lose the race to create a pool close theirs."""
    import threading
    import time

    import httpx2

    made: list[httpx2.Client] = []
    real = httpx2.Client

    def counting(**kw: object) -> httpx2.Client:
        time.sleep(0.005)  # as when building it loads a CA bundle: the GIL is released, other threads run
        client = real(**kw)  # type: ignore[arg-type]
        made.append(client)
        return client

    monkeypatch.setattr(_sync_driver.httpx2, "Client", counting)
    for _ in range(20):
        made.clear()
        driver = _driver.SyncDriver(None)
        barrier = threading.Barrier(8)
        got: list[httpx2.Client] = []

        def take(driver: _driver.SyncDriver, barrier: threading.Barrier, got: list[httpx2.Client]) -> None:
            barrier.wait()
            got.append(driver._client(HttpRequest("GET", "http://127.0.0.1:9/x")))

        threads = [threading.Thread(target=take, args=(driver, barrier, got)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(map(id, got))) == 1  # every thread got the same pool
        assert [c.is_closed for c in made].count(False) == 1  # and no other one was left open
        driver.close()
