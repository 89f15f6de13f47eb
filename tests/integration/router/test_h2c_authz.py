"""h2c credentials: `authorization` never reaches the sandbox, and every stream is authorized with its own.

Router spec §1.2/§1.5: the `Authorization` header is consumed by authz and never forwarded. HTTP/1.1 drops it;
h2c relayed the client's header blocks unchanged, so a caller's bearer token (a ServiceAccount token in
tokenreview mode, usable against the API server) reached the untrusted sandbox. The router now re-encodes
every client->sandbox header block without it (docs/design/router-h2c-hpack.md).

And a stream without a valid credential was authorized with a later stream's credential when both arrived
in one read (the connection's check ran after every block of the read was handled, with whatever credential
the last accepted stream carried).

Real router in-process, real grpcio sandboxes and raw-frame sandboxes that decode what reaches them. The
scoped-token tests name the sandbox only (scoped tokens forbid X-Sandbox-Pod-IP): the router's Pod cache
resolves a real Sandbox default/alpha on the dev cluster (real controller, kwok pod) to its pod IP, where the
test's server listens.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import hpack
import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import POD, SANDBOX, ApiClient, NotFound, ResourceKind
from agent_sandbox.router import Router, mint_scoped_token
from tests.helpers import eventually, is_ready

from .conftest import fresh_ip, with_identity
from .test_h2c_pinning import OWN_CONNECTION, PREFACE, frame, frames

pytestmark = pytest.mark.integration

HEADERS, DATA, SETTINGS, GOAWAY, CONTINUATION = 0x1, 0x0, 0x4, 0x7, 0x9
END_STREAM, END_HEADERS, PADDED, PRIORITY = 0x1, 0x4, 0x8, 0x20
SECRET = b"s" * 40
MAX_FRAME = 16384


class MetadataSandbox:
    """A real gRPC server on its own loopback address that records the metadata of every call."""

    def __init__(
        self, name: str, options: list[tuple[str, Any]] | None = None, *, ip: str | None = None, port: int = 0
    ) -> None:
        self.name = name
        self.ip = ip or fresh_ip()
        self.seen: list[dict[str, str | bytes]] = []
        self.server = grpc.aio.server(options=options)
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "echo.Echo",
                    {
                        "Who": grpc.unary_unary_rpc_method_handler(self._who),
                        "Count": grpc.unary_stream_rpc_method_handler(self._count),
                    },
                ),
            )
        )
        self.port = self.server.add_insecure_port(f"{self.ip}:{port}")

    def _record(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.seen.append({k: v for k, v in context.invocation_metadata() or ()})

    async def _who(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        self._record(context)
        return self.name.encode()

    async def _count(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        self._record(context)
        for i in range(int(request)):
            await asyncio.sleep(0.05)
            yield f"{self.name} {i}".encode()

    def metadata(self, pod_ip: bool = True) -> tuple[tuple[str, str], ...]:
        routing = [("x-sandbox-id", self.name), ("x-sandbox-port", str(self.port))]
        if pod_ip:
            routing.append(("x-sandbox-pod-ip", self.ip))
        return tuple(routing)


@pytest.fixture
async def sandbox() -> AsyncIterator[MetadataSandbox]:
    server = MetadataSandbox("alpha")
    await server.server.start()
    try:
        yield server
    finally:
        await server.server.stop(None)


class DecodingSandbox:
    """A raw h2c sandbox that advertises a zero-size HPACK table (or `table_size`) and decodes every header
    block it receives, as an HTTP/2 server would: (stream, HEADERS flags, headers) per block, and every
    frame's length."""

    def __init__(self, table_size: int = 0) -> None:
        self.ip = fresh_ip()
        self.port = 0
        self.table_size = table_size
        self.server: asyncio.Server | None = None
        self.received = bytearray()
        self.decoder = hpack.Decoder()
        # SETTINGS_HEADER_TABLE_SIZE 0, in effect once acknowledged (RFC 9113 6.5.3: `_serve` lowers the
        # limit at the ACK); the router's re-encoded blocks must decode under it.
        self.blocks: list[tuple[int, int, list[tuple[bytes, bytes]]]] = []
        self.frame_lengths: list[int] = []
        self.errors: list[BaseException] = []
        self.changed = asyncio.Event()
        self._pos = len(PREFACE)

    async def __aenter__(self) -> DecodingSandbox:
        self.server = await asyncio.start_server(self._serve, self.ip, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frame(SETTINGS, 0, 0, (0x1).to_bytes(2, "big") + self.table_size.to_bytes(4, "big")))
        block, first_flags, block_stream = b"", 0, 0
        while chunk := await reader.read(65536):
            self.received.extend(chunk)
            data = bytes(self.received)
            while len(data) - self._pos >= 9:
                length = int.from_bytes(data[self._pos : self._pos + 3], "big")
                if len(data) - self._pos < 9 + length:
                    break
                ftype, flags = data[self._pos + 3], data[self._pos + 4]
                stream = int.from_bytes(data[self._pos + 5 : self._pos + 9], "big")
                payload = data[self._pos + 9 : self._pos + 9 + length]
                self._pos += 9 + length
                self.frame_lengths.append(length)
                if ftype == SETTINGS and flags & 0x1:
                    self.decoder.max_allowed_table_size = self.table_size
                if ftype == HEADERS:
                    start, end = 0, len(payload)
                    if flags & PADDED:
                        start, end = 1, end - payload[0]
                    if flags & PRIORITY:
                        start += 5
                    block, first_flags, block_stream = payload[start:end], flags, stream
                elif ftype == CONTINUATION:
                    block += payload
                else:
                    continue
                if flags & END_HEADERS:
                    try:
                        decoded = self.decoder.decode(block, raw=True)
                    except Exception as exc:  # what the sandbox's HTTP/2 stack would fail on
                        self.errors.append(exc)
                        decoded = []
                    self.blocks.append(
                        (block_stream, first_flags, [(bytes(k), bytes(v)) for k, v in decoded])
                    )
            self.changed.set()
        writer.close()

    async def wait_blocks(self, n: int) -> None:
        async with asyncio.timeout(10):
            while len(self.blocks) < n:
                self.changed.clear()
                await self.changed.wait()

    def routing(self) -> list[tuple[str, str]]:
        return [("x-sandbox-id", "alpha"), ("x-sandbox-pod-ip", self.ip), ("x-sandbox-port", str(self.port))]


