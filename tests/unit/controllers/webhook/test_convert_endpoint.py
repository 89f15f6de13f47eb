"""`POST /convert` as hostile clients use it: what it refuses, what it answers, and what it keeps in memory.

The webhook's aiohttp application (`build_app`, the routes the controller serves over TLS) on a plain loopback
listener. The API server sends identity-encoded JSON `ConversionReview`s (apiextensions.k8s.io v1 or v1beta1);
the Service is reachable by anything in the cluster, so everything else must get a 4xx - or, for a review
that cannot be converted, a `Failure` answer - without a 500 and without memory staying held.
"""

from __future__ import annotations

import datetime as dt
import gc
import gzip
import json
import ssl
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.webhook import (
    ConversionWebhook,
    WebhookOptions,
    app,
    generate_bundle,
    listener,
)
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

Post = Callable[..., Awaitable[tuple[int, bytes]]]


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    """A 1 MiB body limit, so oversized bodies are quick to send."""
    monkeypatch.setattr(app, "_MAX_BODY", 1 << 20)
    return 1 << 20


@pytest.fixture
async def post() -> AsyncIterator[Post]:
    # The listener's options; a short shutdown: a client that stops sending a refused body leaves aiohttp's
    # lingering close waiting (10 s) for the rest.
    runner = web.AppRunner(app.build_app(), access_log=None, shutdown_timeout=0.5, **listener.SERVER_OPTIONS)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}{c.WEBHOOK_PATH}"

    async def send(body: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        timeout = aiohttp.ClientTimeout(total=30)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.post(url, data=body, headers=hdrs) as resp,
        ):
            return resp.status, await resp.read()

    try:
        yield send
    finally:
        await runner.cleanup()


def review(objects: list[Any], desired: str, api_version: str = "apiextensions.k8s.io/v1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "ConversionReview",
            "request": {"uid": "u-1", "desiredAPIVersion": desired, "objects": objects}}  # fmt: skip


def beta_sandbox(name: str, **annotations: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "metadata": meta,
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}  # fmt: skip


def beta_claim(name: str, state: str) -> dict[str, Any]:
    return {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": {c.ANNOTATION_V1ALPHA1_SANDBOXCLAIM_STATE: state}},
            "spec": {"warmPoolRef": {"name": "shadow-pool-t"}}}  # fmt: skip


# ---------------------------------------------------------------------------
# 1. Never a 500: a review that cannot be converted or encoded is a Failure
# ---------------------------------------------------------------------------

NESTED_300 = "[" * 300 + "]" * 300
HOSTILE_STATES = [
    (c.ANNOTATION_V1ALPHA1_SANDBOX_STATE, '{"status":{"replicas":99999999999999999999999}}'),
    (c.ANNOTATION_V1ALPHA1_SANDBOX_STATE, '{"spec":' + "[" * 3000 + "]" * 3000 + "}"),
]


async def test_a_list_with_a_hostile_sandbox_snapshot_still_converts(post: Post) -> None:
    """The probe's 500s: one annotated Sandbox failed every v1alpha1 list of the namespace."""
    for key, state in HOSTILE_STATES:
        body = review(
            [beta_sandbox("bad", **{key: state}), beta_sandbox("neighbour")], "agents.x-k8s.io/v1alpha1"
        )
        status, answer = await post(orjson.dumps(body))
        assert status == 200, answer[:300]
        response = orjson.loads(answer)["response"]
        assert response["result"] == {"status": "Success"}
        assert [o["status"]["replicas"] for o in response["convertedObjects"]] == [1, 1]


