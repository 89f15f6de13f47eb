"""describe_error: every formatted exception names its type and says what failed; timeouts say so."""

from __future__ import annotations

import asyncio
import io
import logging

import pytest

from agent_sandbox.api.errortext import describe_error
from agent_sandbox.kube import ServerError, Timeout, TransportError
from agent_sandbox.kube._logging import ConsoleFormatter, JsonFormatter

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (TimeoutError(), "TimeoutError: timed out"),
        (asyncio.TimeoutError(), "TimeoutError: timed out"),
        (TimeoutError("renewal timed out after 9.5s"), "TimeoutError: renewal timed out after 9.5s"),
        (TimeoutError("no answer in 9.5s"), "TimeoutError: no answer in 9.5s (timed out)"),
        (Timeout("GET /x: timed out"), "Timeout: GET /x: timed out"),
        (Timeout("GET /x"), "Timeout: GET /x (timed out)"),
        (Timeout(), "Timeout: timed out"),
        (ServerError(500, "InternalError", "etcd down"), "ServerError: 500 InternalError: etcd down"),
        (KeyError("spec"), "KeyError: 'spec'"),
        (ValueError(), "ValueError"),
        (RuntimeError("  "), "RuntimeError"),
        (asyncio.CancelledError(), "CancelledError"),
    ],
)
def test_names_the_type_and_never_loses_the_message(exc: BaseException, text: str) -> None:
    assert describe_error(exc) == text


def test_an_empty_message_is_explained_by_its_cause() -> None:
    try:
        try:
            raise TimeoutError
        except TimeoutError as inner:
            raise TransportError() from inner
    except TransportError as exc:
        assert describe_error(exc) == "TransportError: caused by TimeoutError: timed out"
    try:
        try:
            {}["missing"]
        except KeyError:
            raise RuntimeError  # implicit context, not suppressed
    except RuntimeError as exc:
        assert describe_error(exc) == "RuntimeError: caused by KeyError: 'missing'"
    try:
        try:
            {}["missing"]
        except KeyError:
            raise RuntimeError from None  # context deliberately suppressed
    except RuntimeError as exc:
        assert describe_error(exc) == "RuntimeError"


def test_a_cause_cycle_and_a_broken_str_do_not_break_it() -> None:
    a, b = ValueError(), ValueError()
    a.__cause__, b.__cause__ = b, a
    assert describe_error(a) == "ValueError: caused by ValueError"

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert describe_error(Unprintable()) == "Unprintable: <unprintable message>"


@pytest.mark.parametrize("formatter", [JsonFormatter(), ConsoleFormatter(stacktrace_level=logging.CRITICAL)])
def test_log_formatters_render_an_attached_timeout_with_its_name(formatter: logging.Formatter) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("test.errortext")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        try:
            raise TimeoutError
        except TimeoutError as exc:
            logger.error("renewal failed", exc_info=exc)
    finally:
        logger.removeHandler(handler)
    assert "TimeoutError: timed out" in stream.getvalue()
