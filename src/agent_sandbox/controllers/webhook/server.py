"""The conversion webhook server: ``POST /convert`` over TLS on port 9443 (controllers spec §5.7).

:class:`ConversionWebhook` is self-contained: ``await start()`` obtains the serving
certificate (shared Secret, or files from the cert dir when certificates are managed
externally), binds the HTTPS listener, then points the CRDs at it; ``await stop()`` closes
the listener. ``run(stop_event)`` does both around a wait. It runs on every replica (no
leader election): the API server may call any of them.

Conversion itself is the pure :func:`agent_sandbox.api.conversion.convert_review`, answered by the HTTP
application of :mod:`.app`. The listener runs on its **own thread and event loop**
(:class:`.listener.ServingThread`): while v1alpha1 is served the API server's watch cache sends every change
of a Sandbox or claim through this webhook, one at a time per resource, so each answer's latency bounds how
fast *every* watcher (our own informers included) sees changes. On the controllers' loop that latency
included the loop's backlog under load (docs/design/webhook-thread.md). Large reviews (a v1alpha1 list of
many objects) are converted in a worker thread so even that loop is not blocked.

The serving pair is **followed on disk** (:class:`.certwatch.CertWatcher`, controller-runtime's
certwatcher): every ``cert_poll_interval`` (10 s) the serving thread reads ``tls.crt``/``tls.key`` and, when
they changed and load as a matching pair, new connections get the new pair; a pair that does not load (half
written, key and certificate from different rotations) keeps the previous one until it does. cert-manager or
a mounted Secret can thus rotate the certificate of a running webhook (``--manage-webhook-certs=false``). With
managed certificates the webhook also re-reads its Secret every ``secret_poll_interval`` (60 s): when it was
replaced (by another replica, or behind the controller's back) with a usable bundle (its CA issued its pair),
the new pair is written to the cert dir and followed the same way - but only once the CRDs' caBundle trusts
its CA, which this replica makes so first when needed. docs/design/webhook-cert-reload.md.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent_sandbox.api import constants as c
from agent_sandbox.api.errortext import describe_error
from agent_sandbox.controllers.webhook.certs import (
    CertBundle,
    CertificateError,
    bundle_problem,
    ensure_certificates,
    service_hosts,
    write_files,
)
from agent_sandbox.controllers.webhook.certwatch import CertWatcher
from agent_sandbox.controllers.webhook.crds import ALL_CRD_NAMES, patch_crds, trust_ca
from agent_sandbox.controllers.webhook.errors import WebhookError
from agent_sandbox.controllers.webhook.listener import ServingThread
from agent_sandbox.kube import EXPECTED_ERRORS, NAMESPACE, SECRET, AlreadyExists, Client, NotFound

log = logging.getLogger(__name__)

#: How often the serving pair's files are checked for a new pair: controller-runtime's certwatcher polls
#: every 10 s (besides its inotify watch, which misses Secret-volume symlink swaps on some filesystems).
CERT_POLL_INTERVAL = 10.0
#: How often a replica with managed certificates re-reads the shared Secret for a bundle another
#: replica (or anything else) stored there.
SECRET_POLL_INTERVAL = 60.0
#: What stops one read of the Secret from being followed (logged, retried at the next poll).
_SECRET_FOLLOW_ERRORS: tuple[type[BaseException], ...] = (*EXPECTED_ERRORS, CertificateError, OSError)


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


class ConversionWebhook:
    """The conversion webhook as a runnable: ``start()``/``stop()`` or ``run(stop_event)``."""

    #: Runs on every replica; the API server may call any of them.
    need_leader_election = False

    def __init__(self, client: Client, options: WebhookOptions | None = None) -> None:
        """Args: client: API client for the Secret and CRDs; options: settings (defaults as upstream)."""
        self._client = client
        self.options = options or WebhookOptions()
        self._server: ServingThread | None = None
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
        server = ServingThread(opts.host or None, opts.port, self.certs, opts.cert_poll_interval)
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


def _url_hosts(url: str | None) -> tuple[str, ...]:
    """Host of the dev-mode URL, which the serving certificate must also cover."""
    if not url:
        return ()
    host = urlsplit(url.replace("{port}", "0")).hostname
    return (host,) if host else ()
