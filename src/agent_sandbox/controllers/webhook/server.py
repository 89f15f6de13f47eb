"""The conversion webhook server: ``POST /convert`` over TLS on port 9443 (controllers spec §5.7).

:class:`ConversionWebhook` is self-contained: ``await start()`` obtains the serving
certificate (shared Secret, or files from the cert dir when certificates are managed
externally), binds the HTTPS listener, then points the CRDs at it; ``await stop()`` closes
the listener. ``run(stop_event)`` does both around a wait. It runs on every replica (no
leader election): the API server may call any of them.

Conversion itself is the pure :func:`agent_sandbox.api.conversion.convert_review`. The listener
runs on its **own thread and event loop** (:class:`_ServingThread`): while v1alpha1 is served the API
server's watch cache sends every change of a Sandbox or claim through this webhook, one at a time per
resource, so each answer's latency bounds how fast *every* watcher (our own informers included) sees
changes. On the controllers' loop that latency included the loop's backlog under load
(docs/design/webhook-thread.md). Large reviews (a v1alpha1 list of many objects) are converted in
a worker thread so even that loop is not blocked.

The serving pair is **followed on disk** (:class:`CertWatcher`, controller-runtime's certwatcher): every
``cert_poll_interval`` (10 s) the serving thread reads ``tls.crt``/``tls.key`` and, when they changed and
load as a matching pair, new connections get the new pair; a pair that does not load (half written, key and
certificate from different rotations) keeps the previous one until it does. cert-manager or a mounted
Secret can thus rotate the certificate of a running webhook (``--manage-webhook-certs=false``). With managed
certificates the webhook also re-reads its Secret every ``secret_poll_interval`` (60 s): when it was replaced
(by another replica, or behind the controller's back) with a usable bundle (its CA issued its pair), the new
pair is written to the cert dir and followed the same way - but only once the CRDs' caBundle trusts its CA,
which this replica makes so first when needed. docs/design/webhook-cert-reload.md.

Failure modes: :class:`WebhookError` when the certificate files are missing or do not load at start-up
(unmanaged mode) or the listener cannot bind; API errors while loading the Secret or patching CRDs
propagate (upstream exits with status 1 in both cases). After start-up nothing is fatal: a pair or Secret
that cannot be used is logged once and the webhook keeps serving the pair it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import ssl
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from aiohttp import web

from agent_sandbox.api import constants as c
from agent_sandbox.api.conversion import convert_review
from agent_sandbox.api.errortext import describe_error
from agent_sandbox.controllers.webhook.certs import (
    CertBundle,
    CertificateError,
    bundle_problem,
    ensure_certificates,
    service_hosts,
    write_files,
)
from agent_sandbox.controllers.webhook.crds import ALL_CRD_NAMES, patch_crds, trust_ca
from agent_sandbox.kube import EXPECTED_ERRORS, NAMESPACE, SECRET, AlreadyExists, Client, NotFound
from agent_sandbox.kube.metrics import WEBHOOK_IN_FLIGHT, WEBHOOK_LATENCY, WEBHOOK_REQUESTS

log = logging.getLogger(__name__)

#: Reviews with more objects than this are converted off the event loop.
THREAD_THRESHOLD = 32
#: How often the serving pair's files are checked for a new pair: controller-runtime's certwatcher polls
#: every 10 s (besides its inotify watch, which misses Secret-volume symlink swaps on some filesystems).
CERT_POLL_INTERVAL = 10.0
#: How often a replica with managed certificates re-reads the shared Secret for a bundle another
#: replica (or anything else) stored there.
SECRET_POLL_INTERVAL = 60.0
#: What stops one read of the Secret from being followed (logged, retried at the next poll).
_SECRET_FOLLOW_ERRORS: tuple[type[BaseException], ...] = (*EXPECTED_ERRORS, CertificateError, OSError)
_MAX_BODY = 64 * 1024 * 1024  # a v1alpha1 list of many large objects
#: Options of the listener's request handler. No automatic decompression: a review is never compressed
#: (:func:`_read_body` refuses a compressed body with 415), and what aiohttp still drains of a refused body
#: after answering (its lingering close, at most 10 s) is then discarded as it comes, never inflated.
SERVER_OPTIONS: dict[str, Any] = {"auto_decompress": False}
#: Seconds a stopping listener waits for the reviews in flight (a review takes milliseconds; the API server
#: retries one that fails). aiohttp's default, 60 s, let a review whose body was still arriving at a SIGTERM
#: hold the controller's stop past the kubelet's 30 s grace (CI, December 7), Lease release included.
SHUTDOWN_GRACE = 3.0


class WebhookError(RuntimeError):
    """The webhook server could not start."""


@dataclass(frozen=True)
class WebhookOptions:
    """Settings of the conversion webhook (flags of controllers spec §5.1 / operations §7.2).

    Attributes:
        host: listen address (``""`` = all interfaces; dev mode uses ``127.0.0.1``).
        port: listen port (``--webhook-port``, 9443); 0 picks a free port.
        namespace: namespace of the Service and the certificate Secret (``--webhook-namespace``).
        service_name: Service the CRDs reference (``--webhook-service-name``).
        cluster_domain: for the fully qualified certificate SAN (``--cluster-domain``).
        cert_dir: where ``tls.crt``/``tls.key`` are written or read (``--webhook-cert-dir``).
        cert_name: certificate file name (``--webhook-cert-name``).
        key_name: key file name (``--webhook-key-name``).
        manage_certs: create/load the Secret and patch the CRDs (``--manage-webhook-certs``).
        webhook_url: dev mode: CRDs get ``clientConfig.url`` instead of the Service reference.
            ``{port}`` is replaced by the bound port, so ``port=0`` works.
        crd_names: CRDs to patch (all four by default; missing ones are skipped).
        cert_poll_interval: seconds between checks of the serving pair's files for a new pair; <= 0: never
            (no flag: upstream's certwatcher has a fixed 10 s; tests shorten it).
        secret_poll_interval: managed certificates: seconds between reads of the shared Secret for a bundle
            another replica (or anything else) stored; <= 0: never. A bundle whose CA the CRDs do not trust
            yet is served one poll after this replica added its CA to their caBundle.
    """

    host: str = ""
    port: int = c.WEBHOOK_PORT
    namespace: str = c.WEBHOOK_NAMESPACE
    service_name: str = c.WEBHOOK_SERVICE_NAME
    cluster_domain: str = c.DEFAULT_CLUSTER_DOMAIN
    cert_dir: Path = Path("/tmp/k8s-webhook-server/serving-certs")
    cert_name: str = "tls.crt"
    key_name: str = "tls.key"
    manage_certs: bool = True
    webhook_url: str | None = None
    crd_names: tuple[str, ...] = field(default=ALL_CRD_NAMES)
    cert_poll_interval: float = CERT_POLL_INTERVAL
    secret_poll_interval: float = SECRET_POLL_INTERVAL


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


def server_context(cert_path: Path, key_path: Path) -> ssl.SSLContext:
    """A TLS server context serving the pair in ``cert_path``/``key_path`` (TLS 1.2+, no client certificates).

    Raises:
        OSError: a file cannot be read (:class:`ssl.SSLError`, an ``OSError`` too: a file is no PEM, or the
            key does not match the certificate).
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # server side; no client certs requested
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_path, key_path)
    return ctx


