"""PKI for the local control plane: a CA, serving and client certificates, the SA key pair.

Owns: writing PEM files into a cluster's `pki/` directory. Generated with `cryptography` so the dev
cluster needs no openssl binary. Keys are EC P-256 (fast to generate; every component accepts them)
except the service-account signing key, which stays RSA-2048 as upstream's tooling expects.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agent_sandbox.devcluster.config import PROVISIONER_USER

_VALIDITY = dt.timedelta(days=3650)

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True, slots=True)
class CertPair:
    """Paths of one PEM certificate and its key."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class ClusterPki:
    """Every file the control plane components and clients need."""

    ca: CertPair
    apiserver: CertPair
    admin: CertPair
    controller_manager: CertPair
    scheduler: CertPair
    kwok: CertPair
    provisioner: CertPair
    sa_key: Path
    sa_pub: Path


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _write_key(key: PrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _builder(subject: x509.Name, issuer: x509.Name, key: PrivateKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def make_ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Create a self-signed CA certificate and key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def make_leaf(
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    *,
    common_name: str,
    org: str | None = None,
    server: bool = False,
    client: bool = False,
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Create a leaf certificate signed by the CA, for serving and/or client auth."""
    key = ec.generate_private_key(ec.SECP256R1())
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        _builder(_name(common_name, org), ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if dns_names or ips:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def write_cluster_pki(directory: Path, *, service_ip: str) -> ClusterPki:
    """Generate the whole PKI of one dev cluster into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = make_ca("agent-sandbox-dev-ca")

    def pair(name: str, cert: x509.Certificate, key: PrivateKey) -> CertPair:
        p = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
        _write_cert(cert, p.cert)
        _write_key(key, p.key)
        return p

    ca = pair("ca", ca_cert, ca_key)
    apiserver = pair(
        "apiserver",
        *make_leaf(
            ca_cert,
            ca_key,
            common_name="kube-apiserver",
            server=True,
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=("127.0.0.1", service_ip),
        ),
    )
    clients = {
        "admin": ("admin", "system:masters"),
        "controller-manager": ("system:kube-controller-manager", None),
        "scheduler": ("system:kube-scheduler", None),
        "kwok": ("kwok", "system:masters"),
        # Bound to system:persistent-volume-provisioner by the cluster (config.provisioner_binding_manifest).
        "volume-provisioner": (PROVISIONER_USER, None),
    }
    made = {
        name: pair(name, *make_leaf(ca_cert, ca_key, common_name=cn, org=org, client=True))
        for name, (cn, org) in clients.items()
    }
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_key, sa_pub = directory / "sa.key", directory / "sa.pub"
    _write_key(sa, sa_key)
    sa_pub.write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return ClusterPki(
        ca=ca,
        apiserver=apiserver,
        admin=made["admin"],
        controller_manager=made["controller-manager"],
        scheduler=made["scheduler"],
        kwok=made["kwok"],
        provisioner=made["volume-provisioner"],
        sa_key=sa_key,
        sa_pub=sa_pub,
    )
