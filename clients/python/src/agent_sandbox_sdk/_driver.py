"""The two drivers that execute flows (`_steps.py`): `SyncDriver` (blocking) and `AsyncDriver` (asyncio).

Owns: the httpx2 clients (one for the Kubernetes API with its auth/TLS, one per TLS setting for sandbox
traffic, each pooling connections across every sandbox of the client), the gRPC channels (one per
target), the translation of transport exceptions into the SDK's tree, and closing whatever a flow opened.

Connection pools are sized for many sandboxes per client: 100 concurrent handles on one `AsyncDriver`
share one pool of up to `max_connections` sockets without any thread pool (gRPC's asyncio API included).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import os
import ssl
import time
import urllib.request
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar, overload

import httpx2

from ._bodies import MAX_LINE_BYTES, Body, Lines, async_body, sync_body
from ._closewatch import CloseWatch, closed_error, step_where
from ._execauth import ExecCredential, ExecCredentialAuth
from ._kubeconfig import KubeEndpoint
from ._steps import (
    Close,
    Emit,
    Flow,
    GrpcCall,
    GrpcFailure,
    GrpcOpen,
    GrpcRead,
    HttpRequest,
    HttpResponse,
    Open,
    ReadChunk,
    ReadLine,
    Send,
    Sleep,
    Step,
    StreamHandle,
    TlsSettings,
    Trace,
)
from ._tracing import FlowTrace, Tracing
from .exceptions import SandboxConnectionError, SandboxRequestError, SandboxRequestTimeoutError

__all__ = ["MAX_LINE_BYTES", "AsyncDriver", "SyncDriver", "import_grpc"]

T = TypeVar("T")
U = TypeVar("U")
CONNECT_TIMEOUT = 10.0


def import_grpc() -> Any:
    """The `grpc` module, or an ImportError that says how to install it."""
    try:
        return importlib.import_module("grpc")
    except ImportError as err:
        raise ImportError(
            "the sandboxd runtime needs gRPC: pip install 'agent-sandbox-sdk[grpc]' (grpcio, protobuf)"
        ) from err


class _Result(Generic[T]):
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


def _timeout(seconds: float | None) -> httpx2.Timeout:
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


def _absolute(url: str, err: httpx2.TransportError) -> str:
    """A Kubernetes API path with the server it was sent to: with several clusters (contexts, `$KUBECONFIG`),
    "connection refused" alone does not say which one (kubectl names it too)."""
    if url.startswith("/"):
        try:
            sent = err.request.url
        except RuntimeError:  # raised before a request was attached
            return url
        return f"{sent.scheme}://{sent.netloc.decode('ascii')}{url}"
    return url


def _transport_error(
    request: HttpRequest, err: httpx2.TransportError, *, mid_body: bool = False
) -> SandboxRequestError:
    """httpx2 transport failures -> the SDK's tree; `request_sent` says whether a retry could repeat it.
    `mid_body`: the response head had arrived (a streamed body cut off)."""
    where = f"{request.method} {_absolute(request.url, err)}"
    if isinstance(err, httpx2.TimeoutException):
        sent = not isinstance(err, httpx2.ConnectTimeout | httpx2.PoolTimeout)
        out: SandboxRequestError = SandboxRequestTimeoutError(f"{where}: timed out ({type(err).__name__})")
    elif mid_body:
        sent = True
        out = SandboxConnectionError(
            f"{where}: the response was cut off ({type(err).__name__}: {err}) - the sandbox went away, or a "
            "router or proxy in between closed it (a router's --proxy-timeout is the longest silence it allows)"
        )
    else:
        sent = not isinstance(err, httpx2.ConnectError)
        out = SandboxConnectionError(f"{where}: no response ({type(err).__name__}: {err})")
    out.request_sent = sent
    return out


def _certificate(credential: ExecCredential) -> ExecCredential | None:
    """The credential when it carries a client certificate (its own connection pool)."""
    return credential if credential.tls is not None else None


#: Every driver of this process, so that a forked child can drop the connections it inherited.
_DRIVERS: weakref.WeakSet[_DriverBase] = weakref.WeakSet()


def _forget_inherited_connections() -> None:
    """In a forked child: the pooled sockets are shared with the parent, and a response read here could be the
    parent's (or another child's). Drop them unclosed - closing would end the parent's TLS sessions - so the
    child opens its own (multiprocessing's `fork` workers with a client made before the pool)."""
    for driver in list(_DRIVERS):
        driver.forget_connections()


os.register_at_fork(after_in_child=_forget_inherited_connections)


class _DriverBase:
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
        kw.update(limits=self._limits, follow_redirects=False, timeout=_timeout(60.0))
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


class SyncDriver(_DriverBase):
    """Runs flows with blocking I/O (httpx2.Client, grpc channels)."""

    def _client(self, request: HttpRequest) -> httpx2.Client:
        plugin = self._exec_plugin(request)
        certificate = _certificate(plugin.credential()) if plugin is not None else None  # may run the plugin
        client = self._clients.get(self._client_key(request, certificate))
        if client is None:
            key, kw = self._client_kwargs(request, certificate)
            # Threads share a SyncDriver: of two that race here, one keeps its client, the other closes its own.
            made = httpx2.Client(**kw)
            client = self._clients.setdefault(key, made)
            if client is not made:
                made.close()
            elif certificate is not None:
                for stale in self._stale_kube_clients(key):
                    stale.close()
        return client

    def run(self, flow: Flow[T]) -> T:
        """Run a flow to completion and return its result."""
        box: _Result[T] = _Result()
        for value in self._drive(flow, box):
            raise RuntimeError(f"internal error: a non-streaming flow emitted {value!r}")
        return box.value  # type: ignore[no-any-return]

    def iterate(self, flow: Flow[Any]) -> Iterator[Any]:
        """Run a streaming flow, yielding what it emits."""
        return self._drive(flow, _Result())

    def _drive(self, flow: Flow[Any], box: _Result[Any]) -> Iterator[Any]:
        opened: list[Any] = []
        watch = CloseWatch(lambda: self._closes)
        value: Any = None
        error: BaseException | None = None
        spans = FlowTrace(self.tracing) if self.tracing is not None else None
        try:
            while True:
                try:
                    step = flow.throw(error) if error is not None else flow.send(value)
                except StopIteration as stop:
                    box.value = stop.value
                    return
                value, error = None, None
                if isinstance(step, Emit):
                    yield step.value
                    continue
                if isinstance(step, Trace):
                    value = spans.step(step) if spans is not None else {}
                    continue
                if spans is not None and isinstance(step, Send | Open):
                    step = type(step)(spans.stamp(step.request))
                if (error := watch.start(step)) is not None:
                    continue
                try:
                    value = self._execute(step, opened)
                except BaseException as err:
                    # The flow gets the SDK's errors and interruptions (task cancelled, Ctrl-C), so that its
                    # rollback steps run; any other exception is not the flow's to handle.
                    if isinstance(err, Exception) and not isinstance(err, SandboxRequestError | GrpcFailure):
                        raise
                    error = watch.failed(step, err)
                else:
                    if (error := watch.succeeded(step, value)) is not None:
                        value = None
        except BaseException as failure:
            if spans is not None:
                spans.finish(failure)
            raise
        finally:
            if spans is not None:
                spans.finish(None)
            flow.close()
            for handle in reversed(opened):
                self._release(handle)

    def _execute(self, step: Step, opened: list[Any]) -> Any:
        if isinstance(step, Send | Open):
            return self._http(step.request, stream=isinstance(step, Open), opened=opened)
        if isinstance(step, ReadLine | ReadChunk):
            return self._read(step)
        if isinstance(step, Close):
            self._release(step.handle)
            return None
        if isinstance(step, Sleep):
            time.sleep(max(0.0, step.seconds))
            return None
        if isinstance(step, GrpcCall):
            try:
                return self._grpc_stub(step, aio=False, streaming=False)(
                    step.request, timeout=step.timeout, metadata=step.metadata or None
                )
            except import_grpc().RpcError as err:
                raise self._grpc_failure(err) from err
        if isinstance(step, GrpcOpen):
            call = self._grpc_stub(step, aio=False, streaming=True)(
                step.request, timeout=step.timeout, metadata=step.metadata or None
            )
            opened.append(call)
            return call
        if isinstance(step, GrpcRead):
            try:
                return next(step.handle, None)
            except import_grpc().RpcError as err:
                raise self._grpc_failure(err) from err
        raise TypeError(f"unknown step {step!r}")

    def _http(self, request: HttpRequest, *, stream: bool, opened: list[Any]) -> Any:
        client = self._client(request)
        kw = self._request_kwargs(request)
        if request.upload is not None:
            kw["content"] = sync_body(request.upload)
        req = client.build_request(request.method, request.url, timeout=_timeout(request.timeout), **kw)
        limit = request.max_response_bytes
        try:
            resp = client.send(req, stream=stream or limit is not None)
            if not stream and limit is None:
                return HttpResponse(
                    resp.status_code, dict(resp.headers), resp.content, request.method, request.url
                )
            if not stream:
                body = Body(limit)
                try:
                    for chunk in resp.iter_bytes():
                        if not body.add(chunk):
                            break
                finally:
                    resp.close()
                return body.response(resp, request)
        except httpx2.TransportError as err:
            raise _transport_error(request, err) from err
        handle = StreamHandle(
            resp.status_code, dict(resp.headers), request.method, request.url, [resp, None, None]
        )
        opened.append(handle)
        return handle

    def _read(self, step: ReadLine | ReadChunk) -> Any:
        state = step.handle.raw
        resp: httpx2.Response = state[0]
        try:
            if state[2] is None:
                state[2] = resp.iter_bytes()
            if not isinstance(step, ReadLine):
                return next(state[2], None)
            lines = state[1] = state[1] or Lines()
            while not lines.lines:
                chunk = next(state[2], None)
                lines.feed(chunk, step.handle)
                if chunk is None:
                    break
            return lines.lines.popleft() if lines.lines else None
        except httpx2.TransportError as err:
            raise _transport_error(
                HttpRequest(step.handle.method, step.handle.url), err, mid_body=True
            ) from err

    @staticmethod
    def _release(handle: Any) -> None:
        try:
            if isinstance(handle, StreamHandle):
                handle.raw[0].close()
            elif hasattr(handle, "cancel"):
                handle.cancel()
        except Exception:  # closing is best effort; the flow's own error matters more
            pass

    def close(self) -> None:
        """Close every pooled connection and channel; the driver stays usable (it reopens lazily).

        Calls running meanwhile (other threads) fail with the client-closed `SandboxConnectionError`."""
        self._closes += 1
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            channel.close()


def _cancelling() -> bool:
    """Whether the current task is being cancelled (a CancelledError may also come from a call cancelled
    underneath, e.g. by its channel closing)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class AsyncDriver(_DriverBase):
    """Runs flows with asyncio I/O (httpx2.AsyncClient, grpc.aio channels).

    Connections belong to the event loop that opened them. Used from one loop at a time: a flow started on
    another loop (`asyncio.run` called again, a test framework's loop per test) drops what the previous
    loop opened and reopens on the new one, instead of failing with "Event loop is closed".
    """

    _loop: asyncio.AbstractEventLoop | None = None

    def _follow_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        # The old loop is closed or busy elsewhere: its connections cannot be closed from here, only dropped
        # (the garbage collector closes their sockets).
        self._loop = loop
        self.forget_connections()

    def _client(self, request: HttpRequest, certificate: ExecCredential | None = None) -> httpx2.AsyncClient:
        client = self._clients.get(self._client_key(request, certificate))
        if client is None:
            key, kw = self._client_kwargs(request, certificate)
            client = self._clients[key] = httpx2.AsyncClient(**kw)
        return client

    async def _kube_client(self, request: HttpRequest) -> httpx2.AsyncClient:
        plugin = self._exec_plugin(request)
        if plugin is None:
            return self._client(request)
        # the plugin (a subprocess) runs on a thread: the event loop keeps serving
        credential = plugin.fresh()
        if credential is None:
            credential = await asyncio.to_thread(plugin.credential)
        certificate = _certificate(credential)
        key = self._client_key(request, certificate)
        renewed = certificate is not None and key not in self._clients  # as the sync driver: once per pool
        client = self._client(request, certificate)
        if renewed:
            for stale in self._stale_kube_clients(key):
                await stale.aclose()
        return client

    @overload
    async def run(self, flow: Flow[T]) -> T: ...

    @overload
    async def run(self, flow: Flow[T], keep: Callable[[T], U]) -> U: ...

    async def run(self, flow: Flow[Any], keep: Callable[[Any], Any] | None = None) -> Any:
        """Run a flow to completion and return its result - or `keep(result)`.

        `keep` records a result that must not be lost (a created claim: tracked, so that the client deletes
        it). It runs as soon as the flow completes, before the connections the flow opened are released: a
        cancellation arriving during that release is raised from here, after `keep` ran.
        """
        box: _Result[Any] = _Result(keep)
        async for value in self._drive(flow, box):
            raise RuntimeError(f"internal error: a non-streaming flow emitted {value!r}")
        return box.kept()

    def iterate(self, flow: Flow[Any]) -> AsyncIterator[Any]:
        """Run a streaming flow, yielding what it emits."""
        return self._drive(flow, _Result())

    async def _drive(self, flow: Flow[Any], box: _Result[Any]) -> AsyncIterator[Any]:
        self._follow_loop()
        opened: list[Any] = []
        value: Any = None
        error: BaseException | None = None
        completed = False
        watch = CloseWatch(lambda: self._closes)
        spans = FlowTrace(self.tracing) if self.tracing is not None else None
        try:
            while True:
                try:
                    step = flow.throw(error) if error is not None else flow.send(value)
                except StopIteration as stop:
                    box.value = stop.value
                    completed = True
                    return
                value, error = None, None
                if isinstance(step, Emit):
                    yield step.value
                    continue
                if isinstance(step, Trace):
                    value = spans.step(step) if spans is not None else {}
                    continue
                if spans is not None and isinstance(step, Send | Open):
                    step = type(step)(spans.stamp(step.request))
                if (error := watch.start(step)) is not None:
                    continue
                try:
                    value = await self._execute(step, opened)
                except BaseException as err:
                    # The flow gets the SDK's errors and interruptions (task cancelled, Ctrl-C), so that its
                    # rollback steps run; any other exception is not the flow's to handle.
                    if isinstance(err, Exception) and not isinstance(err, SandboxRequestError | GrpcFailure):
                        raise
                    if isinstance(err, asyncio.CancelledError) and watch.cut() and not _cancelling():
                        # Not this task's cancellation: grpc.aio cancels the calls of a channel being closed
                        # (`close()` of the client while they run). Until December 6 that came out as a
                        # CancelledError of a task nobody cancelled (a TaskGroup took it for a cancellation).
                        err = closed_error(step_where(step))
                    error = watch.failed(step, err)
                else:
                    if (error := watch.succeeded(step, value)) is not None:
                        value = None
        except BaseException as failure:
            if spans is not None:
                spans.finish(failure)
            raise
        finally:
            if spans is not None:
                spans.finish(None)
            flow.close()
            try:
                if completed:
                    box.kept()  # recorded before any await: a cancellation from now on must not lose it
            finally:
                if opened:
                    await self._release_opened(opened)

    async def _release_opened(self, opened: list[Any]) -> None:
        """Release what a flow left open, in reverse order, to the end: a cancellation meanwhile waits for it,
        then is raised here - from the SDK call the task was in, as `asyncio.timeout` and `TaskGroup` expect.

        A completed flow's result was kept first (`run(..., keep=)`: a create tracks its claim, so the client
        deletes it on exit). Raised before that, it lost a Ready claim (neither deleted nor tracked). Then, until
        December 6, it was re-requested for the caller's next await instead, which `asyncio.timeout` did not see:
        the call returned inside the block with no TimeoutError, and the next, unrelated await raised a
        `CancelledError` nobody was counting (`cancelling() == 0`).
        """
        releasing = asyncio.ensure_future(self._release_each(opened))
        interrupted: asyncio.CancelledError | None = None
        while not releasing.done():
            try:
                await asyncio.shield(releasing)
            except asyncio.CancelledError as cancel:
                interrupted = cancel
        if interrupted is not None:
            raise interrupted

    async def _release_each(self, opened: list[Any]) -> None:
        for handle in reversed(opened):
            await self._release(handle)

    async def _execute(self, step: Step, opened: list[Any]) -> Any:
        if isinstance(step, Send | Open):
            return await self._http(step.request, stream=isinstance(step, Open), opened=opened)
        if isinstance(step, ReadLine | ReadChunk):
            return await self._read(step)
        if isinstance(step, Close):
            await self._release(step.handle)
            return None
        if isinstance(step, Sleep):
            await asyncio.sleep(max(0.0, step.seconds))
            return None
        if isinstance(step, GrpcCall):
            try:
                return await self._grpc_stub(step, aio=True, streaming=False)(
                    step.request, timeout=step.timeout, metadata=step.metadata or None
                )
            except import_grpc().RpcError as err:
                raise self._grpc_failure(err) from err
        if isinstance(step, GrpcOpen):
            call = self._grpc_stub(step, aio=True, streaming=True)(
                step.request, timeout=step.timeout, metadata=step.metadata or None
            )
            opened.append(call)
            return call
        if isinstance(step, GrpcRead):
            grpc = import_grpc()
            try:
                message = await step.handle.read()
            except grpc.RpcError as err:
                raise self._grpc_failure(err) from err
            return None if message is importlib.import_module("grpc.aio").EOF else message
        raise TypeError(f"unknown step {step!r}")

    async def _http(self, request: HttpRequest, *, stream: bool, opened: list[Any]) -> Any:
        client = await self._kube_client(request) if request.kube else self._client(request)
        kw = self._request_kwargs(request)
        if request.upload is not None:
            kw["content"] = async_body(request.upload)
        req = client.build_request(request.method, request.url, timeout=_timeout(request.timeout), **kw)
        limit = request.max_response_bytes
        try:
            resp = await client.send(req, stream=stream or limit is not None)
            if not stream and limit is None:
                return HttpResponse(
                    resp.status_code, dict(resp.headers), resp.content, request.method, request.url
                )
            if not stream:
                body = Body(limit)
                try:
                    async for chunk in resp.aiter_bytes():
                        if not body.add(chunk):
                            break
                finally:
                    await resp.aclose()
                return body.response(resp, request)
        except httpx2.TransportError as err:
            raise _transport_error(request, err) from err
        handle = StreamHandle(
            resp.status_code, dict(resp.headers), request.method, request.url, [resp, None, None]
        )
        opened.append(handle)
        return handle

    async def _read(self, step: ReadLine | ReadChunk) -> Any:
        state = step.handle.raw
        resp: httpx2.Response = state[0]
        try:
            if state[2] is None:
                state[2] = resp.aiter_bytes()
            if not isinstance(step, ReadLine):
                return await anext(state[2], None)
            lines = state[1] = state[1] or Lines()
            while not lines.lines:
                chunk = await anext(state[2], None)
                lines.feed(chunk, step.handle)
                if chunk is None:
                    break
            return lines.lines.popleft() if lines.lines else None
        except httpx2.TransportError as err:
            raise _transport_error(
                HttpRequest(step.handle.method, step.handle.url), err, mid_body=True
            ) from err

    @staticmethod
    async def _release(handle: Any) -> None:
        try:
            if isinstance(handle, StreamHandle):
                await handle.raw[0].aclose()
            elif hasattr(handle, "cancel"):
                handle.cancel()
        except Exception:  # closing is best effort; the flow's own error matters more
            pass

    async def aclose(self) -> None:
        """Close every pooled connection and channel; the driver stays usable (it reopens lazily)."""
        # Both taken before the first await: a call starting meanwhile opens new ones, and a call cancelled
        # by these closes started before the count moved (told from a cancelled task by it).
        clients, self._clients = self._clients, {}
        channels, self._channels = self._channels, {}
        self._closes += 1
        for client in clients.values():
            await client.aclose()
        for channel in channels.values():
            await channel.close()
