"""Property-based fuzzing of the h2c pass-through: generated HTTP/2 frame sequences against a real router.

Two raw sandboxes (TCP servers that speak first with SETTINGS and record every byte) stand behind a router
with `--enable-h2c`. A client connection sends the preface and a generated sequence: requests opening
streams (HPACK-encoded by a real encoder) that name either sandbox or carry invalid routing headers, in
one HEADERS frame or split into CONTINUATIONs, with padding and priority fields; trailers; DATA; random
frames of every other type; header blocks of garbage; CONTINUATIONs out of place; all cut into 1-3
writes. What must hold for any of them:

* a header block's frames reach only the sandbox its stream's opening block named (never the other one);
* the router logs no error and raises nothing (an exception in a protocol callback is logged by asyncio);
* the router still serves afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import hpack
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from agent_sandbox.router import Router
from tests.helpers import ErrorRecords, fuzz_settings

from .conftest import fresh_ip, still_serving

pytestmark = pytest.mark.integration

FUZZ = fuzz_settings("H2C_FUZZ_EXAMPLES", 100)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, CONTINUATION = 0x0, 0x1, 0x4, 0x9
END_STREAM, END_HEADERS, PADDED, PRIORITY = 0x1, 0x4, 0x8, 0x20


def frame(ftype: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + stream.to_bytes(4, "big") + payload


def parse(data: bytes) -> list[tuple[int, int]]:
    """(type, stream) of every complete frame."""
    out, pos = [], 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos : pos + 3], "big")
        if len(data) - pos < 9 + length:
            break
        out.append((data[pos + 3], int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF))
        pos += 9 + length
    return out


@dataclass
class RawSandbox:
    name: str
    ip: str = field(default_factory=fresh_ip)
    port: int = 0
    connections: list[bytearray] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received = bytearray()
        self.connections.append(received)
        writer.write(frame(SETTINGS, 0, 0, b""))
        try:
            while chunk := await reader.read(65536):
                received.extend(chunk)
        except ConnectionError:
            pass
        writer.close()

    def header_streams(self) -> set[int]:
        """Streams of every HEADERS / CONTINUATION frame this sandbox received."""
        streams: set[int] = set()
        for received in self.connections:
            body = bytes(received[len(PREFACE) :]) if received.startswith(PREFACE) else bytes(received)
            streams |= {s for t, s in parse(body) if t in (HEADERS, CONTINUATION)}
        return streams


@pytest.fixture
async def raw_sandboxes() -> AsyncIterator[dict[str, RawSandbox]]:
    sandboxes = {name: RawSandbox(name) for name in ("alpha", "beta")}
    servers = []
    for sandbox in sandboxes.values():
        server = await asyncio.start_server(sandbox.serve, sandbox.ip, 0)
        sandbox.port = server.sockets[0].getsockname()[1]
        servers.append(server)
    try:
        yield sandboxes
    finally:
        for server in servers:
            server.close()


@pytest.fixture
async def h2c_router(start_router: Callable[..., Awaitable[Router]]) -> Router:
    return await start_router("--enable-h2c", "--upstream-max-retries=0")


@dataclass
class Plan:
    wire: bytes
    cuts: list[int]
    opening: dict[int, str]
    """stream -> the sandbox its opening block named ("" for none or an invalid one)"""


@st.composite
def plans(draw: st.DrawFn, sandboxes: dict[str, RawSandbox]) -> Plan:
    encoder = hpack.Encoder()
    opening: dict[int, str] = {}
    next_stream = 1
    out = [PREFACE, frame(SETTINGS, 0, 0, b"")]
    if draw(st.booleans()):
        out.append(frame(SETTINGS, 0x1, 0, b""))  # ACK of the router's SETTINGS
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(
            st.sampled_from(["open", "open", "open", "trailers", "data", "frame", "garbage", "stray"])
        )
        if kind == "open":
            target = draw(st.sampled_from(["alpha", "beta", "alpha", "beta", "", "BAD"]))
            headers = [(":method", "POST"), (":scheme", "http"), (":path", "/p"), (":authority", "r")]
            if target:
                sandbox = sandboxes.get(target)
                headers += [("x-sandbox-id", target.lower())]
                if sandbox is not None:
                    headers += [("x-sandbox-pod-ip", sandbox.ip), ("x-sandbox-port", str(sandbox.port))]
                else:
                    headers += [("x-sandbox-pod-ip", "169.254.169.254")]
            block = encoder.encode(headers)
            stream = next_stream
            next_stream += 2
            opening[stream] = target if target in sandboxes else ""
            flags = END_STREAM if draw(st.booleans()) else 0
            prefix = b""
            if draw(st.booleans()):
                flags |= PRIORITY
                prefix = b"\x00\x00\x00\x00\x10"
            pad = draw(st.integers(0, 3)) if draw(st.booleans()) else None
            if pad is not None:
                flags |= PADDED
                prefix = bytes([pad]) + prefix
            split = draw(st.integers(0, len(block)))
            if draw(st.booleans()) and 0 < split < len(block):
                out.append(frame(HEADERS, flags, stream, prefix + block[:split] + b"\x00" * (pad or 0)))
                out.append(frame(CONTINUATION, END_HEADERS, stream, block[split:]))
            else:
                out.append(frame(HEADERS, flags | END_HEADERS, stream, prefix + block + b"\x00" * (pad or 0)))
        elif kind == "trailers" and opening:
            stream = draw(st.sampled_from(sorted(opening)))
            block = encoder.encode([("x-trailer", "t")])
            out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream, block))
        elif kind == "data":
            stream = draw(st.sampled_from([0, *sorted(opening), next_stream]))
            out.append(
                frame(DATA, draw(st.sampled_from([0, END_STREAM])), stream, draw(st.binary(max_size=30)))
            )
        elif kind == "frame":
            ftype = draw(st.integers(0, 255).filter(lambda t: t not in (HEADERS, CONTINUATION)))
            stream = draw(st.sampled_from([0, 1, 2, 3, 0x7FFFFFFF]))
            out.append(frame(ftype, draw(st.integers(0, 255)), stream, draw(st.binary(max_size=20))))
        elif kind == "garbage":
            # a block the router cannot decode (or decodes to nonsense): it must end the connection, not
            # guess a stream's target; the encoder's table is now out of step, so this is the last frame
            out.append(frame(HEADERS, END_HEADERS, next_stream, draw(st.binary(min_size=1, max_size=20))))
            opening[next_stream] = ""
            break
        elif kind == "stray":
            # a CONTINUATION that continues nothing, carrying a block that names a sandbox
            block = hpack.Encoder().encode([("x-sandbox-id", "beta")])
            out.append(frame(CONTINUATION, END_HEADERS, draw(st.sampled_from([1, next_stream])), block))
    wire = b"".join(out)
    cuts = sorted(draw(st.lists(st.integers(1, len(wire) - 1), max_size=2)))
    return Plan(wire, cuts, opening)


@FUZZ
@given(data=st.data())
async def test_generated_frame_sequences(
    h2c_router: Router, raw_sandboxes: dict[str, RawSandbox], data: st.DataObject
) -> None:
    plan = data.draw(plans(raw_sandboxes))
    for sandbox in raw_sandboxes.values():
        sandbox.connections.clear()
    with ErrorRecords() as errors:
        reader, writer = await asyncio.open_connection("127.0.0.1", h2c_router.http_port)
        try:
            for start, end in zip([0, *plan.cuts], [*plan.cuts, len(plan.wire)], strict=True):
                writer.write(plan.wire[start:end])
                try:
                    await writer.drain()
                except ConnectionError:  # the router ended the connection at an earlier part
                    break
                await asyncio.sleep(0)
            closed = False
            while True:  # until the router closes or goes quiet (it relays to a sandbox within that)
                try:
                    async with asyncio.timeout(0.15):
                        if not await reader.read(65536):
                            closed = True
                            break
                except TimeoutError:
                    break
                except ConnectionError:  # closed with our bytes unread: a reset
                    closed = True
                    break
            event("closed by the router" if closed else "left open")
        finally:
            writer.close()
        await asyncio.sleep(0.05)
    for name, sandbox in raw_sandboxes.items():
        wrong = {s for s in sandbox.header_streams() if plan.opening.get(s) != name}
        assert not wrong, (name, wrong, plan)
        if sandbox.header_streams():
            event(f"reached {name}")
    assert not errors.records, errors.messages
    await still_serving(h2c_router)
