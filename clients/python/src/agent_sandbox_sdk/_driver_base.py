"""What both drivers share (`DriverBase`): the pooled httpx2 clients' settings and keys, gRPC channels, the
limits, and dropping inherited connections in a forked child.

A pool is keyed cheaply per request (`_client_key`); only a missing client pays for its settings - a TLS
context (the default one built once per process), the environment's proxies, an exec plugin's certificate.
"""

from __future__ import annotations

import functools
import importlib
import os
import ssl
import urllib.request
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import httpx2

from ._execauth import ExecCredential, ExecCredentialAuth
from ._kubeconfig import KubeEndpoint
from ._steps import GrpcCall, GrpcFailure, GrpcOpen, HttpRequest, TlsSettings
from ._tracing import Tracing

__all__ = [
    "CONNECT_TIMEOUT",
    "DriverBase",
    "FlowResult",
    "client_certificate",
    "default_tls_context",
    "http_timeout",
    "import_grpc",
]

T = TypeVar("T")
CONNECT_TIMEOUT = 10.0


def import_grpc() -> Any:
    """The `grpc` module, or an ImportError that says how to install it."""
    try:
        return importlib.import_module("grpc")
    except ImportError as err:
        raise ImportError(
            "the sandboxd runtime needs gRPC: pip install 'agent-sandbox-sdk[grpc]' (grpcio, protobuf)"
        ) from err


class FlowResult(Generic[T]):
    """A flow's result, and what the caller makes of it (`keep`), done once, as soon as the flow completes."""

    __slots__ = ("_keep", "_kept", "value")

    def __init__(self, keep: Callable[[Any], Any] | None = None) -> None:
        self.value: Any = None
        self._keep = keep
        self._kept = False

    def kept(self) -> Any:
        """`keep(value)` (the value itself without `keep`), computed on the first call only."""
        if not self._kept:
            self._kept = True
            if self._keep is not None:
                self.value = self._keep(self.value)
        return self.value


def http_timeout(seconds: float | None) -> httpx2.Timeout:
    """A request's timeout (None: no limit), its connect phase at most `CONNECT_TIMEOUT`."""
    if seconds is None:
        return httpx2.Timeout(None, connect=CONNECT_TIMEOUT)
    return httpx2.Timeout(seconds, connect=min(seconds, CONNECT_TIMEOUT))


@functools.cache
def default_tls_context() -> ssl.SSLContext:
    """httpx2's default verifying context (`verify=True`), built once per process.

    Building it loads the whole CA bundle: ~50 ms of CPU (measured, more on a loaded machine) that
    `httpx2.Client(verify=True)` would spend synchronously per client, stalling every flow on the event
    loop. An `SSLContext` is safe to share between connections, clients and threads.
    """
    return httpx2.create_ssl_context(True)


def _plaintext_tls_context() -> ssl.SSLContext | bool:
    """The context of a client that only sends `http://` URLs: cheap, and fail-closed.

    No TLS handshake happens on such a client, so no CA bundle is loaded: a `PROTOCOL_TLS_CLIENT` context
    with no trust anchors still requires a verified certificate, so it could never accept one. With a proxy
    from the environment (whose URL may be https) the default verifying context is used instead.
    """
    if urllib.request.getproxies():
        return default_tls_context()
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def client_certificate(credential: ExecCredential) -> ExecCredential | None:
    """The credential when it carries a client certificate (its own connection pool)."""
    return credential if credential.tls is not None else None


#: Every driver of this process, so that a forked child can drop the connections it inherited.
_DRIVERS: weakref.WeakSet[DriverBase] = weakref.WeakSet()


def _forget_inherited_connections() -> None:
    """In a forked child: the pooled sockets are shared with the parent, and a response read here could be the
    parent's (or another child's). Drop them unclosed - closing would end the parent's TLS sessions - so the
    child opens its own (multiprocessing's `fork` workers with a client made before the pool)."""
    for driver in list(_DRIVERS):
        driver.forget_connections()


os.register_at_fork(after_in_child=_forget_inherited_connections)


