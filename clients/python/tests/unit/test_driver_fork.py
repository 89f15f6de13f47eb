"""A forked child never reads from the connections it inherited (`_driver._forget_inherited_connections`).

Pooled sockets are shared with the parent after `fork`: multiprocessing workers using a client made before
the pool read each other's answers (a command's output returned to another process's call). The child must
start with empty pools and leave the parent's untouched.
"""

from __future__ import annotations

import os

import httpx2
import pytest

from agent_sandbox_sdk import _driver
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
