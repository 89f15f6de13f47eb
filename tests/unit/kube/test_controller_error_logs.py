"""What a failed reconcile leaves in the log: expected errors one line each, programming errors a traceback.

An API-server outage makes every worker fail with the same expected error (KubeError, ConnectionError,
TimeoutError) on every retry; with a chained traceback on each line (~4.7 KB) the log grew by 500 KB in
8 s of outage. The error's text and the structured `error` field carry all there is to know about those.
"""

from __future__ import annotations

import logging

import orjson
import pytest

from agent_sandbox.kube import Controller, ReconcilerFunc, Request, Result, ServerError
from agent_sandbox.kube._logging import ConsoleFormatter, JsonFormatter
from agent_sandbox.kube.testing import FakeClock

pytestmark = pytest.mark.unit


def _chained_outage() -> ConnectionError:
    try:
        try:
            raise OSError(111, "Connect call failed ('127.0.0.1', 6443)")
        except OSError as inner:
            raise ConnectionError("cannot connect to the API server") from inner
    except ConnectionError as exc:
        return exc


EXPECTED = [
    ServerError(503, "ServiceUnavailable", "etcd is down"),
    _chained_outage(),
    TimeoutError("GET sandboxes timed out"),
]


async def _fail_once(error: Exception, caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    async def fail(_: Request) -> Result:
        raise error

    controller = Controller("log-test", ReconcilerFunc(fail), clock=FakeClock(), metrics=False)
    with caplog.at_level(logging.INFO, logger="agent_sandbox.kube.controller"):
        await controller.process(Request("ns", "x"))
    [record] = [r for r in caplog.records if r.getMessage().startswith("reconciler error")]
    return record


@pytest.mark.parametrize("error", EXPECTED, ids=lambda e: type(e).__name__)
async def test_expected_errors_are_logged_without_a_traceback(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    record = await _fail_once(error, caplog)
    assert record.levelno == logging.ERROR
    assert record.exc_info is None  # no traceback (let alone the chained ones)
    assert str(error) in record.getMessage()  # the error's text stays in the line
    for formatter in (JsonFormatter(), ConsoleFormatter()):
        line = formatter.format(record)
        assert "Traceback" not in line
        assert "\n" not in line
    entry = orjson.loads(JsonFormatter().format(record))
    assert entry["error"].endswith(str(error))  # the structured field, as with exc_info before
    assert len(JsonFormatter().format(record)) < 600


async def test_programming_errors_keep_their_traceback(caplog: pytest.LogCaptureFixture) -> None:
    record = await _fail_once(KeyError("spec"), caplog)
    assert record.exc_info is not None
    entry = orjson.loads(JsonFormatter().format(record))
    assert entry["error"] == "KeyError: 'spec'"
    assert "Traceback" in entry["stacktrace"]
