"""HTTPS listener, mTLS modes and certificate hot reload (router spec §1.11)."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from cryptography import x509

from agent_sandbox.devcluster.certs import make_ca, make_leaf
from agent_sandbox.kube.x509 import Issuer, PrivateKey, cert_pem, key_pem
from agent_sandbox.router import Router
from tests.helpers import eventually

from .conftest import Backend

pytestmark = pytest.mark.integration


def write_pair(directory: Path, name: str, cert: x509.Certificate, key: PrivateKey) -> tuple[Path, Path]:
    crt, k = directory / f"{name}.crt", directory / f"{name}.key"
    crt.write_bytes(cert_pem(cert))
    k.write_bytes(key_pem(key))
    return crt, k


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca_cert, ca_key = make_ca("router-test-ca")
    ca = Issuer(ca_cert, ca_key)
    files = {"ca": tmp_path / "ca.crt"}
    files["ca"].write_bytes(cert_pem(ca_cert))
    leaves = {
        "server": make_leaf(ca, common_name="router", server=True, ips=("127.0.0.1",)),
        "server2": make_leaf(ca, common_name="router-rotated", server=True, ips=("127.0.0.1",)),
        "client": make_leaf(ca, common_name="alice", client=True),
    }
    for name, (cert, key) in leaves.items():
        files[f"{name}_crt"], files[f"{name}_key"] = write_pair(tmp_path, name, cert, key)
    # The router watches these paths; they are swapped in place later.
    live = tmp_path / "live"
    live.mkdir()
    files["live_crt"], files["live_key"] = live / "tls.crt", live / "tls.key"
    files["live_crt"].write_bytes(files["server_crt"].read_bytes())
    files["live_key"].write_bytes(files["server_key"].read_bytes())
    return files


def tls_flags(pki: dict[str, Path], *, mtls: str = "off") -> list[str]:
    """An HTTPS listener on the live (watched) certificate pair; client CA only with mTLS."""
    flags = [
        "--https-bind-address=127.0.0.1:0",
        f"--tls-cert-file={pki['live_crt']}",
        f"--tls-key-file={pki['live_key']}",
    ]
    if mtls != "off":
        flags += [f"--tls-client-ca-file={pki['ca']}", f"--mtls-mode={mtls}"]
    return flags


def client_context(pki: dict[str, Path], *, with_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if with_cert:
        ctx.load_cert_chain(str(pki["client_crt"]), str(pki["client_key"]))
    return ctx


async def https_get(port: int, ctx: ssl.SSLContext, headers: dict[str, str]) -> tuple[bytes, str]:
    """One GET over TLS; returns (status line, server certificate CN)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1")
    try:
        cert = writer.get_extra_info("ssl_object").getpeercert()
        cn = dict(x[0] for x in cert["subject"])["commonName"]
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(f"GET /tls HTTP/1.1\r\nHost: r\r\nConnection: close\r\n{lines}\r\n".encode())
        data = await asyncio.wait_for(reader.read(), 10)
        return data.split(b"\r\n", 1)[0], cn
    finally:
        writer.close()


async def test_https_with_required_client_certs(
    start_router: Callable[..., Awaitable[Router]], backend: Backend, pki: dict[str, Path], tmp_path: Path
) -> None:
    router = await start_router(*tls_flags(pki, mtls="required"))
    port = router.https_port or 0
    status, cn = await https_get(port, client_context(pki, with_cert=True), backend.headers())
    assert (status, cn) == (b"HTTP/1.1 200 OK", "router")
    forwarded = {k.lower(): v for k, v in backend.seen[-1]["headers"]}
    assert forwarded["x-forwarded-proto"] == "https"
    # Without a client certificate: a 400 that says so, on TLS 1.3 and 1.2 (until December 6 the connection
    # was dropped without a word - Python's TLS transports do not send a failed handshake's alert - and
    # clients reported "empty reply from server").
    for version in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2):
        ctx = client_context(pki, with_cert=False)
        ctx.maximum_version = version
        refused, _ = await https_get(port, ctx, backend.headers())
        assert refused == b"HTTP/1.1 400 Bad Request", version
    # A certificate of another CA still fails the handshake.
    other_ca = Issuer(*make_ca("another-ca"))
    rogue_crt, rogue_key = write_pair(
        tmp_path, "rogue", *make_leaf(other_ca, common_name="mallory", client=True)
    )
    ctx = client_context(pki, with_cert=False)
    ctx.load_cert_chain(str(rogue_crt), str(rogue_key))
    try:  # TLS 1.3: the alert comes on the first read, or the connection just closes
        rogue, _ = await https_get(port, ctx, backend.headers())
    except (ssl.SSLError, ConnectionError):
        rogue = b""
    assert rogue == b""
    assert len(backend.seen) == 1
    # Plain HTTP keeps working on its own listener.
    assert router.http_port


async def test_optional_mtls_accepts_both(
    start_router: Callable[..., Awaitable[Router]], backend: Backend, pki: dict[str, Path]
) -> None:
    router = await start_router(*tls_flags(pki, mtls="optional"))
    for with_cert in (True, False):
        status, _ = await https_get(
            router.https_port or 0, client_context(pki, with_cert=with_cert), backend.headers()
        )
        assert status == b"HTTP/1.1 200 OK"


async def test_certificate_hot_reload(
    start_router: Callable[..., Awaitable[Router]], backend: Backend, pki: dict[str, Path]
) -> None:
    router = await start_router(*tls_flags(pki))
    ctx = client_context(pki, with_cert=False)
    assert (await https_get(router.https_port or 0, ctx, backend.headers()))[1] == "router"
    # A broken pair first: counted as a failure, the old certificate keeps serving.
    pki["live_crt"].write_bytes(b"-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n")
    await _until(lambda: _reloads(router, "failure") >= 1)
    assert (await https_get(router.https_port or 0, ctx, backend.headers()))[1] == "router"
    # Then an atomic swap (rename over the old file, as Kubernetes' atomic writer does).
    for src, dst in ((pki["server2_key"], pki["live_key"]), (pki["server2_crt"], pki["live_crt"])):
        tmp = dst.with_suffix(".new")
        tmp.write_bytes(src.read_bytes())
        os.replace(tmp, dst)
    await _until(lambda: _reloads(router, "success") >= 1)
    assert (await https_get(router.https_port or 0, ctx, backend.headers()))[1] == "router-rotated"


def _reloads(router: Router, outcome: str) -> float:
    value = router.metrics.registry.get_sample_value(
        "sandbox_router_cert_reloads_total", {"outcome": outcome}
    )
    return value or 0.0


async def _until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    async def probe() -> bool:
        return predicate()

    await eventually(probe, "certificate reload", within=within)


async def test_unreadable_certificate_fails_start(
    start_router: Callable[..., Awaitable[Router]], tmp_path: Path
) -> None:
    from agent_sandbox.router import StartupError

    with pytest.raises(StartupError, match="TLS"):
        await start_router(
            "--https-bind-address=127.0.0.1:0",
            f"--tls-cert-file={tmp_path / 'missing.crt'}",
            f"--tls-key-file={tmp_path / 'missing.key'}",
        )
