"""The conversion webhook's HTTP application: ``POST /convert`` and ``GET /healthz``.

Routes only, no TLS and no Kubernetes client, so the listener process (:mod:`.listener`) imports
just this, aiohttp and the pure :func:`agent_sandbox.api.conversion.convert_review`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from agent_sandbox.api import constants as c
from agent_sandbox.api.conversion import convert_review

log = logging.getLogger(__name__)

#: Reviews with more objects than this are converted off the event loop.
THREAD_THRESHOLD = 32
_MAX_BODY = 64 * 1024 * 1024  # a v1alpha1 list of many large objects


class WebhookError(RuntimeError):
    """The webhook server could not start, or its listener ended unasked."""


async def handle_convert(request: web.Request) -> web.Response:
    """``POST /convert``: answer a ``ConversionReview``."""
    try:
        review = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return web.Response(status=400, text=f"invalid JSON: {exc}")
    if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
        return web.Response(status=400, text="body is not a ConversionReview with a request")
    if problem := _shape_problem(review):
        return web.Response(status=400, text=problem)
    if len(review["request"].get("objects") or ()) > THREAD_THRESHOLD:
        answer = await asyncio.to_thread(convert_review, review)
    else:
        answer = convert_review(review)
    result = answer["response"]["result"]
    if result["status"] != "Success":
        log.warning(
            "conversion to %s failed: %s", review["request"].get("desiredAPIVersion"), result["message"]
        )
    return web.Response(body=orjson.dumps(answer), content_type="application/json")


def _shape_problem(review: dict[str, Any]) -> str | None:
    """What is wrong with the shape of a review's fields (None when each has its type)."""
    request = review["request"]
    for where, value, types in (
        ("apiVersion", review.get("apiVersion", ""), str),
        ("request.uid", request.get("uid", ""), str),
        ("request.desiredAPIVersion", request.get("desiredAPIVersion", ""), str),
        ("request.objects", request.get("objects") or [], list),
    ):
        if not isinstance(value, types):
            return f"{where}: expected {types.__name__}, got {type(value).__name__}"
    return None


async def handle_healthz(_: web.Request) -> web.Response:
    """``GET /healthz``: the listener is up."""
    return web.Response(text="ok")


def build_app() -> web.Application:
    """The aiohttp application (routes only; no TLS, no I/O at construction)."""
    app = web.Application(client_max_size=_MAX_BODY)
    app.router.add_post(c.WEBHOOK_PATH, handle_convert)
    app.router.add_get("/healthz", handle_healthz)
    return app


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A loop for the listener: uvloop when installed, as the controller process runs on."""
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def server_tls(cert_path: Path, key_path: Path) -> ssl.SSLContext:
    """The listener's TLS context: TLS 1.2+, the serving certificate, no client certificates asked."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_path, key_path)
    return ctx


async def listen(host: str | None, port: int, tls: ssl.SSLContext) -> tuple[web.AppRunner, int]:
    """Serve :func:`build_app` over TLS; returns the runner (``cleanup()`` it) and the bound port.

    Raises:
        WebhookError: the address cannot be bound.
    """
    runner = web.AppRunner(build_app(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=tls, reuse_address=True).start()
    except OSError as exc:
        await runner.cleanup()
        raise WebhookError(f"cannot listen on {host or '*'}:{port}: {exc}") from None
    except BaseException:
        await runner.cleanup()
        raise
    return runner, _bound_port(runner, port)


def _bound_port(runner: web.AppRunner, requested: int) -> int:
    for server in runner.addresses:
        if isinstance(server, tuple) and len(server) >= 2:
            return int(server[1])
    return requested