def _request(extra: list[tuple[str, str]] = []) -> list[tuple[str, str]]:  # noqa: B006 - never mutated
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/echo.Echo/Who"),
        (":authority", "router"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]


# ------------------------------------------------------------------------- authorization is never forwarded


@pytest.fixture
async def h2c_router(start_router: Callable[..., Awaitable[Router]]) -> Router:
    return await start_router("--enable-h2c")


async def test_authorization_never_reaches_a_grpc_sandbox(
    h2c_router: Router, sandbox: MetadataSandbox
) -> None:
    """The probe that found it: grpcio calls with `authorization` metadata, the sandbox printed the token.
    Several calls on one connection (the client's HPACK encoder indexes the header after the first) and a
    streaming one; every other piece of metadata arrives as sent."""
    target = f"127.0.0.1:{h2c_router.http_port}"
    metadata = (*sandbox.metadata(), ("authorization", "Bearer secret-token"), ("x-keep", "kept"))
    async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
        who = channel.unary_unary("/echo.Echo/Who")
        for _ in range(3):
            assert await who(b"", metadata=metadata, timeout=10) == b"alpha"
        answers = await asyncio.gather(*(who(b"", metadata=metadata, timeout=10) for _ in range(5)))
        assert answers == [b"alpha"] * 5
        count = channel.unary_stream("/echo.Echo/Count")(b"3", metadata=metadata, timeout=10)
        assert [m async for m in count] == [b"alpha 0", b"alpha 1", b"alpha 2"]
        binary = (*metadata, ("trace-bin", b"\x00\x80\xff"))
        assert await who(b"", metadata=binary, timeout=10) == b"alpha"
    assert len(sandbox.seen) == 10
    for seen in sandbox.seen:
        assert "authorization" not in seen, seen
        assert seen["x-keep"] == "kept"
        assert seen["x-sandbox-id"] == "alpha"
    assert sandbox.seen[-1]["trace-bin"] == b"\x00\x80\xff"


