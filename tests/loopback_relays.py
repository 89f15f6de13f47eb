"""What sits between a client and the API server on real networks, on loopback: a TCP forwarder (an SSH
tunnel), an HTTP CONNECT proxy and a SOCKS5 proxy (`ssh -D`). Each runs on one background thread's event
loop and records the targets it was asked for, so a test can tell a proxied request from a direct one."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Iterator

__all__ = ["Relays", "loopback_relays", "pipe"]

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _loopback(host: str) -> str:
    # The tests may only reach 127.0.0.0/8; a proxy asked for anything else refuses rather than dials out.
    if not ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
        raise ConnectionRefusedError(f"{host} is not a loopback address")
    return host


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy `reader` to `writer` until EOF or a connection error, then close `writer`."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int) -> None:
    up_reader, up_writer = await asyncio.open_connection(_loopback(host), port)
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


class Relays:
    """Start relays with `forwarder`, `http_proxy`, `socks5_proxy`; `targets[port]` lists what each was asked
    to reach (`host:port`), in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._servers: list[asyncio.Server] = []
        self.targets: dict[int, list[str]] = {}

    def _serve(self, host: str, handler: Callable[[int], Handler]) -> int:
        async def start() -> int:
            port_box: list[int] = []

            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                try:
                    await handler(port_box[0])(reader, writer)
                except (ConnectionError, OSError, asyncio.IncompleteReadError, ValueError):
                    writer.close()

            server = await asyncio.start_server(handle, host, 0)
            port_box.append(server.sockets[0].getsockname()[1])
            self._servers.append(server)
            self.targets[port_box[0]] = []
            return port_box[0]

        return asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)

    def forwarder(self, listen_host: str, target_port: int) -> int:
        """Every connection to `listen_host:<port>` spliced to 127.0.0.1:`target_port`."""

        def handler(port: int) -> Handler:
            async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                self.targets[port].append(f"127.0.0.1:{target_port}")
                await _splice(reader, writer, "127.0.0.1", target_port)

            return forward

        return self._serve(listen_host, handler)

    def http_proxy(self) -> int:
        """An HTTP proxy that only tunnels (`CONNECT host:port`), as corporate proxies do for https."""

        def handler(port: int) -> Handler:
            async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                method, target, _ = (await reader.readline()).decode().split()
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass
                if method != "CONNECT":
                    writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                    writer.close()
                    return
                self.targets[port].append(target)
                host, target_port = target.rsplit(":", 1)
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
                await _splice(reader, writer, host, int(target_port))

            return connect

        return self._serve("127.0.0.1", handler)

    def socks5_proxy(self) -> int:
        """A SOCKS5 proxy without authentication (RFC 1928 CONNECT), as `ssh -D` offers."""

        def handler(port: int) -> Handler:
            async def socks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                _, methods = await reader.readexactly(2)
                await reader.readexactly(methods)
                writer.write(b"\x05\x00")
                _, command, _, kind = await reader.readexactly(4)
                if kind == 1:
                    host = socket.inet_ntoa(await reader.readexactly(4))
                elif kind == 3:
                    host = (await reader.readexactly((await reader.readexactly(1))[0])).decode()
                else:
                    raise ValueError("SOCKS5 address type not supported here")
                (target_port,) = struct.unpack("!H", await reader.readexactly(2))
                if command != 1:
                    raise ValueError("only CONNECT")
                self.targets[port].append(f"{host}:{target_port}")
                writer.write(b"\x05\x00\x00\x01" + socket.inet_aton("127.0.0.1") + struct.pack("!H", 0))
                await writer.drain()
                await _splice(reader, writer, host, target_port)

            return socks

        return self._serve("127.0.0.1", handler)

    def close(self) -> None:
        async def stop() -> None:
            for server in self._servers:
                server.close()
            # End the connections still relaying here, on a running loop: left for the garbage collector
            # after `loop.close()`, their `finally: writer.close()` raised "Event loop is closed".
            current = asyncio.current_task()
            open_relays = [t for t in asyncio.all_tasks() if t is not current]
            for task in open_relays:
                task.cancel()
            await asyncio.gather(*open_relays, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)


@contextlib.contextmanager
def loopback_relays() -> Iterator[Relays]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="loopback-relays", daemon=True)
    thread.start()
    relays = Relays(loop)
    try:
        yield relays
    finally:
        relays.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
