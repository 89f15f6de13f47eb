"""The conversion webhook follows its serving pair on disk (controller-runtime's certwatcher).

cert-manager (or any external provisioner, `--manage-webhook-certs=false`) replaces `tls.crt`/`tls.key` and
the CRDs' caBundle; a webhook that keeps the pair it loaded at start-up then fails every conversion with
"x509: certificate signed by unknown authority" until it is restarted. These tests drive the real TLS
listener on loopback with a real TLS client (the server needs no API server with unmanaged certificates).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent_sandbox.controllers.webhook import CertBundle, ConversionWebhook, WebhookOptions, generate_bundle
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

POLL = 0.05
LOGGER = "agent_sandbox.controllers.webhook.server"  # pinned: every webhook module logs under this name


def _bundle() -> CertBundle:
    """A serving pair from a CA of its own (each call: another CA)."""
    return generate_bundle(service="s", namespace="n", cluster_domain="cluster.local", extra_hosts=("127.0.0.1",),
                           now=dt.datetime.now(dt.UTC))  # fmt: skip


def _replace(path: Path, data: bytes) -> None:
    """Atomically replace `path` (write aside, rename), as cert-manager's csi driver and most tools do."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


async def _served(port: int) -> bytes:
    """DER of the certificate the listener presents to a new connection (no SNI: the URL host is an IP)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert der is not None
        return bytes(der)
    finally:
        writer.close()


async def _verified(port: int, ca_pem: bytes) -> bool:
    """Whether a client trusting only `ca_pem` completes a verified handshake (as the API server does)."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    except ssl.SSLError:
        return False
    writer.close()
    return True


def _der(bundle: CertBundle) -> bytes:
    return ssl.PEM_cert_to_DER_cert(bundle.cert_pem.decode())


async def _until(predicate: Callable[[], Awaitable[bool]], within: float = 10.0) -> float:
    """Seconds until the async predicate holds (fails after `within` seconds)."""
    started = time.monotonic()
    while True:
        if await predicate():
            return time.monotonic() - started
        assert time.monotonic() - started < within, "condition not met in time"
        await asyncio.sleep(POLL)


def _webhook(cert_dir: Path, *, interval: float = POLL) -> ConversionWebhook:
    opts = WebhookOptions(host="127.0.0.1", port=0, manage_certs=False, cert_dir=cert_dir,
                          cert_poll_interval=interval)  # fmt: skip
    return ConversionWebhook(FakeClient(), opts)