async def test_header_blocks_reach_the_sandbox_re_encoded_without_credentials(h2c_router: Router) -> None:
    """Byte-level: padded and prioritised HEADERS split over CONTINUATIONs, a block that outgrows the
    default frame size once re-encoded (the client indexed it, the router may not: the sandbox's table size is
    0), and trailers: the sandbox decodes every block, sees neither `authorization` nor `proxy-authorization` (nor headers HTTP/2 forbids)
    in any of them, the rest in order, END_STREAM where the client put it, and no frame over 16384 bytes."""
    async with DecodingSandbox() as sandbox:
        encoder = hpack.Encoder()
        first = _request(
            [
                *sandbox.routing(),
                ("authorization", "Bearer secret-token"),
                ("proxy-authorization", "Basic c2VjcmV0"),
                ("connection", "keep-alive"),
                ("x-after", "1"),
            ]
        )
        block1 = encoder.encode(first)
        priority = (3).to_bytes(4, "big") + b"\x10"  # depends on stream 3, weight 17
        pad = 7
        head = bytes((pad,)) + priority + block1[:40] + b"\x00" * pad
        stream1 = frame(HEADERS, PADDED | PRIORITY, 1, head) + frame(
            CONTINUATION, END_HEADERS, 1, block1[40:]
        )
        # The same headers again and one big header eight times: the client's encoder sends it once and
        # then refers to it in its table, the router's may not (the sandbox allows no table), so this block
        # re-encoded is over 16384 bytes.
        second = [*first, *[("x-rep", "v" * 3000)] * 8]
        block3 = encoder.encode(second)
        assert len(block3) < 4000
        stream3 = frame(HEADERS, END_HEADERS, 3, block3)
        trailers = frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            3,
            encoder.encode([("x-trailer", "t"), ("authorization", "Bearer secret-token")]),
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", h2c_router.http_port)
        try:
            writer.write(PREFACE + frame(SETTINGS, 0, 0, b"") + stream1 + frame(DATA, END_STREAM, 1, b"x"))
            await writer.drain()
            await sandbox.wait_blocks(1)
            await _read_until_settings(reader)  # the sandbox's, past the router: its table size is known
            writer.write(stream3 + frame(DATA, 0, 3, b"y") + trailers)
            await writer.drain()
            await sandbox.wait_blocks(3)
            await asyncio.sleep(0.2)
        finally:
            writer.close()
    assert not sandbox.errors, sandbox.errors
    blocks = [(stream, headers) for stream, _, headers in sandbox.blocks]
    forbidden = {b"authorization", b"proxy-authorization", b"connection"}

    def kept(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
        return [(k.encode(), v.encode()) for k, v in headers if k.encode() not in forbidden]

    assert blocks == [(1, kept(first)), (3, kept(second)), (3, [(b"x-trailer", b"t")])]
    assert [flags & (END_STREAM | PRIORITY) for _, flags, _ in sandbox.blocks] == [PRIORITY, 0, END_STREAM]
    assert max(sandbox.frame_lengths) <= MAX_FRAME
    assert sum(sandbox.frame_lengths) > MAX_FRAME  # the big block was split, not cut
    assert not sandbox.decoder.header_table.dynamic_entries  # the router's table follows the sandbox's 0


async def _read_until_settings(reader: asyncio.StreamReader) -> None:
    """Read the router's frames until a SETTINGS frame with a payload (the sandbox's; the router's is empty)."""
    seen = b""
    async with asyncio.timeout(10):
        while not any(t == SETTINGS and p for t, _, _, p in frames(seen)):
            chunk = await reader.read(65536)
            assert chunk
            seen += chunk


async def test_trailers_of_an_accepted_stream_are_forwarded_after_a_refusal(h2c_router: Router) -> None:
    """The router's blocks leave no HPACK state in the sandbox, so a refused stream's block (never forwarded)
    cannot make a later one decode wrongly: the trailers of a stream accepted before the refusal reach the
    sandbox and the connection stays up (it used to be ended for them)."""
    async with DecodingSandbox() as sandbox:
        encoder = hpack.Encoder()
        other = [("x-sandbox-id", "beta"), ("x-sandbox-pod-ip", fresh_ip()), ("x-sandbox-port", "1")]
        reader, writer = await asyncio.open_connection("127.0.0.1", h2c_router.http_port)
        try:
            writer.write(
                PREFACE
                + frame(SETTINGS, 0, 0, b"")
                + frame(HEADERS, END_HEADERS, 1, encoder.encode(_request(sandbox.routing())))
                + frame(HEADERS, END_HEADERS | END_STREAM, 3, encoder.encode(_request(other)))
            )
            await writer.drain()
            got = await _read_until_goaway(reader)
            goaway = next(p for t, _, _, p in got if t == GOAWAY)
            assert int.from_bytes(goaway[:4], "big") == 1
            writer.write(
                frame(DATA, 0, 1, b"x")
                + frame(HEADERS, END_HEADERS | END_STREAM, 1, encoder.encode([("x-trailer", "t")]))
            )
            await writer.drain()
            await sandbox.wait_blocks(2)
            await asyncio.sleep(0.2)
            assert not writer.is_closing()
            assert await _still_open(reader)
        finally:
            writer.close()
    assert not sandbox.errors, sandbox.errors
    assert [(stream, flags & END_STREAM) for stream, flags, _ in sandbox.blocks] == [(1, 0), (1, END_STREAM)]
    assert sandbox.blocks[1][2] == [(b"x-trailer", b"t")]


async def _still_open(reader: asyncio.StreamReader) -> bool:
    try:
        async with asyncio.timeout(0.3):
            return await reader.read(65536) != b""
    except TimeoutError:
        return True


# ------------------------------------------------------------------ each stream with its own credential


ALPHA_NAMESPACE = "default"  # the scoped tokens are minted for default/alpha
ALPHA_PORT = 19090  # a port the dev cluster's runner never binds


async def _gone(kube: ApiClient, kind: ResourceKind, name: str) -> bool:
    try:
        await kube.get(kind, name, namespace=ALPHA_NAMESPACE)
    except NotFound:
        return True
    return False


@pytest.fixture
async def alpha(cluster: DevCluster, controller: Started, kube: ApiClient) -> AsyncIterator[str]:
    """A real Sandbox default/alpha, made by the real controller: a bare Sandbox (a pod template whose image
    is no runtime's, so the runner serves nothing there) whose pod kwok starts on a 127.x address. Its pod IP,
    where the test's server listens (at `ALPHA_PORT`); the Sandbox and its pod are gone after the test."""
    body = {
        "apiVersion": SANDBOX.api_version,
        "kind": "Sandbox",
        "metadata": {"name": "alpha"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}},
    }
    await kube.create(SANDBOX, body, namespace=ALPHA_NAMESPACE)
    try:

        async def ready_ip() -> str | None:
            sandbox = await kube.get(SANDBOX, "alpha", namespace=ALPHA_NAMESPACE)
            ips = (sandbox.get("status") or {}).get("podIPs") or []
            return str(ips[0]) if is_ready(sandbox) and ips else None

        ip = await eventually(ready_ip, "Sandbox default/alpha Ready with a pod IP", within=60)
        assert ip.startswith("127."), ip
        yield ip
    finally:
        await kube.delete(SANDBOX, "alpha", namespace=ALPHA_NAMESPACE)

        async def both_gone() -> bool:
            return await _gone(kube, SANDBOX, "alpha") and await _gone(kube, POD, "alpha")

        await eventually(both_gone, "Sandbox default/alpha and its pod deleted", within=60)


