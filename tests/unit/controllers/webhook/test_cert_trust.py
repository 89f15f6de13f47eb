"""Managed certificates: a replaced Secret's pair is served only once the CRDs' caBundle trusts its CA.

The Secret can change without the CRDs following (a backup restore, a GitOps re-apply, a manual rotation, a
replica stopped between storing the Secret and patching the CRDs). A replica that served the Secret's new pair
as soon as it saw it broke every conversion on a new connection ("x509: certificate signed by unknown
authority") and, worse, made the API server drop the managedFields of objects written through v1beta1. Here
the real TLS listener on loopback and an in-memory API (FakeClient); the same on the real control plane:
tests/integration/controllers/webhook/test_cert_trust.py.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.webhook import (
    CertBundle,
    ConversionWebhook,
    WebhookOptions,
    generate_bundle,
    patch_crds,
)
from agent_sandbox.kube import CRD, SECRET, Forbidden
from agent_sandbox.kube.testing import FakeClient
from tests.unit.controllers.webhook.test_cert_reload import _until, _verified
from tests.unit.controllers.webhook.test_server import crd

pytestmark = pytest.mark.unit

POLL = 0.05
LOGGER = "agent_sandbox.controllers.webhook.server"  # pinned: every webhook module logs under this name
SANDBOXES = "sandboxes.agents.x-k8s.io"
POOLS = "sandboxwarmpools.extensions.agents.x-k8s.io"


def _fresh(namespace: str = "ns") -> CertBundle:
    return generate_bundle(service=c.WEBHOOK_SERVICE_NAME, namespace=namespace, cluster_domain="cluster.local",
                           extra_hosts=("127.0.0.1",), now=dt.datetime.now(dt.UTC))  # fmt: skip


def _ders(pem: bytes) -> list[bytes]:
    from cryptography.hazmat.primitives.serialization import Encoding

    return [cert.public_bytes(Encoding.DER) for cert in x509.load_pem_x509_certificates(pem)]


async def _ca_bundle(client: FakeClient, crd_name: str) -> bytes:
    got = await client.get(CRD, crd_name)
    return base64.b64decode(got["spec"]["conversion"]["webhook"]["clientConfig"].get("caBundle") or "")


async def _store(client: FakeClient, bundle: CertBundle) -> None:
    """What a backup restore or a GitOps re-apply does: the Secret's data replaced, the CRDs left alone."""
    secret = await client.get(SECRET, c.WEBHOOK_CERTS_SECRET, namespace="ns")
    secret["data"] = bundle.to_secret_data()
    await client.update(SECRET, secret)


def _options(cert_dir: Path) -> WebhookOptions:
    return WebhookOptions(host="127.0.0.1", port=0, namespace="ns", cert_dir=cert_dir, crd_names=(SANDBOXES, POOLS),
                          webhook_url="https://127.0.0.1:{port}/convert", cert_poll_interval=POLL,
                          secret_poll_interval=POLL)  # fmt: skip


def _ca_bundle_patches(client: FakeClient) -> int:
    return sum(1 for verb, kind, _, name in client.actions if verb == "patch" and kind == CRD.kind)