@pytest.mark.parametrize(
    "state",
    [
        '{"spec":{"sandboxTemplateRef":{"name":"\\ud800"}}}',  # orjson.dumps refused the lone surrogate
        '{"spec":{"sandboxTemplateRef":{"name":"t","x":' + NESTED_300 + "}}}",  # orjson's depth limit
    ],
    ids=["surrogate", "deep-ref"],
)
async def test_a_hostile_claim_snapshot_gives_an_encodable_answer(post: Post, state: str) -> None:
    body = review([beta_claim("bad", state)], "extensions.agents.x-k8s.io/v1alpha1")
    status, answer = await post(orjson.dumps(body))
    assert status == 200, answer[:300]
    response = orjson.loads(answer)["response"]
    assert response["result"] == {"status": "Success"}
    assert response["convertedObjects"][0]["spec"]["sandboxTemplateRef"] == {"name": "t"}


async def test_an_answer_too_deep_to_encode_is_a_failure_not_a_500(post: Post) -> None:
    """/tmp/probe-convert/deep300.json: the object converts, orjson cannot encode the answer (depth > 254)."""
    deep = json.loads('{"a":' * 300 + "{}" + "}" * 300)
    obj = {"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Sandbox", "metadata": {"name": "x"},
           "spec": {"podTemplate": {"spec": deep}}}  # fmt: skip
    status, answer = await post(json.dumps(review([obj], "agents.x-k8s.io/v1beta1")).encode())
    assert status == 200, answer[:300]
    response = orjson.loads(answer)["response"]
    assert response["uid"] == "u-1"
    assert response["result"]["status"] == "Failure"
    assert "cannot be encoded" in response["result"]["message"]
    assert response["convertedObjects"] == []


async def test_an_unexpected_error_is_a_failure_not_a_500(
    post: Post, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(app, "convert_review", broken)
    status, answer = await post(orjson.dumps(review([beta_sandbox("s")], "agents.x-k8s.io/v1alpha1")))
    assert status == 200, answer[:300]
    parsed = orjson.loads(answer)
    assert parsed["apiVersion"] == "apiextensions.k8s.io/v1"
    assert parsed["response"]["uid"] == "u-1"
    assert parsed["response"]["result"]["status"] == "Failure"
    assert "RuntimeError: a bug" in parsed["response"]["result"]["message"]


# ---------------------------------------------------------------------------
# 5. Only ConversionReviews of apiextensions.k8s.io v1 and v1beta1
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("api_version", ["apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1"])
async def test_both_review_versions_are_answered_in_kind(post: Post, api_version: str) -> None:
    body = review([beta_sandbox("s")], "agents.x-k8s.io/v1alpha1", api_version=api_version)
    status, answer = await post(orjson.dumps(body))
    assert status == 200
    parsed = orjson.loads(answer)
    assert (parsed["apiVersion"], parsed["kind"]) == (api_version, "ConversionReview")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"apiVersion": "foo/v9"},
            "apiVersion: expected apiextensions.k8s.io/v1 or apiextensions.k8s.io/v1beta1",
        ),
        ({"apiVersion": "apiextensions.k8s.io/v2"}, "apiVersion: expected"),
        ({"apiVersion": None}, "apiVersion: expected"),
        ({"kind": "AdmissionReview"}, "kind: expected ConversionReview"),
        ({"kind": None}, "kind: expected ConversionReview"),
    ],
)
async def test_other_review_types_are_refused(post: Post, change: dict[str, Any], expected: str) -> None:
    body = review([beta_sandbox("s")], "agents.x-k8s.io/v1alpha1")
    for key, value in change.items():
        if value is None:
            del body[key]
        else:
            body[key] = value
    status, answer = await post(orjson.dumps(body))
    assert status == 400, answer[:300]
    assert expected in answer.decode()


# ---------------------------------------------------------------------------
# 2. Bodies: identity only, bounded before and while reading, nothing kept afterwards
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "GZIP", "identity, gzip"])
async def test_a_compressed_body_is_refused_before_it_is_read(
    small_limit: int, post: Post, encoding: str
) -> None:
    """The API server never compresses a review; a 200 KiB gzip body inflated to 200 MiB on the 413 path."""
    bomb = gzip.compress(b" " * (8 * small_limit))
    status, answer = await post(bomb, {"Content-Encoding": encoding})
    assert status == 415, answer[:300]
    assert b"Content-Encoding" in answer