@pytest.fixture
async def alpha_server(alpha: str) -> AsyncIterator[MetadataSandbox]:
    """`sandbox`, listening on the real Sandbox alpha's pod IP."""
    server = MetadataSandbox("alpha", ip=alpha, port=ALPHA_PORT)
    await server.server.start()
    try:
        yield server
    finally:
        await server.server.stop(None)


@pytest.fixture
async def scoped(
    start_router: Callable[..., Awaitable[Router]], cluster: DevCluster, alpha: str, tmp_path: Path
) -> Callable[[Any], Awaitable[Router]]:
    """A scoped-token h2c router with its Pod cache (scoped tokens forbid X-Sandbox-Pod-IP): it resolves the
    real Sandbox default/alpha by name to its pod IP, where the given server listens."""

    async def start(server: Any) -> Router:
        assert (server.ip, server.port) == (alpha, ALPHA_PORT), "the server must listen on alpha's pod IP"
        secret = tmp_path / "secret"
        secret.write_bytes(SECRET)
        router = await start_router(
            *with_identity(
                cluster,
                "--enable-h2c",
                "--authz-mode=scoped-token",
                f"--authz-scoped-token-secret-file={secret}",
                "--cache-enabled",
            )
        )
        assert router.proxy is not None
        router.proxy.settings.max_retries = 0
        return router

    return start