async def test_a_replaced_secret_is_served_only_once_the_crds_trust_its_ca(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = FakeClient((CRD, crd(SANDBOXES)), (CRD, crd(POOLS)))
    webhook = ConversionWebhook(client, _options(tmp_path))
    await webhook.start()
    try:
        assert webhook.port is not None
        assert webhook.ca_pem is not None
        port, old_ca = webhook.port, webhook.ca_pem
        assert await _ca_bundle(client, SANDBOXES) == old_ca
        new = _fresh()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            await _store(client, new)
            await _until(lambda: _verified(port, new.ca_pem))
        for crd_name in (SANDBOXES, POOLS):
            # Both CAs: connections the API server made to the old pair still verify during the switch.
            assert _ders(await _ca_bundle(client, crd_name)) == _ders(new.ca_pem) + _ders(old_ca), crd_name

        async def taken() -> bool:  # at the poll after the watcher's check that served the new pair
            return webhook.ca_pem == new.ca_pem

        await _until(taken)
        messages = [r.getMessage() for r in caplog.records]
        assert any("caBundle" in m and SANDBOXES in m for m in messages), messages
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        await webhook.stop()


async def test_two_replicas_switch_the_ca_bundle_once_and_never_flap(tmp_path: Path) -> None:
    client = FakeClient((CRD, crd(SANDBOXES)), (CRD, crd(POOLS)))
    first = ConversionWebhook(client, _options(tmp_path / "a"))
    await first.start()
    second = ConversionWebhook(client, _options(tmp_path / "b"))
    await second.start()  # the Secret's bundle is fine: loaded, and the caBundle already trusts it
    try:
        assert first.port is not None
        assert second.port is not None
        assert first.ca_pem == second.ca_pem
        old_ca = first.ca_pem
        assert old_ca is not None
        patches = _ca_bundle_patches(client)
        new = _fresh()
        await _store(client, new)
        first_port, second_port = first.port, second.port
        await _until(lambda: _verified(first_port, new.ca_pem))
        await _until(lambda: _verified(second_port, new.ca_pem))
        await asyncio.sleep(20 * POLL)  # many more polls of both: nothing changes any more
        assert _ca_bundle_patches(client) - patches == 2  # one patch per CRD, by one replica
        for crd_name in (SANDBOXES, POOLS):
            assert _ders(await _ca_bundle(client, crd_name)) == _ders(new.ca_pem) + _ders(old_ca)

        # A third replica starting now loads the same bundle: it leaves the caBundle trusting both CAs (it
        # used to cut it to the new CA alone, under replicas still serving the old pair).
        third = ConversionWebhook(client, _options(tmp_path / "c"))
        await third.start()
        await third.stop()
        for crd_name in (SANDBOXES, POOLS):
            assert _ders(await _ca_bundle(client, crd_name)) == _ders(new.ca_pem) + _ders(old_ca)
    finally:
        await first.stop()
        await second.stop()


async def test_a_ca_bundle_that_cannot_be_patched_keeps_the_current_pair(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = FakeClient((CRD, crd(SANDBOXES)))
    webhook = ConversionWebhook(client, _options(tmp_path))
    await webhook.start()
    try:
        assert webhook.port is not None
        assert webhook.ca_pem is not None
        port, old_ca = webhook.port, webhook.ca_pem
        client.inject_error("patch", Forbidden(403, "Forbidden", "no patch for you"), kind=CRD, times=10**6)
        new = _fresh()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            await _store(client, new)
            await asyncio.sleep(20 * POLL)
            assert await _verified(port, old_ca)
            assert not await _verified(port, new.ca_pem)
            assert webhook.ca_pem == old_ca
            warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(warnings) == 1, warnings  # said once, retried at every poll
            assert "no patch for you" in warnings[0]
            client._injected.clear()  # the grant is back: the next poll switches
            await _until(lambda: _verified(port, new.ca_pem))
        assert _ders(await _ca_bundle(client, SANDBOXES)) == _ders(new.ca_pem) + _ders(old_ca)
    finally:
        await webhook.stop()


async def test_a_bundle_the_crds_already_trust_is_adopted_without_a_patch(tmp_path: Path) -> None:
    # The replica that replaced the Secret (at its start-up) patched the CRDs itself.
    client = FakeClient((CRD, crd(SANDBOXES)))
    webhook = ConversionWebhook(client, _options(tmp_path))
    await webhook.start()
    try:
        assert webhook.port is not None
        assert webhook.ca_pem is not None
        old_ca, new = webhook.ca_pem, _fresh()
        await patch_crds(client, ca_pem=new.ca_pem, url=webhook.url, service="s", namespace="ns",
                         crd_names=(SANDBOXES,))  # fmt: skip
        patches = _ca_bundle_patches(client)
        await _store(client, new)
        await _until(lambda: _verified(webhook.port or 0, new.ca_pem))
        assert _ca_bundle_patches(client) == patches
        # The CA served here until then kept (start-up keeps the valid CAs of a caBundle it must change).
        assert _ders(await _ca_bundle(client, SANDBOXES)) == _ders(new.ca_pem) + _ders(old_ca)
    finally:
        await webhook.stop()


async def test_a_replica_starting_before_the_others_follow_a_replaced_secret_keeps_their_ca(
    tmp_path: Path,
) -> None:
    # The Secret replaced (a backup restore, say), then a replica starts before the running one's next poll. It
    # wrote the Secret's CA alone: the running replica's pair was rejected until its poll (and v1beta1 writes
    # lost managedFields meanwhile).
    client = FakeClient((CRD, crd(SANDBOXES)))
    running = ConversionWebhook(client, replace(_options(tmp_path / "a"), secret_poll_interval=3600.0))
    await running.start()
    try:
        assert running.port is not None
        assert running.ca_pem is not None
        served = running.ca_pem
        new = _fresh()
        await _store(client, new)
        starting = ConversionWebhook(client, replace(_options(tmp_path / "c"), secret_poll_interval=0.0))
        await starting.start()
        await starting.stop()
        assert _ders(await _ca_bundle(client, SANDBOXES)) == _ders(new.ca_pem) + _ders(served)
        assert await _verified(running.port, served)
    finally:
        await running.stop()


async def test_a_secret_whose_pair_its_ca_did_not_issue_is_not_followed(tmp_path: Path) -> None:
    # ca.crt of one bundle, tls.crt/tls.key of another: the caBundle got the useless CA, then every replica served
    # a pair nothing trusted - the whole webhook down.
    client = FakeClient((CRD, crd(SANDBOXES)))
    webhook = ConversionWebhook(client, _options(tmp_path))
    await webhook.start()
    try:
        assert webhook.port is not None
        assert webhook.ca_pem is not None
        port, served = webhook.port, webhook.ca_pem
        patches = _ca_bundle_patches(client)
        a, b = _fresh(), _fresh()
        await _store(client, CertBundle(b.ca_pem, a.cert_pem, a.key_pem))
        await asyncio.sleep(20 * POLL)
        assert _ca_bundle_patches(client) == patches
        assert await _ca_bundle(client, SANDBOXES) == served
        assert await _verified(port, served)
        assert webhook.ca_pem == served
    finally:
        await webhook.stop()


async def test_a_secret_whose_key_is_not_its_certificates_is_not_followed(tmp_path: Path) -> None:
    # The watcher refused the pair, but the follower took the bundle as its own: its CA replaced the served one
    # as the CA to keep in the caBundle, and the pair was never tried again.
    client = FakeClient((CRD, crd(SANDBOXES)))
    webhook = ConversionWebhook(client, _options(tmp_path))
    await webhook.start()
    try:
        assert webhook.port is not None
        assert webhook.ca_pem is not None
        port, served = webhook.port, webhook.ca_pem
        a, b = _fresh(), _fresh()
        await _store(client, CertBundle(a.ca_pem, a.cert_pem, b.key_pem))
        await asyncio.sleep(20 * POLL)
        assert webhook.ca_pem == served
        assert await _ca_bundle(client, SANDBOXES) == served
        assert await _verified(port, served)
    finally:
        await webhook.stop()


async def test_a_written_pair_is_taken_as_served_only_once_the_watcher_serves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever lets a pair through that no TLS listener loads: the follower keeps the CA of the pair still
    # served, and follows the next usable bundle.
    from agent_sandbox.controllers.webhook import server

    client = FakeClient((CRD, crd(SANDBOXES)))
    webhook = ConversionWebhook(client, _options(tmp_path))
    await webhook.start()
    try:
        assert webhook.port is not None
        assert webhook.ca_pem is not None
        port, served = webhook.port, webhook.ca_pem
        monkeypatch.setattr(server, "bundle_problem", lambda *_, **__: None)
        a, b = _fresh(), _fresh()
        await _store(client, CertBundle(a.ca_pem, a.cert_pem, b.key_pem))
        await asyncio.sleep(20 * POLL)
        assert webhook.ca_pem == served
        assert await _verified(port, served)
        good = _fresh()
        await _store(client, good)
        await _until(lambda: _verified(port, good.ca_pem))

        async def taken() -> bool:
            return webhook.ca_pem == good.ca_pem

        await _until(taken)
    finally:
        await webhook.stop()


async def test_the_pair_is_written_a_poll_after_the_ca_bundle_patch_and_taken_once_served(
    tmp_path: Path,
) -> None:
    # Polls driven one at a time (no follower task, no watcher task): the API server applies a changed caBundle
    # only once its CRD informer saw it, so a pair written in the poll that patched it could be served to an API
    # server still verifying with the old caBundle.
    client = FakeClient((CRD, crd(SANDBOXES)), (CRD, crd(POOLS)))
    webhook = ConversionWebhook(
        client, replace(_options(tmp_path), cert_poll_interval=0.0, secret_poll_interval=0.0)
    )
    await webhook.start()
    try:
        assert webhook.port is not None
        assert webhook.certs is not None
        assert webhook.ca_pem is not None
        port, old_ca, old_cert = webhook.port, webhook.ca_pem, (tmp_path / "tls.crt").read_bytes()
        patches = _ca_bundle_patches(client)
        new = _fresh()
        await _store(client, new)

        await webhook._poll_secret()  # the caBundle made to trust the new CA; nothing else
        assert _ca_bundle_patches(client) - patches == 2
        for crd_name in (SANDBOXES, POOLS):
            assert _ders(await _ca_bundle(client, crd_name)) == _ders(new.ca_pem) + _ders(old_ca)
        assert (tmp_path / "tls.crt").read_bytes() == old_cert
        assert not webhook.certs.check()  # nothing new for the watcher to serve
        assert await _verified(port, old_ca)
        assert not await _verified(port, new.ca_pem)
        assert webhook.ca_pem == old_ca

        await webhook._poll_secret()  # a later poll: the CRDs trust the new CA, its pair is written
        assert (tmp_path / "tls.crt").read_bytes() == new.cert_pem
        assert _ca_bundle_patches(client) - patches == 2
        assert webhook.ca_pem == old_ca  # written, not served yet
        assert webhook.certs.check()  # the watcher's next check serves it
        assert await _verified(port, new.ca_pem)

        await webhook._poll_secret()  # served: now this replica's bundle
        assert webhook.ca_pem == new.ca_pem
        await webhook._poll_secret()
        assert _ca_bundle_patches(client) - patches == 2
    finally:
        await webhook.stop()
