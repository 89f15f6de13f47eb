"""Status -> exception mapping (kube/errors.py): one function, most specific class wins."""

from __future__ import annotations

import aiohttp
import orjson
import pytest
from aiohttp.client_reqrep import ConnectionKey

from agent_sandbox.kube import errors as e

pytestmark = pytest.mark.unit


def _status(code: int, reason: str = "", message: str = "m", **details: object) -> bytes:
    body: dict[str, object] = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
    if reason:
        body["reason"] = reason
    body["message"] = message
    if details:
        body["details"] = details
    return orjson.dumps(body)


@pytest.mark.parametrize(
    ("code", "reason", "cls"),
    [
        (400, "BadRequest", e.BadRequest),
        (401, "Unauthorized", e.Unauthorized),
        (403, "Forbidden", e.Forbidden),
        (404, "NotFound", e.NotFound),
        (409, "Conflict", e.Conflict),
        (409, "AlreadyExists", e.AlreadyExists),
        (410, "Expired", e.Gone),
        (410, "Gone", e.Gone),
        (422, "Invalid", e.Invalid),
        (429, "TooManyRequests", e.TooManyRequests),
        (500, "InternalError", e.ServerError),
        (500, "Expired", e.Gone),
        (503, "ServiceUnavailable", e.ServerError),
        (504, "Timeout", e.ServerError),
        (405, "MethodNotAllowed", e.ApiError),
    ],
)
def test_most_specific_class(code: int, reason: str, cls: type[e.ApiError]) -> None:
    err = e.error_from_status(code, _status(code, reason))
    assert type(err) is cls
    assert err.status == code
    assert err.reason == reason
    assert err.message == "m"


def test_status_code_in_body_wins_over_http_status() -> None:
    # Watch ERROR events arrive on a 200 stream; the Status `code` decides.
    err = e.error_from_status(200, {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})
    assert isinstance(err, e.Gone)
    assert err.status == 410


def test_details_and_retry_after() -> None:
    err = e.error_from_status(
        422, _status(422, "Invalid", name="x", kind="pods", causes=[{"field": "spec"}], retryAfterSeconds=3)
    )
    assert err.details["causes"] == [{"field": "spec"}]
    assert err.retry_after == 3.0
    assert e.error_from_status(429, b"", retry_after=7).retry_after == 7


def test_non_status_body_kept_as_message() -> None:
    err = e.error_from_status(502, b"<html>bad gateway</html>")
    assert isinstance(err, e.ServerError)
    assert "bad gateway" in err.message
    assert e.error_from_status(404, None).status == 404


def test_hierarchy() -> None:
    assert issubclass(e.AlreadyExists, e.Conflict)
    assert all(
        issubclass(c, e.ApiError)
        for c in (e.NotFound, e.Conflict, e.Forbidden, e.Unauthorized, e.Invalid, e.ServerError, e.Gone)
    )
    assert issubclass(e.Timeout, e.TransportError)
    assert issubclass(e.TransportError, e.KubeError)
    assert not issubclass(e.TransportError, e.ApiError)


def test_ignore_helpers() -> None:
    nf = e.NotFound(404, "NotFound")
    ae = e.AlreadyExists(409, "AlreadyExists")
    other = e.Conflict(409, "Conflict")
    assert e.ignore_not_found(nf) is None
    assert e.ignore_not_found(other) is other
    assert e.ignore_not_found(None) is None
    assert e.ignore_already_exists(ae) is None
    assert e.ignore_already_exists(other) is other


def _caused(exc: Exception, cause: BaseException) -> Exception:
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    ("exc", "maybe"),
    [
        (e.ServerError(500, "InternalError", "etcd timeout"), True),
        (e.ServerError(503, "ServiceUnavailable", "x"), True),
        (e.Timeout("POST /x: timed out"), True),
        (_caused(e.TransportError("POST /x: reset"), ConnectionResetError()), True),
        (
            _caused(
                e.TransportError("POST /x: refused"),
                aiohttp.ClientConnectorError(
                    ConnectionKey("h", 1, False, True, None, None, None), OSError(111, "refused")
                ),
            ),
            False,
        ),
        (e.Forbidden(403, "Forbidden", "quota"), False),
        (e.AlreadyExists(409, "AlreadyExists", "x"), False),
        (e.TooManyRequests(429, "TooManyRequests", "x"), False),
        (ValueError("x"), False),
    ],
)
def test_may_have_applied(exc: Exception, maybe: bool) -> None:
    assert e.may_have_applied(exc) is maybe
