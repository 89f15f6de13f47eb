"""Serving certificate generation/validation and the shared Secret (controllers spec §5.7)."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agent_sandbox.controllers.webhook import (
    CertBundle,
    CertificateError,
    bundle_problem,
    ensure_certificates,
    generate_bundle,
    service_hosts,
)
from agent_sandbox.kube import SECRET, AlreadyExists
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
SVC, NS, DOMAIN = "agent-sandbox-webhook-service", "agent-sandbox-system", "cluster.local"


def bundle(extra: tuple[str, ...] = (), now: dt.datetime = NOW) -> CertBundle:
    return generate_bundle(service=SVC, namespace=NS, cluster_domain=DOMAIN, extra_hosts=extra, now=now)


def test_generated_bundle_matches_upstream_shape() -> None:
    b = bundle(extra=("127.0.0.1",))
    ca = x509.load_pem_x509_certificate(b.ca_pem)
    cert = x509.load_pem_x509_certificate(b.cert_pem)
    assert (
        ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        == "agent-sandbox-conversion-webhook-ca"
    )
    assert ca.serial_number == 1
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    assert ca.public_key().curve.name == "secp256r1"
    assert cert.serial_number == 2
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == f"{SVC}.{NS}.svc"
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        SVC,
        f"{SVC}.{NS}",
        f"{SVC}.{NS}.svc",
        f"{SVC}.{NS}.svc.{DOMAIN}",
    ]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.not_valid_before_utc == NOW - dt.timedelta(hours=1)
    assert cert.not_valid_after_utc == NOW - dt.timedelta(hours=1) + dt.timedelta(days=365)
    cert.verify_directly_issued_by(ca)
    assert b.key_pem.startswith(b"-----BEGIN EC PRIVATE KEY-----")


def test_bundle_problem() -> None:
    hosts = service_hosts(SVC, NS, DOMAIN)
    good = bundle()
    assert bundle_problem(good, hosts=hosts, now=NOW) is None
    assert "not valid" in (bundle_problem(good, hosts=hosts, now=NOW + dt.timedelta(days=400)) or "")
    assert "does not cover ['127.0.0.1']" in (
        bundle_problem(good, hosts=[*hosts, "127.0.0.1"], now=NOW) or ""
    )
    broken = CertBundle(good.ca_pem, b"not a pem", good.key_pem)
    assert "PEM" in (bundle_problem(broken, hosts=hosts, now=NOW) or "")


def test_secret_round_trip_and_incomplete_secret() -> None:
    b = bundle()
    assert CertBundle.from_secret({"data": b.to_secret_data()}) == b
    with pytest.raises(CertificateError, match="incomplete"):
        CertBundle.from_secret({"data": {"ca.crt": base64.b64encode(b.ca_pem).decode()}})


async def test_ensure_creates_then_reuses_secret() -> None:
    client = FakeClient()
    first = await ensure_certificates(client, namespace=NS, service=SVC, cluster_domain=DOMAIN)
    secret = await client.get(SECRET, "agent-sandbox-webhook-certs", namespace=NS)
    assert secret["type"] == "Opaque"
    assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    again = await ensure_certificates(client, namespace=NS, service=SVC, cluster_domain=DOMAIN)
    assert again == first, "a valid shared Secret must be reused, not regenerated"


async def test_ensure_replaces_secret_missing_dev_host() -> None:
    client = FakeClient()
    first = await ensure_certificates(client, namespace=NS, service=SVC, cluster_domain=DOMAIN)
    dev = await ensure_certificates(
        client, namespace=NS, service=SVC, cluster_domain=DOMAIN, extra_hosts=("127.0.0.1",)
    )
    assert dev.ca_pem != first.ca_pem
    stored = CertBundle.from_secret(await client.get(SECRET, "agent-sandbox-webhook-certs", namespace=NS))
    assert stored == dev


class RacingClient(FakeClient):
    """Another replica creates the Secret between our GET and our POST."""

    def __init__(self, winner: CertBundle) -> None:
        super().__init__()
        self.winner = winner
        self.raced = False

    async def create(self, kind: Any, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if not self.raced:
            self.raced = True
            await super().create(kind, dict(obj, data=self.winner.to_secret_data()), **kw)
            raise AlreadyExists(409, "AlreadyExists", "secrets already exists")
        return await super().create(kind, obj, **kw)


async def test_ensure_adopts_the_race_winner() -> None:
    winner = generate_bundle(service=SVC, namespace=NS, cluster_domain=DOMAIN, now=dt.datetime.now(dt.UTC))
    client = RacingClient(winner)
    got = await ensure_certificates(client, namespace=NS, service=SVC, cluster_domain=DOMAIN)
    assert client.raced
    assert got == winner
