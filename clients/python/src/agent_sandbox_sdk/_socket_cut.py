"""Waking the calls blocked on a sync client's sockets when another thread closes the client.

Closing a socket's descriptor does not wake a thread blocked in `poll()` on it (Linux): the call waited
on until an answer came - and when a new connection took the freed descriptor number first, it then
waited on that unrelated socket until its read timeout. `shutdown()` wakes every blocked read at once
(the peer sees the connection end too). httpx2 has no hook for it, so each pool's network backend (the
public `httpcore2.NetworkBackend` interface) is wrapped to remember the streams it opened, and
`cut_sockets` shuts them down before the client closes them.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore2
import httpx2

__all__ = ["cut_sockets", "track_sockets"]


class _TrackedStream(httpcore2.NetworkStream):
    """A stream whose TLS upgrade is remembered too (it wraps the same descriptor in a new socket), and whose
    `close()` by another thread waits for the read or write in flight to return.

    OpenSSL keeps the descriptor's number: a TLS read woken by `shutdown()` whose descriptor was closed - and
    its number taken by a new connection - before it ran read from that other socket (until its timeout)."""

    __slots__ = ("_backend", "_busy", "_closing", "_inner", "_lock")

    def __init__(self, inner: httpcore2.NetworkStream, backend: _TrackingBackend) -> None:
        self._inner = inner
        self._backend = backend
        self._lock = threading.Lock()
        self._busy = 0
        self._closing = False

    def _enter(self) -> None:
        with self._lock:
            self._busy += 1

    def _leave(self) -> None:
        with self._lock:
            self._busy -= 1
            close = self._closing and not self._busy
        if close:
            self._inner.close()

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._enter()
        try:
            return self._inner.read(max_bytes, timeout)
        finally:
            self._leave()

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._enter()
        try:
            self._inner.write(buffer, timeout)
        finally:
            self._leave()

    def close(self) -> None:
        with self._lock:
            self._closing = bool(self._busy)
        if not self._closing:
            self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.NetworkStream:
        return self._backend.remember(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _TrackingBackend(httpcore2.NetworkBackend):
    """Opens connections through `inner`, remembering their streams until `cut()`; refuses new ones after."""

    def __init__(self, inner: httpcore2.NetworkBackend) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._streams: weakref.WeakSet[httpcore2.NetworkStream] = weakref.WeakSet()
        self._cut = False

    def remember(self, stream: httpcore2.NetworkStream) -> httpcore2.NetworkStream:
        tracked = _TrackedStream(stream, self)
        with self._lock:
            cut = self._cut
            self._streams.add(tracked)
        if cut:  # opened by a call that raced the close: it must not wait on a socket nobody will close
            _shut_down(tracked)
        return tracked

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        return self.remember(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.NetworkStream:
        return self.remember(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)

    def cut(self) -> None:
        """Shut down every stream still open (a closed or TLS-detached socket is skipped by the kernel's EBADF)."""
        with self._lock:
            self._cut = True
            streams = list(self._streams)
        for stream in streams:
            _shut_down(stream)


def _shut_down(stream: httpcore2.NetworkStream) -> None:
    sock = stream.get_extra_info("socket")
    if isinstance(sock, socket.socket):
        # socket.socket's own shutdown: SSLSocket.shutdown would also drop its SSL object under a reader.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _pools(client: httpx2.Client) -> Iterator[Any]:
    # httpx2 keeps the default transport and the proxy mounts privately; a transport without a pool (a test's
    # MockTransport) has no sockets.
    transports = [getattr(client, "_transport", None), *getattr(client, "_mounts", {}).values()]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        if isinstance(pool, httpcore2.ConnectionPool):
            yield pool


def track_sockets(client: httpx2.Client) -> httpx2.Client:
    """Wrap the network backend of each of `client`'s pools (before its first request) so that
    `cut_sockets` can reach their sockets; returns `client`."""
    for pool in _pools(client):
        backend = pool._network_backend
        # A pool wrapped before (a transport given to several clients) gets a fresh wrapper, not a second layer,
        # and not one a close() already cut (it refuses every connection).
        inner = backend._inner if isinstance(backend, _TrackingBackend) else backend
        pool._network_backend = _TrackingBackend(inner)
    return client


def cut_sockets(client: httpx2.Client) -> None:
    """Shut down the sockets of a client `track_sockets` wrapped, waking the calls blocked on them; the
    client's pools open no new connection afterwards (close the client next)."""
    for pool in _pools(client):
        backend = pool._network_backend
        if isinstance(backend, _TrackingBackend):
            backend.cut()
