"""X.509 for TLS between our processes: CAs, serving and client certificates, PEM encoding.

One helper for both users: the local control plane's PKI (`devcluster.certs`) and the conversion
webhook's self-managed serving certificate (`controllers.webhook.certs`). Keys are EC P-256 (fast to
generate, accepted everywhere). Pure computation with `cryptography`, no file or network I/O; callers
pick validity, serials and extensions, because the webhook reproduces upstream's `tls.go` exactly while
the dev cluster follows kubeadm-like conventions.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CLIENT_AUTH",
    "SERVER_AUTH",
    "Issuer",
    "PrivateKey",
    "cert_pem",
    "issue",
    "key_pem",
    "name",
    "new_key",
    "subject_alt_name",
]

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
SERVER_AUTH = ExtendedKeyUsageOID.SERVER_AUTH
CLIENT_AUTH = ExtendedKeyUsageOID.CLIENT_AUTH


@dataclass(frozen=True, slots=True)
class Issuer:
    """A CA that signs: its certificate and private key."""

    cert: x509.Certificate
    key: PrivateKey


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh EC P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def name(common_name: str, organization: str | None = None) -> x509.Name:
    """`O=<organization>, CN=<common_name>` (organization only when given)."""
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def subject_alt_name(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    """SANs for `hosts` in order, without repeats: IP addresses as IPAddress, anything else as DNSName."""
    entries: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            entries.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(entries)


def issue(
    subject: x509.Name,
    key: PrivateKey,
    *,
    issuer: Issuer | None,
    not_before: dt.datetime,
    not_after: dt.datetime,
    serial: int | None = None,
    ca: bool = False,
    key_encipherment: bool = False,
    crl_sign: bool = False,
    usages: Iterable[x509.ObjectIdentifier] = (),
    hosts: Iterable[str] = (),
    key_identifiers: bool = False,
    basic_constraints: bool = True,
) -> x509.Certificate:
    """Sign a certificate for `key` (self-signed when `issuer` is None), SHA-256.

    Args:
        subject: the certificate's subject.
        key: the subject's private key (its public half goes into the certificate).
        issuer: the signing CA, or None for a self-signed certificate.
        not_before, not_after: validity.
        serial: serial number (random when None).
        ca: a CA certificate (BasicConstraints CA, KeyUsage keyCertSign) rather than a leaf.
        key_encipherment, crl_sign: extra KeyUsage bits (digitalSignature is always set).
        usages: ExtendedKeyUsage OIDs (`SERVER_AUTH`, `CLIENT_AUTH`); none: no extension.
        hosts: DNS names / IP addresses for the SubjectAlternativeName (none: no extension).
        key_identifiers: add SubjectKeyIdentifier (CA) / AuthorityKeyIdentifier (leaf).
        basic_constraints: add BasicConstraints (always for a CA; upstream's webhook leaf has none).
    """
    signer_key = key if issuer is None else issuer.key
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if issuer is None else issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number() if serial is None else serial)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
    if basic_constraints or ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    builder = builder.add_extension(
        x509.KeyUsage(
            digital_signature=True,
            content_commitment=False,
            key_encipherment=key_encipherment,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=ca,
            crl_sign=crl_sign,
            encipher_only=False,
            decipher_only=False,
        ),
        critical=True,
    )
    usages = list(usages)
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    hosts = list(hosts)
    if hosts:
        builder = builder.add_extension(subject_alt_name(hosts), critical=False)
    if key_identifiers and ca:
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    elif key_identifiers:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_key.public_key()), critical=False
        )
    return builder.sign(signer_key, hashes.SHA256())


def cert_pem(cert: x509.Certificate) -> bytes:
    """The certificate as PEM."""
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: PrivateKey, *, traditional: bool = False) -> bytes:
    """The private key as unencrypted PEM: PKCS#8, or the traditional `EC PRIVATE KEY` form."""
    fmt = serialization.PrivateFormat.TraditionalOpenSSL if traditional else serialization.PrivateFormat.PKCS8
    return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())
