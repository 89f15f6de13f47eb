"""`SyncDriver`: runs flows (`_steps.py`) with blocking I/O - httpx2.Client and grpc channels.

Threads may share one: pooled clients are created race-free (the loser of a race closes its own).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, TypeVar

import httpx2

from ._bodies import Body, Lines, sync_body
from ._closewatch import CloseWatch
from ._driver_base import DriverBase, FlowResult, client_certificate, http_timeout, import_grpc
from ._http_errors import closed_client_error, transport_error
from ._socket_cut import cut_sockets, track_sockets
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
    Trace,
)
from ._tracing import FlowTrace
from .exceptions import SandboxRequestError

__all__ = ["SyncDriver"]

T = TypeVar("T")


class SyncDriver(DriverBase):
    """Runs flows with blocking I/O (httpx2.Client, grpc channels)."""

    def _client(self, request: HttpRequest) -> httpx2.Client:
        plugin = self._exec_plugin(request)
        # may run the plugin
        certificate = client_certificate(plugin.credential()) if plugin is not None else None
        client = self._clients.get(self._client_key(request, certificate))
        if client is None:
            key, kw = self._client_kwargs(request, certificate)
            # Threads share a SyncDriver: of two that race here, one keeps its client, the other closes its own.
            made = httpx2.Client(**kw)
            if self._transport is None:  # a transport of the caller's own outlives this driver's close()
                track_sockets(made)
            client = self._clients.setdefault(key, made)
            if client is not made:
                made.close()
            elif certificate is not None:
                for stale in self._stale_kube_clients(key):
                    stale.close()
        return client

    def run(self, flow: Flow[T]) -> T:
        """Run a flow to completion and return its result."""
        box: FlowResult[T] = FlowResult()
        for value in self._drive(flow, box):
            raise RuntimeError(f"internal error: a non-streaming flow emitted {value!r}")
        return box.value  # type: ignore[no-any-return]

    def iterate(self, flow: Flow[Any]) -> Iterator[Any]:
        """Run a streaming flow, yielding what it emits."""
        return self._drive(flow, FlowResult())

    def _drive(self, flow: Flow[Any], box: FlowResult[Any]) -> Iterator[Any]:
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
        req = client.build_request(request.method, request.url, timeout=http_timeout(request.timeout), **kw)
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
            raise transport_error(request, err) from err
        except RuntimeError as err:
            if not client.is_closed:
                raise
            raise closed_client_error(request, err) from err
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
            raise transport_error(
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

        Calls running meanwhile (other threads) fail at once with the client-closed `SandboxConnectionError`:
        their sockets are shut down before they are closed (`_socket_cut.py`)."""
        self.closing()
        clients, self._clients = self._clients, {}
        for client in clients.values():
            cut_sockets(client)
            client.close()
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            channel.close()
