"""The synchronous sandbox handle and its engines: `Sandbox`, `CommandExecutor`, `Filesystem`, `CommandStream`.

Every method runs one flow (`_commands`, `_files`, `_lifecycle`, `_sandbox_state`) on the client's `SyncDriver`;
the async twins in `async_sandbox.py` run the same flows.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator, Iterator, Mapping
from types import TracebackType
from typing import IO, Any

from . import _commands, _files, _kube, _lifecycle, _sandbox_state, metrics
from ._checks import check_timeout
from ._claims import SandboxView
from ._driver import SyncDriver
from ._shared import HandleState, Interruptions, kube_endpoint, log, new_state
from ._steps import Flow
from ._tracing import tracing_for
from .exceptions import SandboxNotReadyError, SandboxRequestError
from .models import CommandEvent, ExecutionResult, FileEntry, SandboxConnectionConfig, SandboxTracerConfig

__all__ = ["CommandExecutor", "CommandStream", "Filesystem", "Sandbox"]


class CommandStream:
    """A running command's events (`CommandEvent`: stdout/stderr chunks, then `exit`).

    Iterate it, or call `wait()`/`result()`. On sandboxd, `send_stdin`, `close_stdin`, `send_signal` and
    `resize` reach the running process. Leaving a `with` block early cancels the command.
    """

    def __init__(self, driver: SyncDriver, state: HandleState, flow: Any, ref: _commands.ProcessRef) -> None:
        self._driver = driver
        self._state = state
        self._ref = ref
        self._events = driver.iterate(flow)
        self._early: list[CommandEvent] = []  # output that arrived while waiting for the start
        self._started = False
        # One reader of the flow at a time: a thread iterating and another sending stdin (which waits for the
        # start) both pulled from it - "generator already executing" until December 6.
        self._reading = threading.Lock()
        self._start_seen = threading.Event()  # the start, or the end without one
        self.exit_code: int | None = None
        self.timed_out = False
        self._out: list[bytes] = []
        self._err: list[bytes] = []

    def _pull(self) -> CommandEvent | _commands.Started | None:
        """The next item of the flow (None at the end), with the bookkeeping of start and exit; hold
        `_reading`."""
        try:
            for item in self._events:
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

    def __iter__(self) -> Iterator[CommandEvent]:
        while True:
            with self._reading:
                item = self._early.pop(0) if self._early else self._pull()
            if item is None:
                return
            if not isinstance(item, _commands.Started):
                yield item

    def wait_started(self) -> None:
        """Block until the process runs (output arriving meanwhile is kept for iteration)."""
        while not self._started:
            if not self._reading.acquire(blocking=False):
                # Another thread is reading: the start comes to it (it is the first event, output or not -
                # waiting for its lock could wait for output that needs the stdin about to be sent).
                self._start_seen.wait()
                if not self._started:
                    return
                continue
            try:
                if self._started:
                    return
                item = self._pull()
                if item is None:
                    return
                if not isinstance(item, _commands.Started):
                    self._early.append(item)
            finally:
                self._reading.release()

    def __enter__(self) -> CommandStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def cancel(self) -> None:
        """Stop reading; a still-running command is killed by the runtime when the stream closes."""
        close = getattr(self._events, "close", None)
        if close is not None:
            close()

    def wait(self) -> int:
        """Read to the end (collecting output for `result()`); the exit code."""
        for event in self:
            if event.type == "stdout":
                self._out.append(event.data)
            elif event.type == "stderr":
                self._err.append(event.data)
        return self.exit_code if self.exit_code is not None else -1

    def result(self) -> ExecutionResult:
        """`wait()`, then everything as one `ExecutionResult`."""
        code = self.wait()
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

    def _control(self, flow: Flow[None]) -> None:
        """A control call on the process: refused at once on the legacy runtime (no channel for it - waiting
        for it to start would read its output), else sent once the process runs."""
        _commands.require_control(self._ref)
        self.wait_started()
        self._driver.run(flow)

    def send_stdin(self, data: bytes | str) -> None:
        """Write to the process's stdin (sandboxd); waits for the process to start first."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        self._control(_commands.write_stdin(self._ref, payload))

    def close_stdin(self) -> None:
        """Close the process's stdin (EOF) (sandboxd); a no-op once the process has exited."""
        self._control(_commands.write_stdin(self._ref, None))

    def send_signal(self, signal: int) -> None:
        """Signal the process group: 2 (SIGINT), 9 (SIGKILL) or 15 (SIGTERM) (sandboxd); no-op once exited."""
        self._control(_commands.signal_process(self._ref, signal))

    def resize(self, cols: int, rows: int) -> None:
        """Resize the PTY (sandboxd, `pty=` given)."""
        self._control(_commands.resize_tty(self._ref, cols, rows))


