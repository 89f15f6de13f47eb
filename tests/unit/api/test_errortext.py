"""describe_error: every formatted exception names its type and says what failed; timeouts say so."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Callable

import pytest

from agent_sandbox.api.errortext import describe_error
from agent_sandbox.kube import ServerError, Timeout, TransportError
from agent_sandbox.kube._logging import ConsoleFormatter, JsonFormatter

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (TimeoutError(), "TimeoutError: timed out"),
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


def _raised(fn: Callable[[], object]) -> BaseException:
    try:
        fn()
    except BaseException as exc:
        return exc
    raise AssertionError("nothing raised")


def _chained(outer: type[Exception], inner: BaseException, *, how: str) -> None:
    try:
        raise inner
    except BaseException as caught:
        if how == "from":
            raise outer() from caught
        if how == "from None":
            raise outer() from None
        raise outer()  # noqa: B904 - an implicit context is the case under test


def test_an_empty_message_is_explained_by_its_cause() -> None:
    explicit = _raised(lambda: _chained(TransportError, TimeoutError(), how="from"))
    assert describe_error(explicit) == "TransportError: caused by TimeoutError: timed out"
    implicit = _raised(lambda: _chained(RuntimeError, KeyError("missing"), how="context"))
    assert describe_error(implicit) == "RuntimeError: caused by KeyError: 'missing'"
    suppressed = _raised(lambda: _chained(RuntimeError, KeyError("missing"), how="from None"))
    assert describe_error(suppressed) == "RuntimeError"


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