async def test_a_replaced_pair_from_another_ca_is_served_to_new_connections(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = _bundle(), _bundle()
    (tmp_path / "tls.crt").write_bytes(old.cert_pem)
    (tmp_path / "tls.key").write_bytes(old.key_pem)
    webhook = _webhook(tmp_path)
    await webhook.start()
    try:
        assert webhook.port is not None
        port = webhook.port
        assert await _served(port) == _der(old)
        assert await _verified(port, old.ca_pem)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            _replace(tmp_path / "tls.key", new.key_pem)
            _replace(tmp_path / "tls.crt", new.cert_pem)
            await _until(lambda: _verified(port, new.ca_pem))
            assert await _served(port) == _der(new)
            assert not await _verified(port, old.ca_pem)
            await asyncio.sleep(10 * POLL)  # later polls see no change: one reload, logged once
        reloads = [r for r in caplog.records if "reloaded" in r.getMessage()]
        assert len(reloads) == 1, [r.getMessage() for r in caplog.records]
        assert reloads[0].levelno == logging.INFO
        assert str(tmp_path / "tls.crt") in reloads[0].getMessage()
    finally:
        await webhook.stop()


async def test_a_half_written_pair_keeps_the_previous_one_until_it_is_complete(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = _bundle(), _bundle()
    (tmp_path / "tls.crt").write_bytes(old.cert_pem)
    (tmp_path / "tls.key").write_bytes(old.key_pem)
    webhook = _webhook(tmp_path)
    await webhook.start()
    try:
        assert webhook.port is not None
        port = webhook.port
        with caplog.at_level(logging.INFO, logger=LOGGER):
            _replace(tmp_path / "tls.crt", new.cert_pem)  # the key not yet: they do not match
            await asyncio.sleep(20 * POLL)  # many polls of the same mismatched pair
            assert await _served(port) == _der(old)
            assert await _verified(port, old.ca_pem)
            failures = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(failures) == 1, [r.getMessage() for r in failures]  # said once, not every poll
            assert "keeping" in failures[0].getMessage()
            assert not [r for r in caplog.records if "reloaded" in r.getMessage()]

            (tmp_path / "tls.key").write_bytes(new.key_pem[: len(new.key_pem) // 2])  # torn write
            await asyncio.sleep(10 * POLL)
            assert await _served(port) == _der(old)

            _replace(tmp_path / "tls.key", new.key_pem)
            await _until(lambda: _verified(port, new.ca_pem))
            await asyncio.sleep(10 * POLL)
        reloads = [r for r in caplog.records if "reloaded" in r.getMessage()]
        assert len(reloads) == 1
        assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 2  # one per bad state
    finally:
        await webhook.stop()


async def test_a_secret_volume_rotation_is_followed(tmp_path: Path) -> None:
    """Kubelet's layout for a mounted Secret: `tls.crt -> ..data/tls.crt`, `..data -> ..<timestamp>`, and an
    update swaps the `..data` link atomically (file names and mtimes of the links never change)."""

    def publish(bundle: CertBundle, stamp: str) -> None:
        version = tmp_path / f"..{stamp}"
        version.mkdir()
        (version / "tls.crt").write_bytes(bundle.cert_pem)
        (version / "tls.key").write_bytes(bundle.key_pem)
        link = tmp_path / "..data_tmp"
        link.symlink_to(version.name)
        os.replace(link, tmp_path / "..data")

    old, new = _bundle(), _bundle()
    publish(old, "1")
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).symlink_to(f"..data/{name}")
    webhook = _webhook(tmp_path)
    await webhook.start()
    try:
        assert webhook.port is not None
        port = webhook.port
        assert await _served(port) == _der(old)
        publish(new, "2")
        await _until(lambda: _verified(port, new.ca_pem))
        assert await _served(port) == _der(new)
    finally:
        await webhook.stop()


async def test_a_pair_that_does_not_load_at_start_up_is_a_webhook_error(tmp_path: Path) -> None:
    from agent_sandbox.controllers.webhook import WebhookError

    a, b = _bundle(), _bundle()
    (tmp_path / "tls.crt").write_bytes(a.cert_pem)
    (tmp_path / "tls.key").write_bytes(b.key_pem)
    with pytest.raises(WebhookError, match=r"tls\.crt"):
        await _webhook(tmp_path).start()


async def test_managed_certificates_follow_a_secret_another_replica_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Replica A serves the Secret's pair; replica B replaces the Secret (its bundle had expired, say) and points
    the CRDs at its new CA. A must write and serve the new pair, or the API server rejects A's answers."""
    from agent_sandbox.api import constants as c
    from agent_sandbox.kube import SECRET

    client = FakeClient()
    opts = WebhookOptions(host="127.0.0.1", port=0, namespace="ns", cert_dir=tmp_path / "a",
                          webhook_url="https://127.0.0.1:{port}/convert", cert_poll_interval=POLL,
                          secret_poll_interval=POLL)  # fmt: skip
    webhook = ConversionWebhook(client, opts)
    await webhook.start()
    try:
        assert webhook.port is not None
        assert webhook.ca_pem is not None
        port, first_ca = webhook.port, webhook.ca_pem
        assert await _verified(port, first_ca)

        replacement = generate_bundle(service=opts.service_name, namespace="ns", cluster_domain="cluster.local",
                                      extra_hosts=("127.0.0.1",), now=dt.datetime.now(dt.UTC))  # fmt: skip
        secret = await client.get(SECRET, c.WEBHOOK_CERTS_SECRET, namespace="ns")
        secret["data"] = replacement.to_secret_data()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            await client.update(SECRET, secret)
            await _until(lambda: _verified(port, replacement.ca_pem))

            async def ca_updated() -> bool:  # set once the pair is written, which the watcher may beat
                return webhook.ca_pem == replacement.ca_pem

            await _until(ca_updated)
            assert not await _verified(port, first_ca)
            assert (tmp_path / "a" / "tls.crt").read_bytes() == replacement.cert_pem

            # A bundle that does not cover this replica's hosts is not taken (said once).
            unsuitable = generate_bundle(service="other", namespace="ns", cluster_domain="cluster.local",
                                         now=dt.datetime.now(dt.UTC))  # fmt: skip
            secret = await client.get(SECRET, c.WEBHOOK_CERTS_SECRET, namespace="ns")
            secret["data"] = unsuitable.to_secret_data()
            await client.update(SECRET, secret)
            await asyncio.sleep(20 * POLL)
            assert await _verified(port, replacement.ca_pem)
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings
        assert "does not cover" in warnings[0]
        assert len([r for r in caplog.records if "reloaded" in r.getMessage()]) == 1
    finally:
        await webhook.stop()


def test_the_pair_served_is_the_pair_compared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A rotation landing between the watcher's read of the files and their load: the watcher used to record
    # one pair and serve the other for good (files back at A, B served).
    from agent_sandbox.controllers.webhook import certwatch

    a, b = _bundle(), _bundle()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(b.cert_pem)
    key.write_bytes(b.key_pem)
    watcher = certwatch.CertWatcher(cert, key)
    cert.write_bytes(a.cert_pem)
    key.write_bytes(a.key_pem)
    real = certwatch.server_context

    def rotated_meanwhile(c: Path, k: Path) -> ssl.SSLContext:
        cert.write_bytes(b.cert_pem)  # whatever is loaded, the files now hold B again
        key.write_bytes(b.key_pem)
        return real(c, k)

    monkeypatch.setattr(certwatch, "server_context", rotated_meanwhile)
    assert watcher.check()  # A was read: A must be what is served
    monkeypatch.setattr(certwatch, "server_context", real)
    cert.write_bytes(a.cert_pem)
    key.write_bytes(a.key_pem)
    assert not watcher.check()
    served = asyncio.run(_served_by(watcher.current))
    assert served == _der(a)


async def _served_by(context: ssl.SSLContext) -> bytes:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=context)
    async with server:
        return await _served(server.sockets[0].getsockname()[1])


async def test_a_rotation_caught_between_its_two_renames_is_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from agent_sandbox.controllers.webhook import certwatch

    a, b = _bundle(), _bundle()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(a.cert_pem)
    key.write_bytes(a.key_pem)
    watcher = certwatch.CertWatcher(cert, key)
    caplog.set_level(logging.WARNING, LOGGER)
    _replace(cert, b.cert_pem)  # the certificate is renamed in, the key not yet
    assert not watcher.check()
    _replace(key, b.key_pem)
    assert watcher.check()
    assert [r.getMessage() for r in caplog.records] == []
    _replace(cert, a.cert_pem)  # a pair that stays mismatched is said, once
    for _ in range(3):
        assert not watcher.check()
    assert len(caplog.records) == 1


async def test_the_secret_follower_outlives_an_unexpected_error(tmp_path: Path) -> None:
    # A passphrase-protected key in the Secret made `cryptography` raise TypeError: the follower task ended
    # silently (the replica never followed the Secret again) and stop() raised it.
    from cryptography.hazmat.primitives import serialization

    from agent_sandbox.api import constants as c
    from agent_sandbox.kube import SECRET

    client = FakeClient()
    opts = WebhookOptions(host="127.0.0.1", port=0, namespace="ns", cert_dir=tmp_path,
                          webhook_url="https://127.0.0.1:{port}/convert",
                          cert_poll_interval=POLL, secret_poll_interval=POLL)  # fmt: skip
    webhook = ConversionWebhook(client, opts)  # type: ignore[arg-type]
    await webhook.start()
    try:

        def bundle() -> CertBundle:
            return generate_bundle(service=opts.service_name, namespace="ns", cluster_domain="cluster.local",
                                   extra_hosts=("127.0.0.1",), now=dt.datetime.now(dt.UTC))  # fmt: skip

        async def store(stored: CertBundle) -> None:
            secret = await client.get(SECRET, c.WEBHOOK_CERTS_SECRET, namespace="ns")
            secret["data"] = stored.to_secret_data()
            await client.update(SECRET, secret)

        locked = bundle()
        key = serialization.load_pem_private_key(locked.key_pem, None)
        encrypted = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw"),
        )
        await store(CertBundle(locked.ca_pem, locked.cert_pem, encrypted))
        await asyncio.sleep(10 * POLL)
        good = bundle()
        await store(good)

        async def followed() -> bool:
            return webhook.ca_pem == good.ca_pem

        await _until(followed)
    finally:
        await webhook.stop()