async def test_an_identity_encoded_review_is_answered(post: Post) -> None:
    body = orjson.dumps(review([beta_sandbox("s")], "agents.x-k8s.io/v1alpha1"))
    status, _ = await post(body, {"Content-Encoding": "identity"})
    assert status == 200


async def test_a_declared_length_over_the_limit_is_refused(small_limit: int, post: Post) -> None:
    status, answer = await post(b" " * (small_limit + 1))
    assert status == 413, answer[:300]
    status, _ = await post(orjson.dumps(review([], "agents.x-k8s.io/v1alpha1")).ljust(small_limit))
    assert status == 200  # exactly the limit is fine


async def test_a_chunked_body_over_the_limit_is_refused(small_limit: int, post: Post) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b" " * (small_limit // 2)

    status, answer = await post(chunks())
    assert status == 413, answer[:300]


@pytest.fixture
def no_collector() -> Iterator[None]:
    """Reference cycles stay uncollected, as between the controller's rare full collections."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


@pytest.mark.parametrize("kind", ["declared", "chunked", "gzip"])
async def test_refused_bodies_are_not_kept_in_memory(
    small_limit: int, no_collector: None, post: Post, kind: str
) -> None:
    """The probe: each refused body (413 through `request.read()`) stayed referenced from a reference cycle
    until the next full collection - ~320 MB per gzip request, 64 MiB per plain one. Deterministic: the
    collector is off, so anything not freed by reference counting shows up in the traced memory."""
    payload = b" " * (3 * small_limit)
    bomb = gzip.compress(payload)

    async def chunked() -> AsyncIterator[bytes]:
        for start in range(0, len(payload), 256 << 10):
            yield payload[start : start + (256 << 10)]

    async def send() -> int:
        if kind == "gzip":
            status, _ = await post(bomb, {"Content-Encoding": "gzip"})
        elif kind == "chunked":
            status, _ = await post(chunked())
        else:
            status, _ = await post(payload)
        return status

    await send()  # warm-up: lazily created module state is not a leak
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        statuses = {await send() for _ in range(20)}
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert statuses <= {413, 415}, statuses
    assert held < 4 * small_limit, f"{held / 2**20:.1f} MiB still held after 20 refused bodies"


async def test_the_tls_listener_refuses_compressed_and_foreign_reviews(tmp_path: Path) -> None:
    """The same answers from the controller's own listener (its thread, its handler options)."""
    bundle = generate_bundle(service="s", namespace="n", cluster_domain="cluster.local",
                             extra_hosts=("127.0.0.1",), now=dt.datetime.now(dt.UTC))  # fmt: skip
    (tmp_path / "tls.crt").write_bytes(bundle.cert_pem)
    (tmp_path / "tls.key").write_bytes(bundle.key_pem)
    opts = WebhookOptions(host="127.0.0.1", port=0, manage_certs=False, cert_dir=tmp_path)
    webhook = ConversionWebhook(FakeClient(), opts)
    ctx = ssl.create_default_context(cadata=bundle.ca_pem.decode())
    good = orjson.dumps(review([beta_sandbox("s")], "agents.x-k8s.io/v1alpha1"))
    foreign = orjson.dumps(review([beta_sandbox("s")], "agents.x-k8s.io/v1alpha1", api_version="foo/v9"))
    await webhook.start()
    try:
        url = f"https://127.0.0.1:{webhook.port}{c.WEBHOOK_PATH}"
        async with aiohttp.ClientSession() as http:
            for body, headers, expected in (
                (gzip.compress(good), {"Content-Encoding": "gzip"}, 415),
                (foreign, {}, 400),
                (good, {}, 200),
            ):
                async with http.post(url, data=body, headers=headers, ssl=ctx) as resp:
                    assert resp.status == expected, await resp.text()
    finally:
        await webhook.stop()