class DriverBase:
    """What both drivers share: request building, client keys, the limits."""

    _closes = 0
    """`close()`/`aclose()` calls so far: a call cut by one is told from other failures (`CloseWatch`)."""

    def __init__(
        self,
        kube: KubeEndpoint | None,
        *,
        max_connections: int = 1000,
        max_keepalive: int = 200,
        transport: Any = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.kube = kube
        #: Spans for the flows' `Trace` steps (None: tracing off, `Trace` answers {} at once).
        self.tracing = tracing
        self._limits = httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_keepalive)
        self._transport = transport  # a test seam (httpx2.MockTransport); None = the network
        self._clients: dict[Any, Any] = {}
        self._channels: dict[str, Any] = {}
        _DRIVERS.add(self)

    @property
    def closes(self) -> int:
        """How many times `closing()` (every `close()`/`aclose()` starts with it) has run: a client compares
        it around a whole call (a create) to tell one that a `close()` overlapped."""
        return self._closes

    def closing(self) -> None:
        """Count a `close()` about to run: calls in flight from now on fail as cut by it (`CloseWatch`), and a
        create completing from now on undoes itself. A client's `close()` and `with` exit call it before they
        read their registry, so that no create tracks its handle after that read and outlives the cleanup."""
        self._closes += 1

    def forget_connections(self) -> None:
        """Drop every pooled client and channel without closing them; they reopen lazily."""
        self._clients, self._channels = {}, {}

    @staticmethod
    def _client_key(request: HttpRequest, certificate: ExecCredential | None = None) -> Any:
        """Which pooled client serves `request`: cheap, so that only a missing client pays for its settings
        (a TLS context, the environment's proxies: ~170 us per request when they were built every time).
        `certificate`: the exec plugin's current client certificate - each one its own pool."""
        if request.kube:
            return ("kube", certificate.serial) if certificate is not None else "kube"
        if request.url[:7].lower() == "http://":
            return "plaintext"
        return request.tls or TlsSettings()

    def _exec_plugin(self, request: HttpRequest) -> ExecCredentialAuth | None:
        auth = self.kube.auth if request.kube and self.kube is not None else None
        return auth if isinstance(auth, ExecCredentialAuth) else None

    def _stale_kube_clients(self, current: Any) -> list[Any]:
        """The pools of earlier exec-plugin certificates, taken out: client-go closes every connection when a
        plugin's certificate changes (a request still streaming on one ends with it)."""
        stale = [k for k in self._clients if isinstance(k, tuple) and k[0] == "kube" and k != current]
        return [self._clients.pop(k) for k in stale]

    def _client_kwargs(
        self, request: HttpRequest, certificate: ExecCredential | None = None
    ) -> tuple[Any, dict[str, Any]]:
        key = self._client_key(request, certificate)
        if request.kube:
            if self.kube is None:
                raise ValueError("this client has no Kubernetes configuration")
            kw: dict[str, Any] = {
                "base_url": self.kube.base_url,
                "verify": certificate.tls
                if certificate is not None and certificate.tls
                else self.kube.verify,
                "auth": self.kube.auth,
            }
            if self.kube.proxy_url:
                kw["proxy"] = self.kube.proxy_url
        elif key == "plaintext":
            # Plain HTTP (a router or sandbox URL without TLS): one pool whatever the TLS settings, and no
            # CA bundle loaded in the middle of concurrent flows (default_tls_context).
            kw = {"verify": _plaintext_tls_context()}
        else:
            verify: ssl.SSLContext | bool = default_tls_context()
            if key.ca_cert or key.client_cert:
                verify = ssl.create_default_context(cafile=key.ca_cert)
                if key.client_cert:
                    verify.load_cert_chain(*key.client_cert)
            kw = {"verify": verify}
        kw.update(limits=self._limits, follow_redirects=False, timeout=http_timeout(60.0))
        if self._transport is not None:
            kw["transport"] = self._transport
        return key, kw

    def _request_kwargs(self, request: HttpRequest) -> dict[str, Any]:
        kw: dict[str, Any] = {"params": request.params, "headers": dict(request.headers)}
        if request.kube and self.kube is not None and self.kube.tls_server_name:
            # httpcore's per-request SNI is also the name the certificate is checked against, with or
            # without a proxy in between - what kubectl does with the cluster's tls-server-name.
            kw["extensions"] = {"sni_hostname": self.kube.tls_server_name}
        if request.json is not None:
            kw["json"] = request.json
        elif request.content is not None:
            kw["content"] = request.content
        return kw

    def _grpc_stub(self, step: GrpcCall | GrpcOpen, *, aio: bool, streaming: bool) -> Any:
        grpc = import_grpc()
        # A router pins an h2c connection to the sandbox its first stream named, so every sandbox reached
        # through a router gets its own channel and its own connection (no global subchannel sharing).
        key = f"{'aio' if aio else 'sync'} {step.target} {step.metadata}"
        channel = self._channels.get(key)
        if channel is None:
            factory = importlib.import_module("grpc.aio").insecure_channel if aio else grpc.insecure_channel
            options = [("grpc.use_local_subchannel_pool", 1)] if step.metadata else None
            made = factory(step.target, options=options)
            channel = self._channels.setdefault(key, made)
            if channel is not made and not aio:  # lost a race between threads (an aio channel has no other)
                made.close()
        kind = channel.unary_stream if streaming else channel.unary_unary
        return kind(
            step.method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=step.response_type.FromString,
        )

    @staticmethod
    def _grpc_failure(err: Any) -> GrpcFailure:
        code = err.code() if callable(getattr(err, "code", None)) else None
        details = err.details() if callable(getattr(err, "details", None)) else str(err)
        return GrpcFailure(getattr(code, "name", str(code)), details or "")
