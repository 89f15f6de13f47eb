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


def test_bundle_problem_needs_a_pair_the_secrets_ca_issued() -> None:
    # Each part parsed, in date, covering the hosts - and still unusable: a pair no CA of the bundle issued (the
    # caBundle would trust a CA that verifies nothing served), or a key of another certificate (no TLS listener
    # loads it). Both used to pass.
    hosts = service_hosts(SVC, NS, DOMAIN)
    a, b = bundle(), bundle()
    assert "not issued by" in (bundle_problem(CertBundle(b.ca_pem, a.cert_pem, a.key_pem), hosts=hosts,
                                              now=NOW) or "")  # fmt: skip
    assert "key does not match" in (bundle_problem(CertBundle(a.ca_pem, a.cert_pem, b.key_pem), hosts=hosts,
                                                   now=NOW) or "")  # fmt: skip
    # A ca.crt of several CAs: the issuer may be any of them.
    assert (
        bundle_problem(CertBundle(b.ca_pem + a.ca_pem, a.cert_pem, a.key_pem), hosts=hosts, now=NOW) is None
    )


def test_bundle_problem_accepts_a_chain_up_to_the_secrets_ca() -> None:
    # tls.crt as a chain (server certificate, then the intermediate that issued it; TLS sends both), ca.crt the
    # root: the API server verifies it with the root alone.
    from cryptography.hazmat.primitives import serialization

    from agent_sandbox.kube.x509 import SERVER_AUTH, Issuer, cert_pem, issue, key_pem, name, new_key

    start, end = NOW - dt.timedelta(hours=1), NOW + dt.timedelta(days=30)
    root_key, mid_key, key = new_key(), new_key(), new_key()
    root = issue(name("root"), root_key, issuer=None, not_before=start, not_after=end, serial=1, ca=True)
    mid = issue(name("mid"), mid_key, issuer=Issuer(root, root_key), not_before=start, not_after=end, serial=2,
                ca=True)  # fmt: skip
    hosts = service_hosts(SVC, NS, DOMAIN)
    leaf = issue(name("leaf"), key, issuer=Issuer(mid, mid_key), not_before=start, not_after=end, serial=3,
                 usages=[SERVER_AUTH], hosts=hosts, basic_constraints=False)  # fmt: skip
    chained = CertBundle(cert_pem(root), cert_pem(leaf) + cert_pem(mid), key_pem(key, traditional=True))
    assert bundle_problem(chained, hosts=hosts, now=NOW) is None
    no_link = CertBundle(cert_pem(root), cert_pem(leaf), chained.key_pem)  # the intermediate left out
    assert "not issued by" in (bundle_problem(no_link, hosts=hosts, now=NOW) or "")
    pkcs8 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())  # fmt: skip
    assert bundle_problem(CertBundle(chained.ca_pem, chained.cert_pem, pkcs8), hosts=hosts, now=NOW) is None


async def test_ensure_replaces_a_secret_whose_pair_its_ca_did_not_issue() -> None:
    client = FakeClient()
    first = await ensure_certificates(client, namespace=NS, service=SVC, cluster_domain=DOMAIN)
    other = generate_bundle(service=SVC, namespace=NS, cluster_domain=DOMAIN, now=dt.datetime.now(dt.UTC))
    secret = await client.get(SECRET, "agent-sandbox-webhook-certs", namespace=NS)
    secret["data"] = CertBundle(other.ca_pem, first.cert_pem, first.key_pem).to_secret_data()
    await client.update(SECRET, secret)
    got = await ensure_certificates(client, namespace=NS, service=SVC, cluster_domain=DOMAIN)
    assert got.ca_pem not in (first.ca_pem, other.ca_pem)
    assert bundle_problem(got, hosts=service_hosts(SVC, NS, DOMAIN), now=dt.datetime.now(dt.UTC)) is None


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
