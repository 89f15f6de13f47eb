"""The conversion webhook's listener as a child process, and the controller's handle on it.

While v1alpha1 is served, kube-apiserver sends every stored change of a Sandbox, claim, pool or template
through the webhook to refill its v1alpha1 watch cache, one review at a time per resource. After a warm
pool fill that is a serial chain of ~700 reviews/s, and each answer's latency sets the chain's pace. On a
thread of the controller process an answer waited for the GIL behind reconcile work (1.0 ms per review
measured, 0.24 ms for the same listener alone; docs/design/webhook-thread.md). A process of its own has
its own interpreter, so the two only share CPU.

Both ends of the pipe live here:

- :class:`ListenerProcess` (controller side) starts ``python -m agent_sandbox.controllers.webhook.listener``
  with the host, port and certificate paths as one JSON argument, reads the bound port from the child's
  first stdout line, then relays the child's log records (JSON lines on its stdout) into the controller's
  logging. Closing the child's stdin stops it; the controller dying closes it too, so a SIGKILLed
  controller leaves no listener behind. :meth:`ListenerProcess.wait` raises when the child ends unasked,
  so the controller exits (and is restarted) rather than serving no conversions.
- :func:`main` (child side) imports only aiohttp, the routes (:mod:`.app`) and the pure conversion; the
  package's ``__init__`` loads nothing else eagerly, so the child starts in ~0.3 s with ~40 MiB RSS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from agent_sandbox.controllers.webhook.app import WebhookError, listen, new_event_loop, server_tls

log = logging.getLogger(__name__)

#: How long the child may take to import and bind before start() gives up.
START_TIMEOUT = 30.0
#: How long stop() waits for the child to close its listener before SIGKILL.
STOP_GRACE = 10.0


class ListenerProcess:
    """The webhook listener in a child process: ``await start()`` → port, ``wait()``, ``stop()``."""

    def __init__(self, host: str | None, port: int, cert_path: Path, key_path: Path) -> None:
        """Args: host: bind address (None = every interface); port: 0 picks one; cert/key: PEM files."""
        self._config = {"host": host, "port": port, "cert": str(cert_path), "key": str(key_path)}
        self._proc: asyncio.subprocess.Process | None = None
        self._relay: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        """The child's process id once started."""
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> int:
        """Start the child and wait until it listens; returns the bound port.

        Raises:
            WebhookError: the child could not load the certificate, bind, or start within ``START_TIMEOUT``.
        """
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", __name__, orjson.dumps(self._config).decode(),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self._proc = proc
        assert proc.stdout is not None
        try:
            first = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)
        except TimeoutError:
            await self.stop()
            raise WebhookError(
                f"conversion webhook listener did not start within {START_TIMEOUT:.0f}s"
            ) from None
        hello = _parse(first)
        if not isinstance(hello.get("port"), int):
            self._stopping = True
            await self._reap()
            why = hello.get("error") or f"exited with status {proc.returncode} before listening"
            raise WebhookError(str(why))
        self._relay = asyncio.create_task(self._relay_logs(proc.stdout), name="webhook-listener-logs")
        log.debug("conversion webhook listener pid %d on port %d", proc.pid, hello["port"])
        return int(hello["port"])

    async def wait(self) -> None:
        """Return when the listener was stopped; raise :class:`WebhookError` when it ended unasked."""
        if self._proc is None:
            return
        code = await self._proc.wait()
        if self._relay is not None:
            await self._relay  # its last records (a traceback's summary) before the verdict
        if not self._stopping:
            raise WebhookError(
                f"conversion webhook listener (pid {self._proc.pid}) exited with status {code}"
            )

    async def stop(self) -> None:
        """Close the listener: EOF on its stdin, SIGKILL after ``STOP_GRACE`` (idempotent)."""
        self._stopping = True
        await self._reap()

    async def _reap(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), STOP_GRACE)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._relay is not None:
            await self._relay

    async def _relay_logs(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            record = _parse(line)
            level = record.get("level")
            logging.getLogger(str(record.get("logger") or __name__)).log(
                level if isinstance(level, int) else logging.WARNING,
                "%s",
                record.get("msg", line.decode().strip()),
            )


def _parse(line: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class _PipeHandler(logging.Handler):
    """Log records as JSON lines on the parent's pipe (the parent formats them as its own)."""

    def __init__(self, out: IO[bytes]) -> None:
        super().__init__()
        self._out = out

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.exc_info:
                msg += "\n" + logging.Formatter().formatException(record.exc_info)
            _send(self._out, {"level": record.levelno, "logger": record.name, "msg": msg})
        except Exception:
            self.handleError(record)


def _send(out: IO[bytes], message: dict[str, Any]) -> None:
    out.write(orjson.dumps(message) + b"\n")
    out.flush()


async def _serve(config: dict[str, Any], out: IO[bytes]) -> int:
    try:
        tls = server_tls(Path(config["cert"]), Path(config["key"]))
        runner, port = await listen(config["host"], int(config["port"]), tls)
    except (OSError, WebhookError) as exc:
        _send(out, {"error": str(exc)})
        return 1
    closed = asyncio.Event()

    class _UntilEof(asyncio.Protocol):
        def eof_received(self) -> bool:
            closed.set()
            return False

        def connection_lost(self, exc: Exception | None) -> None:
            closed.set()

    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_read_pipe(_UntilEof, sys.stdin)
    _send(out, {"port": port})
    try:
        await closed.wait()
    finally:
        transport.close()
        await runner.cleanup()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Child entry point: serve until stdin closes; the one argument is the JSON config."""
    args = sys.argv[1:] if argv is None else list(argv)
    # Ctrl-C in a terminal reaches the whole process group; the controller stops this process itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # nothing else may write on the parent's pipe
    root = logging.getLogger()
    root.handlers[:] = [_PipeHandler(out)]
    root.setLevel(logging.INFO)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    config = orjson.loads(args[0])
    loop = new_event_loop()
    try:
        return loop.run_until_complete(_serve(config, out))
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(main())