class CommandExecutor:
    """`sandbox.commands`: run commands in the sandbox."""

    def __init__(self, driver: SyncDriver, state: HandleState) -> None:
        self._driver = driver
        self._state = state

    def run(
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
        return self._driver.run(flow)

    def stream(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
        pty: tuple[int, int] | None = None,
    ) -> CommandStream:
        """Start `command` and stream its output as it happens (ours).

        `timeout`: the command's limit (then an `exit` event with `timed_out=True`). `stdin`: bytes written
        once the process starts, then EOF (sandboxd). `pty=(cols, rows)`: run under a terminal (sandboxd).
        """
        ref = _commands.ProcessRef(legacy=self._state.connection.runtime == "legacy")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        flow = _commands.stream_command(
            self._state.connection, command, timeout=timeout, env=env, cwd=cwd, stdin=data, pty=pty, ref=ref
        )
        return CommandStream(self._driver, self._state, flow, ref)


class Filesystem:
    """`sandbox.files`: files under the runtime's root directory."""

    def __init__(self, driver: SyncDriver, state: HandleState) -> None:
        self._driver = driver
        self._state = state

    def write(
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
        self._driver.run(flow)

    def read(self, path: str, timeout: int | float = 60, allow_unsafe_paths: bool = False) -> bytes:
        """The content of `path`."""
        conn = self._state.connection
        return self._driver.run(
            _files.read(conn, path, timeout=timeout, allow_unsafe_paths=allow_unsafe_paths)
        )

    def read_to(
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
        return self._driver.run(flow)

    def list(self, path: str, timeout: int | float = 60) -> list[FileEntry]:
        """Entries of the directory `path` (`""` or `"."`: the root)."""
        return self._driver.run(_files.list_dir(self._state.connection, path, timeout=timeout))

    def exists(self, path: str, timeout: int | float = 60) -> bool:
        """Whether `path` exists (file or directory)."""
        return self._driver.run(_files.exists(self._state.connection, path, timeout=timeout))

    def delete(self, path: str, recursive: bool = False, timeout: int | float = 60) -> None:
        """Remove `path`; a non-empty directory needs `recursive=True`."""
        self._driver.run(
            _files.delete_path(self._state.connection, path, recursive=recursive, timeout=timeout)
        )


class Sandbox:
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

        if isinstance(k8s_helper, SyncDriver):
            driver = k8s_helper
        else:
            driver = SyncDriver(
                kube_endpoint(k8s_helper, None, None),
                tracing=tracing_for(tracer_config or SandboxTracerConfig()),
            )
        self._driver = driver
        self._state = new_state(
            claim_name=claim_name,
            sandbox_id=sandbox_id,
            namespace=namespace,
            config=connection_config or default_connection_config(async_client=False),
            tracer_config=tracer_config,
            kube=driver.kube,
            pod_ip=pod_ip,
        )
        self._commands: CommandExecutor | None = CommandExecutor(driver, self._state)
        self._files: Filesystem | None = Filesystem(driver, self._state)

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
    def commands(self) -> CommandExecutor | None:
        """The command engine (None once the connection is closed)."""
        return self._commands

    @property
    def files(self) -> Filesystem | None:
        """The file engine (None once the connection is closed)."""
        return self._files

    @property
    def is_active(self) -> bool:
        return self._state.active and self._commands is not None

    def __repr__(self) -> str:
        return f"Sandbox(claim_name={self.claim_name!r}, sandbox_id={self.sandbox_id!r}, namespace={self.namespace!r})"

    # ------------------------------------------------------------------------------------ status

    def _view(self) -> SandboxView | None:
        return self._driver.run(self._state.connection.sandbox())

    def status(self) -> tuple[str, str]:
        """(`SandboxReady`|`SandboxNotReady`|`SandboxNotFound`, message), read from the Sandbox object.

        `SandboxNotFound` ("Sandbox object not found in Kubernetes.", upstream's words) when it does not exist;
        ours: a hibernated one is `SandboxNotReady`, the message saying how to restore it (`resume()`)."""
        state = self._state
        return self._driver.run(
            _sandbox_state.sandbox_status(state.namespace, state.sandbox_id, state.claim_name)
        )

    def get_pod_ip(self) -> str | None:
        """The pod's IP (first IPv4, else first valid), read now."""
        view = self._view()
        return view.pod_ip if view else None

    def get_pod_name(self) -> str:
        """The pod's name (legacy annotation, else the Sandbox name); cached."""
        if self._state.pod_name is None:
            try:
                view = self._view()
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

    def get_sandbox_name_hash(self) -> str | None:
        """The `agents.x-k8s.io/sandbox-name-hash` value from `status.selector`; cached."""
        if self._state.name_hash is None and (view := self._view()) is not None:
            self._state.remember(view)
        return self._state.name_hash

    def get_logs(
        self, container: str | None = None, tail_lines: int | None = None, *, previous: bool = False
    ) -> str:
        """The sandbox pod's log (ours; Kubernetes `pods/log`, where the cluster serves it). `previous`: the
        container's log before its last restart (`kubectl logs -p`: why did the runtime restart?)."""
        pod = self.get_pod_name()
        return self._driver.run(
            _kube.pod_logs(self.namespace, pod, container=container, tail_lines=tail_lines, previous=previous)
        )

    def follow_logs(
        self, container: str | None = None, tail_lines: int | None = None
    ) -> Generator[str, None, None]:
        """The sandbox pod's log as it is written (ours; `kubectl logs -f`): text until the container stops
        or the caller stops iterating. `tail_lines`: start with that many of the existing lines."""
        pod = self.get_pod_name()
        flow = _kube.follow_pod_logs(self.namespace, pod, container=container, tail_lines=tail_lines)
        yield from self._driver.iterate(flow)

    def get_service_fqdn(self) -> str | None:
        """`status.serviceFQDN` (templates with `spec.service: true`)."""
        view = self._view()
        return view.service_fqdn if view else None

    # ------------------------------------------------------------------------------------ lifecycle

    def suspend(self, *, wait: bool = True, timeout: float = 120) -> None:
        """Suspend (ours): the pod is deleted, volumes (PVC-backed files) stay. `wait`: until confirmed."""
        self._require_active()
        check_timeout(timeout)  # before the change: a wait that cannot be waited must not follow it
        flow = _sandbox_state.set_operating_mode(
            self.namespace, self.sandbox_id, suspended=True, wait=wait, timeout=timeout
        )
        with metrics.timed("sandbox_client_suspend_latency_ms"):
            self._driver.run(flow)
        self._state.connection.set_pod_ip(None)

    def resume(self, *, wait: bool = True, timeout: float = 120) -> None:
        """Resume (ours): a new pod starts with the same volumes. `wait`: until Ready (then commands work)."""
        self._require_active()
        check_timeout(timeout)  # before the change: a wait that cannot be waited must not follow it
        flow = _sandbox_state.set_operating_mode(
            self.namespace, self.sandbox_id, suspended=False, wait=wait, timeout=timeout
        )
        with metrics.timed("sandbox_client_resume_latency_ms"):
            view = self._driver.run(flow)
        self._state.connection.set_pod_ip(view.pod_ip if wait else None)

    def _require_active(self) -> None:
        if not self._state.active:
            raise SandboxNotReadyError(f"the handle of sandbox {self.sandbox_id} was closed")

    def close_connection(self) -> None:
        """Close the transport (tunnel); the claim and sandbox stay. Idempotent."""
        self._state.close()
        self._commands = None
        self._files = None

    def terminate(self) -> None:
        """Close the connection and delete the claim (the controller then deletes the sandbox). Idempotent.

        The claim this handle was made for, by its UID (a DeleteOptions precondition): one made again under
        its name since - by someone else - is refused by the API server and left alone (until December 6 an
        explicit `terminate()` deleted it by name; only the client's exit cleanup used the UID).

        Ctrl-C (or `SystemExit` from a signal handler) during the DELETE does not leave the claim behind: the
        DELETE is sent again, to its answer, then the interruption is raised (a second Ctrl-C stops it at once;
        the claim stays tracked, for the client's cleanup). Once the claim is deleted, the client that made the
        handle no longer tracks it.

        Within a client's cleanup (a `sandbox_class` whose terminate() calls this one) the cleanup's count of
        Ctrl-Cs is the one kept: one already met there makes the first Ctrl-C here the second, and the one
        absorbed here is raised by the cleanup, once it has gone through its other claims."""
        shared = Interruptions.current()
        if shared is not None:
            self._terminate(shared)
            return
        interruptions = Interruptions()
        self._terminate(interruptions)
        if interruptions.first is not None:
            raise interruptions.first

    def _terminate(self, interruptions: Interruptions) -> None:
        """`terminate()`, recording the Ctrl-C it absorbed in `interruptions` instead of raising it (a client's
        cleanup shares one across its claims). One already recorded there - or one during the resend - is
        raised at once: the second Ctrl-C stops it."""
        self.close_connection()
        state = self._state
        if state.claim_name is not None:
            flow = _lifecycle.delete_claim(state.namespace, state.claim_name, uid=state.claim_uid)
            try:
                self._driver.run(flow)
            except (KeyboardInterrupt, SystemExit) as interruption:
                if interruptions.first is not None:
                    raise  # the second: stop at once (the claim stays tracked)
                interruptions.first = interruption
                # Until December 7 the claim outlived the handle, and the process when a client's cleanup was
                # the one interrupted. Whether the first DELETE reached the API server is unknown; a second is
                # harmless (404 is success, the UID precondition still holds). A Ctrl-C during it goes on.
                again = _lifecycle.delete_claim(state.namespace, state.claim_name, uid=state.claim_uid)
                try:
                    self._driver.run(again)
                except Exception as err:
                    # The claim stays tracked (the client's cleanup retries); the interruption goes on.
                    log.error(
                        "deleting SandboxClaim %s/%s failed: %s", state.namespace, state.claim_name, err
                    )
                    return
        state.deleted()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if isinstance(exc_val, (KeyboardInterrupt, SystemExit)) and Interruptions.current() is None:
            # The block was ended by a Ctrl-C: it is the first, and one more during the DELETE stops it at once
            # (until December 7 the DELETE absorbed another one, and it took three).
            with Interruptions(exc_val).shared():
                self.terminate()
            return
        self.terminate()
