"""Helpers for runtime tests: a typed gRPC client built from our messages, and process leak probes."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import AsyncIterator
from typing import Any

from grpc import aio

from agent_sandbox.api import processv1 as pb


class ProcessClient:
    """process.v1.ProcessService over a grpc.aio channel (our generated messages)."""

    def __init__(self, channel: aio.Channel) -> None:
        def unary(name: str) -> Any:
            path, req, resp, _ = pb.METHODS[name]
            return channel.unary_unary(
                path, request_serializer=req.SerializeToString, response_deserializer=resp.FromString
            )

        path, req, resp, _ = pb.METHODS["Start"]
        self._start = channel.unary_stream(
            path, request_serializer=req.SerializeToString, response_deserializer=resp.FromString
        )
        self.execute_call = unary("Execute")
        self.write_stdin_call = unary("WriteStdin")
        self.send_signal_call = unary("SendSignal")
        self.resize_call = unary("ResizeTTY")
        self.raw_execute = channel.unary_unary(pb.METHODS["Execute"][0])

    async def execute(self, *command: str, timeout: float = 30, **config: Any) -> pb.ExecuteResponse:
        req = pb.ExecuteRequest(config=pb.ProcessConfig(command=list(command), **config))
        resp: pb.ExecuteResponse = await self.execute_call(req, timeout=timeout)
        return resp

    def start(
        self, *command: str, pty: tuple[int, int] | None = None, timeout: float = 30, **config: Any
    ) -> Any:
        req = pb.StartRequest(config=pb.ProcessConfig(command=list(command), **config))
        if pty is not None:
            req.pty.CopyFrom(pb.PTY(cols=pty[0], rows=pty[1]))
        return self._start(req, timeout=timeout)

    async def events(self, call: Any) -> AsyncIterator[pb.StartResponse]:
        async for event in call:
            yield event


def leaked_processes(root: str) -> list[tuple[int, str]]:
    """Live processes whose working directory is inside `root` (pid, command line)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and (cwd == root or cwd.startswith(root + "/")):
            found.append((int(entry), cmd))
    return found


def zombie_children(parent: int | None = None) -> list[int]:
    """Zombie processes whose parent is `parent` (default: this process)."""
    ppid = os.getpid() if parent is None else parent
    zombies = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == ppid:
            zombies.append(int(entry))
    return zombies


def make_special_files(root: str) -> None:
    """A FIFO and a Unix socket named `fifo` and `sock` in `root`."""
    os.mkfifo(os.path.join(root, "fifo"))
    # A socket's path is limited to 108 bytes: bound in a short directory, then moved (it stays a socket).
    short = tempfile.mkdtemp(prefix="s")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(os.path.join(short, "s"))
        os.rename(os.path.join(short, "s"), os.path.join(root, "sock"))
    os.rmdir(short)
