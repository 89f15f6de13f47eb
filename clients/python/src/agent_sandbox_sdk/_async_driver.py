"""`AsyncDriver`: runs flows (`_steps.py`) with asyncio I/O - httpx2.AsyncClient and grpc.aio channels.

What a flow opened is released to the end even when the task is cancelled meanwhile, and a completed
flow's result is kept (`run(..., keep=)`) before anything can interrupt it.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar, overload

import httpx2

from ._bodies import Body, Lines, async_body
from ._closewatch import CloseWatch, closed_error, step_where
from ._driver_base import DriverBase, FlowResult, client_certificate, http_timeout, import_grpc
from ._execauth import ExecCredential
from ._http_errors import closed_client_error, transport_error
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

__all__ = ["AsyncDriver"]

T = TypeVar("T")
U = TypeVar("U")


def _cancelling() -> bool:
    """Whether the current task is being cancelled (a CancelledError may also come from a call cancelled
    underneath, e.g. by its channel closing)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class AsyncDriver(DriverBase):
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
        certificate = client_certificate(credential)
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
        box: FlowResult[Any] = FlowResult(keep)
        async for value in self._drive(flow, box):
            raise RuntimeError(f"internal error: a non-streaming flow emitted {value!r}")
        return box.kept()

    def iterate(self, flow: Flow[Any]) -> AsyncIterator[Any]:
        """Run a streaming flow, yielding what it emits."""
        return self._drive(flow, FlowResult())

    async def _drive(self, flow: Flow[Any], box: FlowResult[Any]) -> AsyncIterator[Any]:
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
        req = client.build_request(request.method, request.url, timeout=http_timeout(request.timeout), **kw)
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
            raise transport_error(
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
        """Close every pooled connection and channel; the driver stays usable (it reopens lazily).

        Those another event loop opened (`asyncio.run(work())`, then `asyncio.run(client.close())`) are dropped,
        not closed, as a flow on a new loop drops them (`_follow_loop`): closing them needs their loop, and
        until December 7 this raised `RuntimeError: Event loop is closed`."""
        self._follow_loop()
        # Both taken before the first await: a call starting meanwhile opens new ones, and a call cancelled
        # by these closes started before the count moved (told from a cancelled task by it).
        clients, self._clients = self._clients, {}
        channels, self._channels = self._channels, {}
        self.closing()
        for client in clients.values():
            await client.aclose()
        for channel in channels.values():
            await channel.close()
