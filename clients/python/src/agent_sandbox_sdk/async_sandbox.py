"""The asyncio sandbox handle and its engines: `AsyncSandbox`, `AsyncCommandExecutor`, `AsyncFilesystem`,
`AsyncCommandStream` — the twins of `sandbox.py`, running the same flows on an `AsyncDriver`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextvars import ContextVar
from types import TracebackType
from typing import IO, Any

from . import _commands, _files, _kube, _lifecycle, _sandbox_state, metrics
from ._checks import check_timeout
from ._claims import SandboxView
from ._driver import AsyncDriver
from ._shared import HandleState, kube_endpoint, log, new_state
from ._steps import Flow
from ._tracing import tracing_for
from .exceptions import SandboxNotReadyError, SandboxRequestError
from .models import CommandEvent, ExecutionResult, FileEntry, SandboxConnectionConfig, SandboxTracerConfig

__all__ = ["AsyncCommandExecutor", "AsyncCommandStream", "AsyncFilesystem", "AsyncSandbox"]


class AsyncCommandStream:
    """A running command's events (`CommandEvent`: stdout/stderr chunks, then `exit`).

    Iterate it, or call `wait()`/`result()`. On sandboxd, `send_stdin`, `close_stdin`, `send_signal` and
    `resize` reach the running process. Leaving a `with` block early cancels the command.
    """

    def __init__(self, driver: AsyncDriver, state: HandleState, flow: Any, ref: _commands.ProcessRef) -> None:
        self._driver = driver
        self._state = state
        self._ref = ref
        self._events = driver.iterate(flow)
        self._early: list[CommandEvent] = []  # output that arrived while waiting for the start
        self._started = False
        # One reader of the flow at a time: a task iterating and another sending stdin (which waits for the
        # start) both pulled from it - "anext(): asynchronous generator is already running" until December 6.
        self._reading = asyncio.Lock()
        self._start_seen = asyncio.Event()  # the start, or the end without one
        self.exit_code: int | None = None
        self.timed_out = False
        self._out: list[bytes] = []
        self._err: list[bytes] = []

    async def _pull(self) -> CommandEvent | _commands.Started | None:
        """The next item of the flow (None at the end), with the bookkeeping of start and exit; hold
        `_reading`."""
        try:
            async for item in self._events:
                if isinstance(item, _commands.Started):
                    self._started = True
                    self._start_seen.set()
                elif item.type == "exit":
                    self.exit_code, self.timed_out = item.exit_code, item.timed_out
                return item  # type: ignore[no-any-return]
        except BaseException:
            self._start_seen.set()  # a waiter for the start must not wait for a stream that failed
            raise
        self._start_seen.set()
        return None

    def __aiter__(self) -> AsyncIterator[CommandEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[CommandEvent]:
        while True:
            async with self._reading:
                item = self._early.pop(0) if self._early else await self._pull()
            if item is None:
                return
            if not isinstance(item, _commands.Started):
                yield item

    async def wait_started(self) -> None:
        """Wait until the process runs (output arriving meanwhile is kept for iteration)."""
        while not self._started:
            if self._reading.locked():
                # Another task is reading: the start comes to it (it is the first event, output or not -
                # waiting for its lock could wait for output that needs the stdin about to be sent).
                await self._start_seen.wait()
                if not self._started:
                    return
                continue
            async with self._reading:
                if self._started:
                    return
                item = await self._pull()
                if item is None:
                    return
                if not isinstance(item, _commands.Started):
                    self._early.append(item)

    async def __aenter__(self) -> AsyncCommandStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.cancel()

    async def cancel(self) -> None:
        """Stop reading; a still-running command is killed by the runtime when the stream closes."""
        aclose = getattr(self._events, "aclose", None)
        if aclose is not None:
            await aclose()

    async def wait(self) -> int:
        """Read to the end (collecting output for `result()`); the exit code."""
        async for event in self:
            if event.type == "stdout":
                self._out.append(event.data)
            elif event.type == "stderr":
                self._err.append(event.data)
        return self.exit_code if self.exit_code is not None else -1

    async def result(self) -> ExecutionResult:
        """`wait()`, then everything as one `ExecutionResult`."""
        code = await self.wait()
        return ExecutionResult(
            stdout=b"".join(self._out).decode("utf-8", errors="replace"),
            stderr=b"".join(self._err).decode("utf-8", errors="replace"),
            exit_code=code,
            timed_out=self.timed_out,
        )

    @property
    def process_id(self) -> int | None:
        """sandboxd's id of the process (known after the first event); None on the legacy runtime."""
        return self._ref.process_id

    async def _control(self, flow: Flow[None]) -> None:
        """A control call on the process: refused at once on the legacy runtime (no channel for it - waiting
        for it to start would read its output), else sent once the process runs."""
        _commands.require_control(self._ref)
        await self.wait_started()
        await self._driver.run(flow)

    async def send_stdin(self, data: bytes | str) -> None:
        """Write to the process's stdin (sandboxd); waits for the process to start first."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        await self._control(_commands.write_stdin(self._ref, payload))

    async def close_stdin(self) -> None:
        """Close the process's stdin (EOF) (sandboxd); a no-op once the process has exited."""
        await self._control(_commands.write_stdin(self._ref, None))

    async def send_signal(self, signal: int) -> None:
        """Signal the process group: 2 (SIGINT), 9 (SIGKILL) or 15 (SIGTERM) (sandboxd); no-op once exited."""
        await self._control(_commands.signal_process(self._ref, signal))

    async def resize(self, cols: int, rows: int) -> None:
        """Resize the PTY (sandboxd, `pty=` given)."""
        await self._control(_commands.resize_tty(self._ref, cols, rows))


