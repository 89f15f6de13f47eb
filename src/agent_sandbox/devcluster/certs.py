"""PKI for the local control plane: a CA, serving and client certificates, the SA key pair.

Owns: which certificates a cluster needs and writing them as PEM files into its `pki/` directory. They
are made by the shared `kube.x509` helper (no openssl binary needed); keys are EC P-256 except the
service-account signing key, which stays RSA-2048 as upstream's tooling expects.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from agent_sandbox.devcluster.config import PROVISIONER_USER
from agent_sandbox.kube.x509 import (
    CLIENT_AUTH,
    SERVER_AUTH,
    Issuer,
    PrivateKey,
    cert_pem,
    issue,
    key_pem,
    name,
    new_key,
)

_VALIDITY = dt.timedelta(days=3650)
_BACKDATE = dt.timedelta(minutes=5)


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


def _write_key(key: PrivateKey, path: Path) -> None:
    path.write_bytes(key_pem(key))
    path.chmod(0o600)


def make_ca(common_name: str) -> tuple[x509.Certificate, PrivateKey]:
    """Create a self-signed CA certificate and key."""
    key = new_key()
    now = dt.datetime.now(dt.UTC)
    cert = issue(
        name(common_name),
        key,
        issuer=None,
        not_before=now - _BACKDATE,
        not_after=now + _VALIDITY,
        ca=True,
        crl_sign=True,
        key_identifiers=True,
    )
    return cert, key


def make_leaf(
    ca: Issuer,
    *,
    common_name: str,
    org: str | None = None,
    server: bool = False,
    client: bool = False,
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> tuple[x509.Certificate, PrivateKey]:
    """Create a leaf certificate signed by the CA, for serving and/or client auth."""
    key = new_key()
    now = dt.datetime.now(dt.UTC)
    cert = issue(
        name(common_name, org),
        key,
        issuer=ca,
        not_before=now - _BACKDATE,
        not_after=now + _VALIDITY,
        key_encipherment=True,
        usages=[u for u, wanted in ((SERVER_AUTH, server), (CLIENT_AUTH, client)) if wanted],
        hosts=(*dns_names, *ips),
        key_identifiers=True,
    )
    return cert, key


def write_cluster_pki(directory: Path, *, service_ip: str) -> ClusterPki:
    """Generate the whole PKI of one dev cluster into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = make_ca("agent-sandbox-dev-ca")
    issuer = Issuer(ca_cert, ca_key)

    def pair(file_name: str, cert: x509.Certificate, key: PrivateKey) -> CertPair:
        p = CertPair(directory / f"{file_name}.crt", directory / f"{file_name}.key")
        p.cert.write_bytes(cert_pem(cert))
        _write_key(key, p.key)
        return p

    ca = pair("ca", ca_cert, ca_key)
    apiserver = pair(
        "apiserver",
        *make_leaf(
            issuer,
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
        file_name: pair(file_name, *make_leaf(issuer, common_name=cn, org=org, client=True))
        for file_name, (cn, org) in clients.items()
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
