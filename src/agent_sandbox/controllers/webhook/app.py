"""The conversion webhook's HTTP application: ``POST /convert`` answers a ConversionReview; ``GET /healthz``.

Conversion itself is the pure :func:`agent_sandbox.api.conversion.convert_review`; this module is what stands
between it and the API server: the body's limits and encoding, the review's shape, the answer (a ``Failure``
review rather than a 500), the metadata the API server reads back, and controller-runtime's webhook metrics.
Large reviews (a v1alpha1 list of many objects) are converted in a worker thread so the listener's loop is not
blocked. No TLS and no I/O at construction: the listener (:mod:`.listener`) serves it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from agent_sandbox.api import constants as c
from agent_sandbox.api.conversion import convert_review
from agent_sandbox.kube.metrics import WEBHOOK_IN_FLIGHT, WEBHOOK_LATENCY, WEBHOOK_REQUESTS

__all__ = ["REVIEW_API_VERSIONS", "THREAD_THRESHOLD", "build_app", "handle_convert", "handle_healthz"]

# One logger name for every webhook module: operators filter on the field, and it predates the split.
log = logging.getLogger("agent_sandbox.controllers.webhook.server")

#: Reviews with more objects than this are converted off the event loop.
THREAD_THRESHOLD = 32
_MAX_BODY = 64 * 1024 * 1024  # a v1alpha1 list of many large objects


async def handle_convert(request: web.Request) -> web.Response:
    """``POST /convert``: answer a ``ConversionReview``.

    A body that is not a review gets a 4xx (:func:`_read_body`, :func:`_shape_problem`). A review gets a 200
    whatever happens while converting it or encoding the answer: a review that cannot be answered is a
    ``Failure`` with the reason, never a 500, because kube-apiserver retries the conversions of its
    v1alpha1 watch cache without pause and a 500 fails every v1alpha1 list of the kind in the namespace.
    """
    body = await _read_body(request)
    if isinstance(body, web.Response):
        return body
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return web.Response(status=400, text=f"invalid JSON: {exc}")
    del body  # only the parsed review is needed from here on
    if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
        return web.Response(status=400, text="body is not a ConversionReview with a request")
    if problem := _shape_problem(review):
        return web.Response(status=400, text=problem)
    desired = review["request"].get("desiredAPIVersion")
    try:
        if len(review["request"].get("objects") or ()) > THREAD_THRESHOLD:
            answer = await asyncio.to_thread(convert_review, review)
        else:
            answer = convert_review(review)
        result = answer["response"]["result"]
        if result["status"] != "Success":
            log.warning("conversion to %s failed: %s", desired, result["message"])
        else:
            _keep_read_metadata(answer["response"]["convertedObjects"])
        return web.Response(body=orjson.dumps(answer), content_type="application/json")
    except orjson.JSONEncodeError as exc:  # e.g. nested deeper than orjson writes (254 levels)
        message = f"the converted objects cannot be encoded as JSON: {exc}"
        log.warning("conversion to %s failed: %s", desired, message)
    except Exception as exc:
        message = f"conversion failed: {type(exc).__name__}: {exc}"
        log.error("conversion to %s failed unexpectedly", desired, exc_info=exc)
    return web.Response(body=_failure_answer(review, message), content_type="application/json")


def _failure_answer(review: dict[str, Any], message: str) -> bytes:
    """A ``Failure`` ConversionReview answering ``review`` (its fields' types checked by _shape_problem)."""
    text = message.encode("utf-8", "replace").decode("utf-8")  # no lone surrogates: orjson refuses them
    return orjson.dumps(
        {
            "apiVersion": review["apiVersion"],
            "kind": "ConversionReview",
            "response": {
                "uid": review["request"].get("uid", ""),
                "convertedObjects": [],
                "result": {"status": "Failure", "message": text},
            },
        }
    )


#: The only Content-Encoding a review comes with: kube-apiserver sends it as plain JSON.
_IDENTITY = frozenset({"", "identity"})


async def _read_body(request: web.Request) -> bytearray | web.Response:
    """The request body, or the 415/413 that refuses it.

    Refused before anything is read: a ``Content-Encoding`` other than identity (kube-apiserver never
    compresses a review; a 200 KiB gzip body used to be inflated to 200 MiB before its 413) and a declared
    ``Content-Length`` over the limit. A body of undeclared length is read a chunk at a time and refused as
    soon as it passes the limit, dropping what was read. Returned, not raised: aiohttp keeps a raised
    ``HTTPException`` as the response, and its traceback - frames holding the partly read body - in a
    reference cycle that only a full collection frees (the probe: ~320 MB held per refused gzip request, 64 MiB
    per plain one, until the controller's next full collection).
    """
    encodings = ",".join(request.headers.getall("Content-Encoding", ())).split(",")
    if any(token.strip().lower() not in _IDENTITY for token in encodings):
        return _refusal(
            415, "a ConversionReview is sent as identity-encoded JSON; unsupported Content-Encoding"
        )
    if request.content_length is not None and request.content_length > _MAX_BODY:
        return _refusal(413, f"body larger than {_MAX_BODY} bytes")
    body = bytearray()
    async for chunk in request.content.iter_any():
        if len(body) + len(chunk) > _MAX_BODY:
            return _refusal(413, f"body larger than {_MAX_BODY} bytes")
        body += chunk
    return body


def _refusal(status: int, text: str) -> web.Response:
    """A refusal after which the connection is closed, not reused.

    aiohttp first drains what the client still sends (its lingering close: read and discarded chunk by chunk,
    for at most 10 s) so that the client gets to read the answer.
    """
    response = web.Response(status=status, text=text)
    response.force_close()
    return response


#: All kube-apiserver reads of a converted object's metadata: it checks name, namespace and uid against the
#: object it sent, takes labels and annotations, and restores every other field from the stored object
#: (apiextensions-apiserver `validateConvertedObject` / `restoreObjectMeta`).
_READ_METADATA = ("name", "namespace", "uid", "labels", "annotations")


def _keep_read_metadata(objects: list[dict[str, Any]]) -> None:
    """Cut each object's metadata to what the API server reads (docs/design/webhook-answer-metadata.md).

    The rest - managedFields above all - is bytes it would decode and drop, once per review of the serial
    chain that refills its v1alpha1 watch cache.
    """
    for obj in objects:
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            obj["metadata"] = {key: meta[key] for key in _READ_METADATA if key in meta}


#: The ConversionReview versions the CRDs declare (``conversionReviewVersions``); controller-runtime's webhook
#: refuses any other apiVersion or kind with a 400, as this one does.
REVIEW_API_VERSIONS = ("apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1")


def _shape_problem(review: dict[str, Any]) -> str | None:
    """What is wrong with a review's type or the shape of its fields (None when each has its type)."""
    request = review["request"]
    for where, value, types in (
        ("apiVersion", review.get("apiVersion", ""), str),
        ("request.uid", request.get("uid", ""), str),
        ("request.desiredAPIVersion", request.get("desiredAPIVersion", ""), str),
        ("request.objects", request.get("objects") or [], list),
    ):
        if not isinstance(value, types):
            return f"{where}: expected {types.__name__}, got {type(value).__name__}"
    if review.get("apiVersion") not in REVIEW_API_VERSIONS:
        got = repr(review.get("apiVersion"))[:100]
        return f"apiVersion: expected {' or '.join(REVIEW_API_VERSIONS)}, got {got}"
    if review.get("kind") != "ConversionReview":
        return f"kind: expected ConversionReview, got {repr(review.get('kind'))[:100]}"
    return None


async def handle_healthz(_: web.Request) -> web.Response:
    """``GET /healthz``: the listener is up."""
    return web.Response(text="ok")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _instrumented(request: web.Request, handler: Handler) -> web.StreamResponse:
    """controller-runtime's webhook metrics for the conversion path (prometheus metrics are thread-safe:
    this runs on the webhook's own thread)."""
    if request.path != c.WEBHOOK_PATH:
        return await handler(request)
    path = c.WEBHOOK_PATH
    in_flight = WEBHOOK_IN_FLIGHT.labels(path)
    in_flight.inc()
    started = time.perf_counter()
    code = 500
    try:
        response = await handler(request)
        code = response.status
        return response
    except web.HTTPException as exc:
        code = exc.status
        raise
    finally:
        in_flight.dec()
        WEBHOOK_LATENCY.labels(path).observe(time.perf_counter() - started)
        WEBHOOK_REQUESTS.labels(path, str(code)).inc()


def build_app() -> web.Application:
    """The aiohttp application (routes only; no TLS, no I/O at construction)."""
    app = web.Application(client_max_size=_MAX_BODY, middlewares=[_instrumented])
    app.router.add_post(c.WEBHOOK_PATH, handle_convert)
    app.router.add_get("/healthz", handle_healthz)
    return app
