"""Property-based fuzzing of the conversion webhook's `POST /convert` on a real listener.

The webhook's aiohttp application (`build_app`, the same routes the controller serves over TLS) on a
loopback port, hit over HTTP with: arbitrary bytes; arbitrary JSON; `ConversionReview`-shaped JSON whose
fields have arbitrary types; and well-typed reviews of objects of our kinds with arbitrary content and
arbitrary target versions. What must hold for every example: the answer is 200 or 400, never a 5xx or a
hang; a 400 says what is wrong; a 200 is a `ConversionReview` echoing the request's uid whose result is
Success (with one converted object per input, in the desired version) or Failure (with a message and no
objects: all-or-nothing, as the API server requires).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.webhook.app import REVIEW_API_VERSIONS, build_app
from tests.helpers import fuzz_settings

pytestmark = pytest.mark.integration

FUZZ = fuzz_settings("CONVERSION_FUZZ_EXAMPLES", 80)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
GROUPS = [c.GROUP, c.EXTENSIONS_GROUP]
VERSIONS = st.sampled_from(
    [f"{g}/{v}" for g in GROUPS for v in ("v1alpha1", "v1beta1", "v2")] + ["v1", "", "agents.x-k8s.io"]
) | st.text(max_size=30)
KINDS = st.sampled_from(["Sandbox", "SandboxTemplate", "SandboxWarmPool", "SandboxClaim", "Pod", ""])


def obj_strategy() -> st.SearchStrategy[Any]:
    """Objects of our kinds (and some not) whose metadata, spec and status are arbitrary JSON."""
    return (
        st.fixed_dictionaries(
            {"apiVersion": VERSIONS, "kind": KINDS},
            optional={
                "metadata": st.fixed_dictionaries(
                    {}, optional={"name": st.text(max_size=20), "annotations": JSON}
                )
                | JSON,
                "spec": JSON,
                "status": JSON,
            },
        )
        | JSON
    )


@pytest.fixture(scope="module")
async def convert_url() -> AsyncIterator[str]:
    runner = web.AppRunner(build_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}{c.WEBHOOK_PATH}"
    finally:
        await runner.cleanup()


async def post(url: str, body: bytes) -> tuple[int, bytes]:
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp,
    ):
        return resp.status, await resp.read()


def check_answer(status: int, body: bytes, review: Any) -> None:
    assert status in (200, 400), (status, body[:300])
    if status == 400:
        assert body.strip(), "a 400 without a reason"
        return
    answer = orjson.loads(body)
    assert answer["kind"] == "ConversionReview"
    response = answer["response"]
    request = review["request"]
    assert response["uid"] == request.get("uid", "")
    result = response["result"]
    if result["status"] == "Success":
        objects = request.get("objects") or []
        assert len(response["convertedObjects"]) == len(objects)
        for out in response["convertedObjects"]:
            assert out["apiVersion"] == request["desiredAPIVersion"]
    else:
        assert result["status"] == "Failure"
        assert result["message"]
        assert response["convertedObjects"] == []


@FUZZ
@given(body=st.binary(max_size=400))
async def test_arbitrary_bytes(convert_url: str, body: bytes) -> None:
    status, answer = await post(convert_url, body)
    assert status in (200, 400), (status, answer[:300])


@FUZZ
@given(review=JSON)
async def test_arbitrary_json(convert_url: str, review: Any) -> None:
    status, answer = await post(convert_url, orjson.dumps(review))
    if isinstance(review, dict) and isinstance(review.get("request"), dict):
        check_answer(status, answer, review)
    else:
        assert status == 400, (status, answer[:300])


@FUZZ
@given(
    request=st.fixed_dictionaries(
        {},
        optional={
            "uid": st.text(max_size=10) | JSON,
            "desiredAPIVersion": VERSIONS | JSON,
            "objects": st.lists(obj_strategy(), max_size=3) | JSON,
        },
    ),
    api_version=st.sampled_from(["apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1"]) | JSON,
)
async def test_review_shaped_json_with_arbitrary_field_types(
    convert_url: str, request: dict[str, Any], api_version: Any
) -> None:
    review = {"apiVersion": api_version, "kind": "ConversionReview", "request": request}
    status, answer = await post(convert_url, orjson.dumps(review))
    assert status in (200, 400), (status, answer[:300])
    objects = request.get("objects")
    # Only apiextensions.k8s.io v1/v1beta1 reviews are answered; any other is refused, as controller-runtime does.
    well_typed = (
        api_version in REVIEW_API_VERSIONS
        and isinstance(request.get("uid", ""), str)
        and isinstance(request.get("desiredAPIVersion", ""), str)
        and (isinstance(objects, list) or not objects)  # absent, null or empty: no objects
    )
    if well_typed:
        assert status == 200, answer[:300]
        check_answer(status, answer, review)
    else:
        assert status == 400, answer[:300]
        assert b"expected" in answer, answer[:300]


@FUZZ
@given(
    objects=st.lists(obj_strategy(), min_size=1, max_size=3),
    desired=st.sampled_from([f"{g}/{v}" for g in GROUPS for v in ("v1alpha1", "v1beta1")]),
)
async def test_well_typed_reviews_of_arbitrary_objects(
    convert_url: str, objects: list[Any], desired: str
) -> None:
    review = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "u-1", "desiredAPIVersion": desired, "objects": objects},
    }
    status, answer = await post(convert_url, orjson.dumps(review))
    assert status == 200, answer[:300]
    check_answer(status, answer, review)