def _token(name: str = "alpha") -> str:
    return "Bearer " + mint_scoped_token(SECRET, "default", name, 600)


class RecordingByName:
    """A raw h2c sandbox reached by name: sends SETTINGS, records the HEADERS frames it receives."""

    def __init__(self, ip: str, port: int) -> None:
        self.ip = ip
        self.port = port
        self.received = bytearray()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> RecordingByName:
        self.server = await asyncio.start_server(self._serve, self.ip, self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frame(SETTINGS, 0, 0, b""))
        while chunk := await reader.read(65536):
            self.received.extend(chunk)
        writer.close()

    def streams(self) -> list[int]:
        """The streams whose HEADERS reached this sandbox."""
        return [s for t, _, s, _ in frames(bytes(self.received[len(PREFACE) :])) if t == HEADERS]


def _named(sandbox: RecordingByName, encoder: hpack.Encoder, stream: int, authorization: str | None) -> bytes:
    extra = [("x-sandbox-id", "alpha"), ("x-sandbox-port", str(sandbox.port))]
    if authorization is not None:
        extra.append(("authorization", authorization))
    block = encoder.encode(_request(extra))
    return frame(HEADERS, END_HEADERS, stream, block) + frame(DATA, END_STREAM, stream, b"\x00" * 5)


async def _read_until_goaway(reader: asyncio.StreamReader) -> list[tuple[int, int, int, bytes]]:
    seen = b""
    async with asyncio.timeout(10):
        while not any(t == GOAWAY for t, *_ in frames(seen)):
            chunk = await reader.read(65536)
            if not chunk:
                break
            seen += chunk
    return frames(seen)


