"""Error answers read as clear messages. Kubernetes: a 404 for an absent object is "absent"; a 404 for an API the
server does not serve is an error saying so. Runtime: a validation error list reads as `field: message`."""

from __future__ import annotations

import json

import pytest

from agent_sandbox_sdk import SandboxRequestError
from agent_sandbox_sdk._calls import check, error_detail
from agent_sandbox_sdk._kube import CLAIMS, check_kube, delete, get, object_not_found
from agent_sandbox_sdk._steps import HttpResponse

pytestmark = pytest.mark.unit

ABSENT = HttpResponse(
    404,
    {"content-type": "application/json"},
    json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                "message": 'sandboxclaims.extensions.agents.x-k8s.io "c" not found', "code": 404}).encode(),
)  # fmt: skip
UNSERVED = HttpResponse(404, {"content-type": "text/plain; charset=utf-8"}, b"404 page not found\n")


def _answer(flow, response: HttpResponse):  # type: ignore[no-untyped-def]
    next(flow)
    try:
        flow.send(response)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the flow asked for a second request")


def test_only_a_status_body_means_the_object_is_absent() -> None:
    assert object_not_found(ABSENT)
    assert not object_not_found(UNSERVED)
    assert not object_not_found(HttpResponse(404, {}, b"[]"))
    assert not object_not_found(HttpResponse(200, {}, b'{"kind": "Status"}'))


def test_get_and_delete_of_an_absent_object() -> None:
    assert _answer(get(CLAIMS, "ns", "c"), ABSENT) is None
    assert _answer(delete(CLAIMS, "ns", "c"), ABSENT) is False


@pytest.mark.parametrize("flow", [lambda: get(CLAIMS, "ns", "c"), lambda: delete(CLAIMS, "ns", "c")])
def test_an_unserved_api_is_an_error_that_says_so(flow) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SandboxRequestError) as info:
        _answer(flow(), UNSERVED)
    assert info.value.status_code == 404
    assert "404 page not found (this API is not served: are the agent-sandbox CRDs installed?)" in str(
        info.value
    )


def test_other_errors_keep_the_server_message() -> None:
    with pytest.raises(SandboxRequestError, match=r"HTTP 404: sandboxclaims.* \"c\" not found$"):
        check_kube(ABSENT, "patch sandboxclaims ns/c")


def test_a_refused_credential_says_what_probably_happened() -> None:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "Unauthorized",
            "reason": "Unauthorized", "code": 401}  # fmt: skip
    answer = HttpResponse(401, {"content-type": "application/json"}, json.dumps(body).encode())
    with pytest.raises(SandboxRequestError) as info:
        check_kube(answer, "list sandboxclaims in ns")
    assert str(info.value) == (
        "Kubernetes API list sandboxclaims in ns: HTTP 401: Unauthorized "
        "(the API server refused the kubeconfig's credentials: expired or revoked?)"
    )


def test_a_validation_error_list_reads_as_field_and_message() -> None:
    body = {"detail": [{"type": "value_error", "loc": ["body", "timeout_seconds"],
                        "msg": "timeout_seconds must be > 0 and <= 86400", "input": -1.0},
                       {"loc": ["body"], "msg": "bad"}, "odd"]}  # fmt: skip
    answer = HttpResponse(422, {"content-type": "application/json"}, json.dumps(body).encode())
    assert error_detail(answer) == "timeout_seconds: timeout_seconds must be > 0 and <= 86400; bad; odd"


def test_a_grpc_call_to_an_http1_router_says_the_router_needs_h2c() -> None:
    from agent_sandbox_sdk._commands import _grpc_error
    from agent_sandbox_sdk._steps import GrpcFailure

    # grpc-core's words, as a router without --enable-h2c made it say (its 400 for the HTTP/2 preface).
    details = (
        "failed to connect to all addresses; last error: INTERNAL: ipv4:127.0.0.1:30381: Failed parsing HTTP/2 "
        "(Expected SETTINGS frame as the first frame, got frame type 80) (Trying to connect an http1.x server "
        "(HTTP status 400))"
    )
    message = str(_grpc_error(GrpcFailure("UNAVAILABLE", details)))
    assert message.startswith(f"sandboxd process service failed (UNAVAILABLE): {details}")
    assert "started with --enable-h2c" in message
    assert "h2c" not in str(_grpc_error(GrpcFailure("UNAVAILABLE", "Connection refused")))


class _CountingBytes(bytes):
    """A body that records how many bytes were decoded from it whole (slices are plain bytes)."""

    decoded = 0

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        type(self).decoded += len(self)
        return super().decode(encoding, errors)


@pytest.mark.parametrize(
    "body", [b"\xff" + b"<html>" * 2_000_000, json.dumps({"detail": "x" * 10_000_000}).encode()]
)
def test_an_error_message_reads_only_the_start_of_a_large_body(body: bytes) -> None:
    _CountingBytes.decoded = 0
    detail = error_detail(HttpResponse(500, {}, _CountingBytes(body)))
    assert 0 < len(detail) <= 300
    assert _CountingBytes.decoded == 0


def test_a_long_url_is_cut_in_the_message() -> None:
    url = "http://router/download/" + "%C3%A9" * 2000 + "%2Ff.txt"
    with pytest.raises(SandboxRequestError) as info:
        check(HttpResponse(404, {}, b'{"message": "File not found"}', "GET", url))
    message = str(info.value)
    assert message.startswith("GET http://router/download/%C3%A9")
    assert message.endswith("%C3%A9%2Ff.txt: HTTP 404: File not found")
    assert len(message) < 320