def _read_pair(cert_path: Path, key_path: Path) -> tuple[bytes, bytes] | str:
    """Both files' bytes, or why they cannot be read."""
    try:
        return cert_path.read_bytes(), key_path.read_bytes()
    except OSError as exc:
        return describe_error(exc)


def _context_of(pair: tuple[bytes, bytes]) -> ssl.SSLContext:
    """A server context of exactly these bytes (``load_cert_chain`` reads files: a private copy is loaded).

    Loading the watched files themselves read them a second time: a rotation landing between the comparison's
    read and the load served one pair while the watcher recorded another (until December 6).

    Raises:
        OSError: the bytes are no PEM pair, or the key does not match the certificate.
    """
    with tempfile.TemporaryDirectory(prefix="webhook-pair-") as private:  # mode 0700
        cert, key = Path(private) / "tls.crt", Path(private) / "tls.key"
        cert.write_bytes(pair[0])
        key.write_bytes(pair[1])
        return server_context(cert, key)


class CertWatcher:
    """The serving pair of a TLS listener, reloaded when its files change (controller-runtime's certwatcher).

    :attr:`context` is the context to give the listener. Its ``sni_callback`` runs for every new connection,
    SNI or not (the API server sends none for an IP address), and switches the connection to the context of
    the current pair, so connections made after a reload get the new certificate and open ones are left alone.

    :meth:`check` compares the files' bytes with those of the loaded pair: content, not mtimes, because a
    rotation through a Secret volume swaps a directory symlink and leaves the files' own names and times as
    they were, and a same-second rewrite can keep mtime and size. A changed pair that does not load (key and
    certificate from different rotations, a torn write) keeps the previous pair; it is retried on every check
    and reported once per distinct content that two checks in a row saw (a rotation replaces the two files one
    after the other: a check between the two renames sees a mismatched pair that is not worth a warning).
    The bytes compared are the bytes loaded (:func:`_context_of`).
    """

    def __init__(self, cert_path: Path, key_path: Path) -> None:
        """Load the pair.

        Raises:
            WebhookError: the files cannot be read or do not hold a matching certificate and key.
        """
        self.cert_path, self.key_path = cert_path, key_path
        loaded = _read_pair(cert_path, key_path)
        try:
            if isinstance(loaded, str):
                raise OSError(loaded)
            self._current = _context_of(loaded)
        except OSError as exc:
            raise WebhookError(
                f"webhook certificate {cert_path} and key {key_path} cannot be loaded: {describe_error(exc)}"
            ) from None
        self._loaded: tuple[bytes, bytes] | str = loaded  # what is served
        self._failed: tuple[bytes, bytes] | str | None = None  # the last check's content that did not load
        self._reported: tuple[bytes, bytes] | str | None = None
        self.reloads = 0
        self.context = self._current
        self.context.sni_callback = self._select

    @property
    def current(self) -> ssl.SSLContext:
        """The context of the most recently loaded pair."""
        return self._current

    def serves(self, cert_pem: bytes, key_pem: bytes) -> bool:
        """Whether the pair served to new connections is exactly these bytes (safe from any thread)."""
        return self._loaded == (cert_pem, key_pem)

    def _select(self, ssl_obj: ssl.SSLObject, _server_name: str | None, base: ssl.SSLContext) -> None:
        current = self._current
        if current is not base:
            ssl_obj.context = current

    def check(self) -> bool:
        """Load the pair again if its files changed; True when a new pair is now served."""
        seen = _read_pair(self.cert_path, self.key_path)
        if seen == self._loaded:
            return False
        try:
            if isinstance(seen, str):
                raise OSError(seen)
            fresh = _context_of(seen)
        except OSError as exc:
            # Said once per state, and only once two checks in a row saw it (not a rotation caught midway).
            settled, self._failed = seen == self._failed, seen
            if settled and seen != self._reported:
                self._reported = seen
                log.warning(
                    "webhook certificate %s / key %s changed but do not load; keeping the previous pair: %s",
                    self.cert_path,
                    self.key_path,
                    describe_error(exc),
                )
            return False
        self._current, self._loaded, self._failed, self._reported = fresh, seen, None, None
        self.reloads += 1
        log.info("reloaded webhook serving certificate from %s and %s", self.cert_path, self.key_path)
        return True