@pytest.mark.parametrize(
    ("credential", "grpc_status"),
    [(None, b"16"), ("Bearer garbage", b"16"), ("other", b"7")],
    ids=["none", "garbage", "other-sandbox"],
)
async def test_a_stream_is_not_authorized_by_a_later_streams_credential(
    scoped: Callable[[Any], Awaitable[Router]], alpha: str, credential: str | None, grpc_status: bytes
) -> None:
    """The probe: one write with the preface, stream 1 without a valid credential and stream 3 with a valid
    one. Stream 1 ran in the sandbox (checked with stream 3's token). It is refused with its own verdict
    (UNAUTHENTICATED, or PERMISSION_DENIED for a token of another sandbox) and nothing reaches the sandbox;
    the GOAWAY names stream 1, so the client retries stream 3 on a new connection."""
    async with RecordingByName(alpha, ALPHA_PORT) as sandbox:
        router = await scoped(sandbox)
        encoder = hpack.Encoder()
        auth = _token("other") if credential == "other" else credential
        reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
        try:
            writer.write(
                PREFACE
                + frame(SETTINGS, 0, 0, b"")
                + _named(sandbox, encoder, 1, auth)
                + _named(sandbox, encoder, 3, _token())
            )
            await writer.drain()
            got = await _read_until_goaway(reader)
        finally:
            writer.close()
        # the router's own refusal: a fresh encoder per answer
        answers = [
            [(str(k), str(v)) for k, v in hpack.Decoder().decode(p)]
            for t, _, s, p in got
            if t == HEADERS and s == 1
        ]
        assert answers, got
        assert ("grpc-status", grpc_status.decode()) in answers[0], answers
        goaway = next(p for t, _, _, p in got if t == GOAWAY)
        assert int.from_bytes(goaway[:4], "big") == 1
        await asyncio.sleep(0.3)
        assert sandbox.streams() == []


async def test_a_later_stream_without_a_credential_is_refused_while_the_first_runs(
    scoped: Callable[[Any], Awaitable[Router]], alpha: str
) -> None:
    """The converse, in one write: stream 1 with a valid token reaches the sandbox, stream 3 without one does
    not (GOAWAY naming stream 1)."""
    async with RecordingByName(alpha, ALPHA_PORT) as sandbox:
        router = await scoped(sandbox)
        encoder = hpack.Encoder()
        reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
        try:
            writer.write(
                PREFACE
                + frame(SETTINGS, 0, 0, b"")
                + _named(sandbox, encoder, 1, _token())
                + _named(sandbox, encoder, 3, None)
            )
            await writer.drain()
            got = await _read_until_goaway(reader)
            goaway = next(p for t, _, _, p in got if t == GOAWAY)
            assert int.from_bytes(goaway[:4], "big") == 1

            async def reached() -> bool:
                return bool(sandbox.streams())

            await eventually(reached, "stream 1 at the sandbox", within=10, interval=0.05)
            await asyncio.sleep(0.3)
            assert sandbox.streams() == [1]
        finally:
            writer.close()


async def test_concurrent_grpc_calls_are_each_authorized_with_their_own_credential(
    scoped: Callable[[Any], Awaitable[Router]], alpha_server: MetadataSandbox
) -> None:
    """grpcio, two concurrent calls on a fresh channel, one without a token: it fails UNAUTHENTICATED
    whichever call opens the connection; the other is served."""
    sandbox = alpha_server
    router = await scoped(sandbox)
    target = f"127.0.0.1:{router.http_port}"
    for _ in range(5):
        async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
            who = channel.unary_unary("/echo.Echo/Who")
            bare: object
            authorized: object
            bare, authorized = await asyncio.gather(
                who(b"", metadata=sandbox.metadata(pod_ip=False), timeout=10),
                who(b"", metadata=(*sandbox.metadata(pod_ip=False), ("authorization", _token())), timeout=10),
                return_exceptions=True,
            )
        assert isinstance(bare, grpc.aio.AioRpcError), bare
        assert bare.code() == grpc.StatusCode.UNAUTHENTICATED
        assert authorized == b"alpha"
    assert len(sandbox.seen) == 5
    assert all("authorization" not in seen for seen in sandbox.seen)
