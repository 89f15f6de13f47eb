"""The shared X.509 helper: CA and leaf extensions, SANs, PEM forms."""

from __future__ import annotations

import datetime as dt
import ipaddress

import pytest
from cryptography import x509

from agent_sandbox.kube.x509 import SERVER_AUTH, Issuer, cert_pem, issue, key_pem, name, new_key

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_ca_and_leaf() -> None:
    ca_key = new_key()
    ca = issue(name("ca"), ca_key, issuer=None, not_before=NOW, not_after=NOW + dt.timedelta(days=1), ca=True)
    assert ca.issuer == ca.subject
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    key = new_key()
    leaf = issue(
        name("svc", "org"),
        key,
        issuer=Issuer(ca, ca_key),
        not_before=NOW,
        not_after=NOW + dt.timedelta(days=1),
        serial=7,
        usages=[SERVER_AUTH],
        hosts=["svc", "127.0.0.1", "svc"],
        basic_constraints=False,
    )
    assert leaf.issuer == ca.subject
    assert leaf.serial_number == 7
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["svc"]  # repeats dropped
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    with pytest.raises(x509.ExtensionNotFound):
        leaf.extensions.get_extension_for_class(x509.BasicConstraints)
    assert cert_pem(leaf).startswith(b"-----BEGIN CERTIFICATE-----")
    assert key_pem(key).startswith(b"-----BEGIN PRIVATE KEY-----")
    assert key_pem(key, traditional=True).startswith(b"-----BEGIN EC PRIVATE KEY-----")