class AsyncCommandExecutor:
    """`sandbox.commands`: run commands in the sandbox."""

    def __init__(self, driver: AsyncDriver, state: HandleState) -> None:
        self._driver = driver
        self._state = state

    async def run(
        self,
        command: str,
        timeout: int | float = 60,
        command_timeout: int | float | None = None,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecutionResult:
        """Run `command` (through `/bin/sh -c` on sandboxd; shell-like split without a shell on the legacy
        runtime) and return its output and exit code.

        `timeout`: seconds to wait for the answer. `command_timeout`: the runtime kills the command after
        this many seconds and answers `timed_out=True` (exit code 124 on sandboxd). `env`/`cwd`: per command.
        """
        flow = _commands.run_command(
            self._state.connection,
            command,
            timeout=timeout,
            command_timeout=command_timeout,
            env=env,
            cwd=cwd,
        )
        return await self._driver.run(flow)

    def stream(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
        pty: tuple[int, int] | None = None,
    ) -> AsyncCommandStream:
        """Start `command` and stream its output as it happens (ours).

        `timeout`: the command's limit (then an `exit` event with `timed_out=True`). `stdin`: bytes written
        once the process starts, then EOF (sandboxd). `pty=(cols, rows)`: run under a terminal (sandboxd).
        """
        ref = _commands.ProcessRef(legacy=self._state.connection.runtime == "legacy")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        flow = _commands.stream_command(
            self._state.connection, command, timeout=timeout, env=env, cwd=cwd, stdin=data, pty=pty, ref=ref
        )
        return AsyncCommandStream(self._driver, self._state, flow, ref)


class AsyncFilesystem:
    """`sandbox.files`: files under the runtime's root directory."""

    def __init__(self, driver: AsyncDriver, state: HandleState) -> None:
        self._driver = driver
        self._state = state

    async def write(
        self,
        path: str,
        content: _files.Content,
        timeout: int | float = 60,
        allow_unsafe_paths: bool = False,
        *,
        mode: int | None = None,
    ) -> None:
        """Create or replace `path` with `content` (bytes, str as UTF-8, or a binary file object, streamed).

        `mode`: its permission bits (`0o755` for a script to run), else the runtime's default 0644. The
        legacy runtime sets it with a `chmod` command after the upload.
        """
        conn = self._state.connection
        flow = _files.write(
            conn, path, content, timeout=timeout, allow_unsafe_paths=allow_unsafe_paths, mode=mode
        )
        await self._driver.run(flow)

    async def read(self, path: str, timeout: int | float = 60, allow_unsafe_paths: bool = False) -> bytes:
        """The content of `path`."""
        conn = self._state.connection
        return await self._driver.run(
            _files.read(conn, path, timeout=timeout, allow_unsafe_paths=allow_unsafe_paths)
        )

    async def read_to(
        self,
        path: str,
        destination: str | os.PathLike[str] | IO[bytes],
        timeout: int | float = 60,
        allow_unsafe_paths: bool = False,
        max_bytes: int | None = None,
    ) -> int:
        """Stream `path` into `destination` (a local path or a writable binary file); the bytes written."""
        flow = _files.read_to(
            self._state.connection,
            path,
            destination,
            timeout=timeout,
            allow_unsafe_paths=allow_unsafe_paths,
            max_bytes=max_bytes,
        )
        return await self._driver.run(flow)

    async def list(self, path: str, timeout: int | float = 60) -> list[FileEntry]:
        """Entries of the directory `path` (`""` or `"."`: the root)."""
        return await self._driver.run(_files.list_dir(self._state.connection, path, timeout=timeout))

    async def exists(self, path: str, timeout: int | float = 60) -> bool:
        """Whether `path` exists (file or directory)."""
        return await self._driver.run(_files.exists(self._state.connection, path, timeout=timeout))

    async def delete(self, path: str, recursive: bool = False, timeout: int | float = 60) -> None:
        """Remove `path`; a non-empty directory needs `recursive=True`."""
        await self._driver.run(
            _files.delete_path(self._state.connection, path, recursive=recursive, timeout=timeout)
        )


def _cancelling() -> int:
    """How many cancellations of the current task are under way (`Task.cancelling()`; 0 outside a task)."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


#: The `cancelling()` count beyond which a client's cleanup stops, shared with the `terminate()`s it calls: a
#: `sandbox_class` whose terminate() calls `super().terminate()` would otherwise count from its own entry - after
#: a first cancellation absorbed, one more. A context variable: each task has its own.
_CLEANUP_LIMIT: ContextVar[int | None] = ContextVar("agent_sandbox_sdk_cleanup_limit", default=None)


def _stop_limit() -> int:
    """The `cancelling()` count beyond which a `terminate()` (or a cleanup) starting now stops at once: the
    cleanup's, when one calls it; else the count at entry plus one - one more cancellation is absorbed, even
    in a task already cancelling (a cancellation it caught without `uncancel()`, a cancelled `async with`
    block), so an `asyncio.timeout` around it does not cut the DELETE. Until December 7 (that change's second
    version) it was `max(1, cancelling())`, and in such a task one timeout cut it (the claim outlived the
    handle). asyncio's second Ctrl-C still stops it at once: the closing loop cancels the DELETE itself."""
    limit = _CLEANUP_LIMIT.get()
    return limit if limit is not None else _cancelling() + 1


class AsyncSandbox:
    """A handle on one claimed sandbox: identity, status, `commands`, `files`, suspend/resume, terminate."""

    def __init__(
        self,
        claim_name: str | None,
        sandbox_id: str,
        namespace: str = "default",
        connection_config: SandboxConnectionConfig | None = None,
        tracer_config: SandboxTracerConfig | None = None,
        k8s_helper: Any = None,
        *,
        pod_ip: str | None = None,
    ) -> None:
        from ._shared import default_connection_config

        if isinstance(k8s_helper, AsyncDriver):
            driver = k8s_helper
        else:
            driver = AsyncDriver(
                kube_endpoint(k8s_helper, None, None),
                tracing=tracing_for(tracer_config or SandboxTracerConfig()),
            )
        self._driver = driver
        self._state = new_state(
            claim_name=claim_name,
            sandbox_id=sandbox_id,
            namespace=namespace,
            config=connection_config or default_connection_config(async_client=True),
            tracer_config=tracer_config,
            kube=driver.kube,
            pod_ip=pod_ip,
        )
        self._commands: AsyncCommandExecutor | None = AsyncCommandExecutor(driver, self._state)
        self._files: AsyncFilesystem | None = AsyncFilesystem(driver, self._state)

    # ------------------------------------------------------------------------------------ identity

    @property
    def claim_name(self) -> str | None:
        """The SandboxClaim's name (None after `terminate()`)."""
        return self._state.claim_name

    @property
    def sandbox_id(self) -> str:
        """The Sandbox's name (the router's `X-Sandbox-ID`)."""
        return self._state.sandbox_id

    @property
    def namespace(self) -> str:
        return self._state.namespace

    @property
    def commands(self) -> AsyncCommandExecutor | None:
        """The command engine (None once the connection is closed)."""
        return self._commands

    @property
    def files(self) -> AsyncFilesystem | None:
        """The file engine (None once the connection is closed)."""
        return self._files

    @property
    def is_active(self) -> bool:
        return self._state.active and self._commands is not None

    def __repr__(self) -> str:
        return f"AsyncSandbox(claim_name={self.claim_name!r}, sandbox_id={self.sandbox_id!r}, namespace={self.namespace!r})"

    # ------------------------------------------------------------------------------------ status

    async def _view(self) -> SandboxView | None:
        return await self._driver.run(self._state.connection.sandbox())

    async def status(self) -> tuple[str, str]:
        """(`SandboxReady`|`SandboxNotReady`|`SandboxNotFound`, message), read from the Sandbox object.

        `SandboxNotFound` ("Sandbox object not found in Kubernetes.", upstream's words) when it does not exist;
        ours: a hibernated one is `SandboxNotReady`, the message saying how to restore it (`resume()`)."""
        state = self._state
        return await self._driver.run(
            _sandbox_state.sandbox_status(state.namespace, state.sandbox_id, state.claim_name)
        )

    async def get_pod_ip(self) -> str | None:
        """The pod's IP (first IPv4, else first valid), read now."""
        view = await self._view()
        return view.pod_ip if view else None

    async def get_pod_name(self) -> str:
        """The pod's name (legacy annotation, else the Sandbox name); cached."""
        if self._state.pod_name is None:
            try:
                view = await self._view()
            except SandboxRequestError as err:
                if err.status_code != 403:
                    raise
                # A role that reads claims but not Sandboxes: the pod is named after its Sandbox (only the
                # legacy annotation could say otherwise), as the Go SDK assumes - `logs` failed until December 6.
                return self.sandbox_id
            if view is None:
                return self.sandbox_id
            self._state.remember(view)
        return self._state.pod_name or self.sandbox_id

    async def get_sandbox_name_hash(self) -> str | None:
        """The `agents.x-k8s.io/sandbox-name-hash` value from `status.selector`; cached."""
        if self._state.name_hash is None and (view := await self._view()) is not None:
            self._state.remember(view)
        return self._state.name_hash

    async def get_logs(
        self, container: str | None = None, tail_lines: int | None = None, *, previous: bool = False
    ) -> str:
        """The sandbox pod's log (ours; Kubernetes `pods/log`, where the cluster serves it). `previous`: the
        container's log before its last restart (`kubectl logs -p`: why did the runtime restart?)."""
        pod = await self.get_pod_name()
        return await self._driver.run(
            _kube.pod_logs(self.namespace, pod, container=container, tail_lines=tail_lines, previous=previous)
        )

    async def follow_logs(
        self, container: str | None = None, tail_lines: int | None = None
    ) -> AsyncGenerator[str, None]:
        """The sandbox pod's log as it is written (ours; `kubectl logs -f`): text until the container stops
        or the caller stops iterating. `tail_lines`: start with that many of the existing lines."""
        pod = await self.get_pod_name()
        flow = _kube.follow_pod_logs(self.namespace, pod, container=container, tail_lines=tail_lines)
        async for text in self._driver.iterate(flow):
            yield text

    async def get_service_fqdn(self) -> str | None:
        """`status.serviceFQDN` (templates with `spec.service: true`)."""
        view = await self._view()
        return view.service_fqdn if view else None

    # ------------------------------------------------------------------------------------ lifecycle

    async def suspend(self, *, wait: bool = True, timeout: float = 120) -> None:
        """Suspend (ours): the pod is deleted, volumes (PVC-backed files) stay. `wait`: until confirmed."""
        self._require_active()
        check_timeout(timeout)  # before the change: a wait that cannot be waited must not follow it
        flow = _sandbox_state.set_operating_mode(
            self.namespace, self.sandbox_id, suspended=True, wait=wait, timeout=timeout
        )

        def forget(_view: SandboxView) -> None:  # the pod is gone, even if cancelled from here on
            self._state.connection.set_pod_ip(None)

        with metrics.timed("sandbox_client_suspend_latency_ms"):
            await self._driver.run(flow, forget)

    async def resume(self, *, wait: bool = True, timeout: float = 120) -> None:
        """Resume (ours): a new pod starts with the same volumes. `wait`: until Ready (then commands work)."""
        self._require_active()
        check_timeout(timeout)  # before the change: a wait that cannot be waited must not follow it
        flow = _sandbox_state.set_operating_mode(
            self.namespace, self.sandbox_id, suspended=False, wait=wait, timeout=timeout
        )

        def remember(view: SandboxView) -> None:  # the new pod's address, even if cancelled from here on
            self._state.connection.set_pod_ip(view.pod_ip if wait else None)

        with metrics.timed("sandbox_client_resume_latency_ms"):
            await self._driver.run(flow, remember)

    def _require_active(self) -> None:
        if not self._state.active:
            raise SandboxNotReadyError(f"the handle of sandbox {self.sandbox_id} was closed")

    async def close_connection(self) -> None:
        """Close the transport (tunnel); the claim and sandbox stay. Idempotent."""
        self._state.close()
        self._commands = None
        self._files = None

    async def terminate(self) -> None:
        """Close the connection and delete the claim (the controller then deletes the sandbox). Idempotent.

        The claim this handle was made for, by its UID (a DeleteOptions precondition): one made again under
        its name since - by someone else - is refused by the API server and left alone (until December 6 an
        explicit `terminate()` deleted it by name; only the client's exit cleanup used the UID).

        A cancellation meanwhile does not cut the DELETE: it is raised once the DELETE has been answered (in a
        task already cancelling too). A second one (the task's `cancelling()` two above its count at entry)
        stops it at once, as does the DELETE's own cancellation (the event loop closing: asyncio's second
        Ctrl-C); the claim then stays tracked, for the client's cleanup. Once the claim is deleted, the client that made the handle no longer tracks it."""
        if (interrupted := await self._terminate()) is not None:
            raise interrupted

    async def _terminate(self, limit: int | None = None) -> asyncio.CancelledError | None:
        """`terminate()`, returning the cancellation it absorbed instead of raising it (a client's cleanup goes
        on through its other claims first). A cancellation that stops it at once is raised: one that takes the
        task's `cancelling()` beyond `limit` (default: `_stop_limit()`), or the DELETE's own."""
        await self.close_connection()
        state = self._state
        if state.claim_name is None:
            state.deleted()  # idempotent: already deleted and forgotten
            return None
        if limit is None:
            limit = _stop_limit()

        def deleted(_existed: bool) -> None:  # recorded as soon as the DELETE is answered
            state.deleted()

        flow = _lifecycle.delete_claim(state.namespace, state.claim_name, uid=state.claim_uid)
        # Shielded, as a failed create's rollback: a cancellation (the task's, an `asyncio.timeout` around an
        # `async with` block) is raised once the DELETE has been answered, not in its middle. Until December 7
        # it cut the DELETE, and the claim outlived the handle (and, once a client's cleanup had let go of it,
        # the process).
        deleting = asyncio.ensure_future(self._driver.run(flow, deleted))
        interrupted: asyncio.CancelledError | None = None
        while not deleting.done():
            try:
                await asyncio.shield(deleting)
            except asyncio.CancelledError as cancel:
                if deleting.cancelled():  # the DELETE itself was cancelled (the event loop closing)
                    raise
                if _cancelling() > limit:
                    # A second cancellation: stop at once (for a while after December 7 no number of them did,
                    # and asyncio's second Ctrl-C left the loop closing around DELETEs still pending).
                    deleting.cancel()
                    raise
                interrupted = cancel
        if interrupted is not None:
            if not deleting.cancelled() and (failure := deleting.exception()) is not None:
                # The claim stays tracked: the client's cleanup deletes it. The interruption goes on.
                log.error(
                    "deleting SandboxClaim %s/%s failed: %s", state.namespace, state.claim_name, failure
                )
            return interrupted
        deleting.result()
        return None

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.terminate()