class _ServingThread:
    """The aiohttp listener on a dedicated thread with its own event loop (and the pair's watcher)."""

    def __init__(self, host: str | None, port: int, certs: CertWatcher, poll_interval: float) -> None:
        self._host, self._port, self._certs, self._poll = host, port, certs, poll_interval
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.port = port
        self._thread = threading.Thread(target=self._main, name="conversion-webhook", daemon=True)

    def start(self) -> int:
        """Start listening; returns the bound port. Blocks until the listener is up or failed."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self.port

    def stop(self) -> None:
        """Close the listener and end the thread (blocks until it has, at most a few seconds)."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(stop.set)
        # aiohttp waits up to the grace for a review's handler, then cancels it and waits up to the grace again
        # (a conversion in a worker thread does not end on cancellation).
        bound = 2 * SHUTDOWN_GRACE + 1.0
        self._thread.join(bound)
        if self._thread.is_alive():  # a daemon thread: it does not keep the process alive
            log.warning("conversion webhook listener did not stop within %.0fs", bound)

    def _main(self) -> None:
        try:  # the loop the controller process runs on (`controllers.main`), when installed
            import uvloop  # type: ignore[import-not-found,unused-ignore]

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        runner = web.AppRunner(
            build_app(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_GRACE,
            **SERVER_OPTIONS,
        )
        try:
            await runner.setup()
            site = web.TCPSite(
                runner, self._host, self._port, ssl_context=self._certs.context, reuse_address=True
            )
            await site.start()
        except OSError as exc:
            self._error = WebhookError(f"cannot listen on {self._host or '*'}:{self._port}: {exc}")
        except BaseException as exc:
            self._error = exc
        if self._error is not None:
            await runner.cleanup()
            self._ready.set()
            return
        self.port = _bound_port(runner, self._port)
        self._ready.set()
        watcher = asyncio.create_task(self._watch_certs()) if self._poll > 0 else None
        try:
            await self._stop.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
            await runner.cleanup()

    async def _watch_certs(self) -> None:
        # On this thread's loop: reading two small files (and loading them when they changed) takes well
        # under a millisecond, and the SNI callback that reads the result runs here too.
        while True:
            await asyncio.sleep(self._poll)
            try:
                self._certs.check()
            except Exception as exc:  # never let the watcher end: the listener keeps the pair it has
                log.error("checking the webhook certificate failed: %s", describe_error(exc), exc_info=exc)


class ConversionWebhook:
    """The conversion webhook as a runnable: ``start()``/``stop()`` or ``run(stop_event)``."""

    #: Runs on every replica; the API server may call any of them.
    need_leader_election = False

    def __init__(self, client: Client, options: WebhookOptions | None = None) -> None:
        """Args: client: API client for the Secret and CRDs; options: settings (defaults as upstream)."""
        self._client = client
        self.options = options or WebhookOptions()
        self._server: _ServingThread | None = None
        self._secret_follower: asyncio.Task[None] | None = None
        self._bundle: CertBundle | None = None  # the Secret's bundle whose pair is served
        self._rejected: CertBundle | None = None  # said once: an unsuitable bundle stays so until it changes
        self._written: CertBundle | None = None  # the bundle whose pair the follower last wrote (said once)
        self._reported: str | None = None  # said once: the last error reading or writing
        self.certs: CertWatcher | None = None
        self.port: int | None = None
        self.url: str | None = None
        #: The CA of the pair served (managed certificates): changes only once the listener serves a new pair.
        self.ca_pem: bytes | None = None

    async def start(self) -> None:
        """Obtain the certificate, start listening, then patch the CRDs (in that order).

        Raises:
            WebhookError: certificate files missing or not loadable (unmanaged mode) or bind failure.
        """
        opts = self.options
        cert_path, key_path = await self._certificate()
        self.certs = CertWatcher(cert_path, key_path)
        server = _ServingThread(opts.host or None, opts.port, self.certs, opts.cert_poll_interval)
        self.port = await asyncio.to_thread(server.start)
        self._server = server
        self.url = opts.webhook_url.replace("{port}", str(self.port)) if opts.webhook_url else None
        log.info("conversion webhook listening on %s:%d", opts.host or "*", self.port)
        if opts.manage_certs and self.ca_pem is not None:
            await patch_crds(
                self._client,
                ca_pem=self.ca_pem,
                url=self.url,
                service=opts.service_name,
                namespace=opts.namespace,
                crd_names=opts.crd_names,
            )
        # Started last: a start that fails above is never stopped (the runnable sees the error), and a task
        # started before it would run on unowned.
        if opts.manage_certs and opts.secret_poll_interval > 0:
            self._secret_follower = asyncio.create_task(
                self._follow_secret(), name="webhook-certificate-secret"
            )

    async def stop(self) -> None:
        """Stop listening (idempotent)."""
        if self._secret_follower is not None:
            follower, self._secret_follower = self._secret_follower, None
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await follower
                except Exception as exc:
                    log.error("webhook certificate Secret follower had failed: %s", describe_error(exc))
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(server.stop)

    async def run(self, stop_event: asyncio.Event) -> None:
        """``start()``, wait for ``stop_event``, ``stop()``."""
        await self.start()
        try:
            await stop_event.wait()
        finally:
            await self.stop()

    async def _certificate(self) -> tuple[Path, Path]:
        opts = self.options
        if opts.manage_certs:
            kwargs: dict[str, Any] = {
                "namespace": opts.namespace,
                "service": opts.service_name,
                "cluster_domain": opts.cluster_domain,
                "extra_hosts": _url_hosts(opts.webhook_url),
            }
            try:
                bundle = await ensure_certificates(self._client, **kwargs)
            except NotFound:
                # The Secret's namespace is missing: only outside a cluster (dev mode), where the
                # controller is not deployed into it. In-cluster this path is never taken, so the
                # controller needs no RBAC on namespaces.
                log.info("creating namespace %s for the webhook certificate Secret", opts.namespace)
                await _ensure_namespace(self._client, opts.namespace)
                bundle = await ensure_certificates(self._client, **kwargs)
            self._bundle, self.ca_pem = bundle, bundle.ca_pem
            return write_files(bundle, opts.cert_dir, opts.cert_name, opts.key_name)
        cert, key = opts.cert_dir / opts.cert_name, opts.cert_dir / opts.key_name
        if cert.is_file() and key.is_file():
            return cert, key
        combined = opts.cert_dir / "cert.pem"
        defaults = (opts.cert_name, opts.key_name) == ("tls.crt", "tls.key")
        if defaults and not cert.exists() and not key.exists() and combined.is_file():
            return combined, combined  # one file holding both PEM blocks, as upstream accepts
        raise WebhookError(
            f"webhook certificate files {cert} and {key} are missing (--manage-webhook-certs=false)"
        )

    async def _follow_secret(self) -> None:
        """Managed certificates: :meth:`_poll_secret` every ``secret_poll_interval`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self.options.secret_poll_interval)
            await self._poll_secret()

    async def _poll_secret(self) -> None:
        """One read of the Secret: serve its bundle when it was replaced, once the CRDs trust its CA.

        A replica replaces the shared Secret (and re-points the CRDs' caBundle at its new CA) when the stored
        bundle is expired or not usable here; so may something else - a backup restore, a GitOps re-apply, a
        manual rotation, a replica stopped between storing the Secret and patching the CRDs - that leaves the
        caBundle without the new CA. A pair the API server does not trust must never be served: every conversion
        on a new connection would fail ("x509: certificate signed by unknown authority") and v1beta1 writes would
        silently drop the managedFields of objects with a v1alpha1 manager. So a replaced bundle that is usable
        (:func:`bundle_problem`: its CA issued its pair, its key is the pair's) is taken in steps, one per poll:

        * the CRDs' caBundle does not trust its CA: the caBundle gets it, next to the CA served here and the
          valid ones it held (:func:`trust_ca`); nothing else this poll - the API server applies a changed
          caBundle asynchronously, after its CRD informer saw it;
        * it does: the pair is written to the cert dir (the CertWatcher serves it from its next check);
        * the watcher serves it: it becomes this replica's bundle (:attr:`ca_pem`, the CA kept by a later switch).
          A pair the watcher does not load is never taken: the CA served stays the one kept.

        A poll that cannot do its step (an API error, a full disk) keeps the current pair, says why once, and the
        next poll tries again. Never writes the Secret (docs/design/webhook-cert-reload.md).
        """
        opts = self.options
        assert self.certs is not None  # started
        certs = self.certs
        secret_name = f"{opts.namespace}/{c.WEBHOOK_CERTS_SECRET}"
        try:
            secret = await self._client.get(SECRET, c.WEBHOOK_CERTS_SECRET, namespace=opts.namespace)
            bundle = CertBundle.from_secret(secret)
            if bundle == self._rejected:
                self._reported = None
                return
            if certs.serves(bundle.cert_pem, bundle.key_pem):
                self._reported = None
                if bundle != self._bundle:
                    self._bundle, self.ca_pem = bundle, bundle.ca_pem
                    log.info("webhook now serves the pair of certificate Secret %s", secret_name)
                return
            now = dt.datetime.now(dt.UTC)
            hosts = [
                *service_hosts(opts.service_name, opts.namespace, opts.cluster_domain),
                *_url_hosts(opts.webhook_url),
            ]
            if problem := bundle_problem(bundle, hosts=hosts, now=now):
                self._rejected, self._reported = bundle, None
                log.warning(
                    "webhook certificate Secret %s changed but is not usable here; keeping the current pair: %s",
                    secret_name,
                    problem,
                )
                return
            patched = await trust_ca(
                self._client, ca_pem=bundle.ca_pem, keep=self.ca_pem, crd_names=opts.crd_names, now=now
            )
            if not patched:
                await asyncio.to_thread(write_files, bundle, opts.cert_dir, opts.cert_name, opts.key_name)
        except Exception as exc:
            # Expected ones (API errors, a bundle that does not parse, a full disk) in one line; anything else
            # (an encrypted key made `cryptography` raise TypeError) with its traceback. Until December 6 an
            # unexpected one ended the task: the replica silently stopped following the Secret, and `stop()`
            # raised it at shutdown.
            text = describe_error(exc)
            if text != self._reported:
                self._reported = text
                log.warning(
                    "cannot follow webhook certificate Secret %s; keeping the current pair: %s",
                    secret_name,
                    text,
                    exc_info=None if isinstance(exc, _SECRET_FOLLOW_ERRORS) else exc,
                )
            return
        self._reported = None
        if patched:
            log.info(
                "webhook certificate Secret %s holds a new CA that the caBundle of %s did not trust (the Secret "
                "was replaced without them); added it next to the CA served now, whose pair is kept until a "
                "later check sees the CRDs trusting the new one",
                secret_name,
                ", ".join(patched),
            )
        elif bundle != self._written:
            self._written = bundle
            log.info(
                "webhook certificate Secret %s was replaced; wrote its pair to %s", secret_name, opts.cert_dir
            )


async def _ensure_namespace(client: Client, name: str) -> None:
    with contextlib.suppress(AlreadyExists):
        await client.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def _bound_port(runner: web.AppRunner, requested: int) -> int:
    for server in runner.addresses:
        if isinstance(server, tuple) and len(server) >= 2:
            return int(server[1])
    return requested


def _url_hosts(url: str | None) -> tuple[str, ...]:
    """Host of the dev-mode URL, which the serving certificate must also cover."""
    if not url:
        return ()
    host = urlsplit(url.replace("{port}", "0")).hostname
    return (host,) if host else ()
