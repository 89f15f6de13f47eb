"""Self-managed serving certificate of the conversion webhook (controllers spec §5.7, operations §4.1).

Pure parts (no I/O): :func:`generate_bundle` makes (with the shared ``kube.x509`` helper) an ECDSA
P-256 self-signed CA and a server certificate signed by it, exactly as upstream's ``tls.go`` (CN,
serials, back-dated 1 h, 365 days, ``EC PRIVATE KEY`` PEM); :func:`bundle_problem` validates a stored
bundle.

I/O part: :func:`ensure_certificates` loads Secret ``agent-sandbox-webhook-certs`` (shared by
all replicas) or creates it, resolving a create race by loading the winner's copy, and writes
``tls.crt``/``tls.key`` into the cert directory.

Deliberate differences from upstream (``docs/design/api-quirks.md``): a stored bundle that
is expired, whose server certificate does not cover the host names/IPs we need (e.g. the
``127.0.0.1`` of dev mode), was not issued by its CA, or whose key is not the certificate's, is
replaced instead of reused; upstream only checks that the three PEM blocks parse.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from agent_sandbox.api import constants as c
from agent_sandbox.kube import SECRET, AlreadyExists, Client, Conflict, NotFound
from agent_sandbox.kube.x509 import SERVER_AUTH, Issuer, cert_pem, issue, key_pem, name, new_key

log = logging.getLogger(__name__)

CA_CERT_KEY = "ca.crt"
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"
_VALIDITY = dt.timedelta(days=365)
_BACKDATE = dt.timedelta(hours=1)


class CertificateError(RuntimeError):
    """The webhook certificate could not be loaded, created or stored."""


@dataclass(frozen=True, slots=True)
class CertBundle:
    """PEM-encoded CA certificate, server certificate and server private key."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def to_secret_data(self) -> dict[str, str]:
        """Base64 ``data`` of the Secret (keys ``ca.crt``, ``tls.crt``, ``tls.key``)."""
        return {
            CA_CERT_KEY: base64.b64encode(self.ca_pem).decode(),
            TLS_CERT_KEY: base64.b64encode(self.cert_pem).decode(),
            TLS_KEY_KEY: base64.b64encode(self.key_pem).decode(),
        }

    @classmethod
    def from_secret(cls, secret: dict[str, Any]) -> CertBundle:
        """Decode a Secret's ``data``.

        Raises:
            CertificateError: a key is missing or not base64.
        """
        data = secret.get("data") or {}
        try:
            return cls(
                *(base64.b64decode(data[k], validate=True) for k in (CA_CERT_KEY, TLS_CERT_KEY, TLS_KEY_KEY))
            )
        except (KeyError, ValueError) as exc:
            raise CertificateError(
                f"Secret {c.WEBHOOK_CERTS_SECRET} is incomplete or not base64: {exc}"
            ) from exc


def service_hosts(service: str, namespace: str, cluster_domain: str) -> list[str]:
    """DNS names of the webhook Service, in upstream's SAN order."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{cluster_domain}",
    ]


def generate_bundle(
    *, service: str, namespace: str, cluster_domain: str, extra_hosts: tuple[str, ...] = (), now: dt.datetime
) -> CertBundle:
    """A fresh self-signed CA plus a server certificate for the webhook Service.

    Args:
        service: Service name (``agent-sandbox-webhook-service``).
        namespace: webhook namespace.
        cluster_domain: cluster DNS domain for the fully qualified SAN.
        extra_hosts: additional DNS names or IP addresses (dev mode: the URL host).
        now: issue time (validity starts one hour earlier, as upstream).
    """
    not_before = now - _BACKDATE
    not_after = not_before + _VALIDITY
    ca_key = new_key()
    ca_cert = issue(
        name(c.WEBHOOK_CA_COMMON_NAME),
        ca_key,
        issuer=None,
        not_before=not_before,
        not_after=not_after,
        serial=1,
        ca=True,
    )
    key = new_key()
    cert = issue(
        name(f"{service}.{namespace}.svc"),
        key,
        issuer=Issuer(ca_cert, ca_key),
        not_before=not_before,
        not_after=not_after,
        serial=2,
        usages=[SERVER_AUTH],
        hosts=[*service_hosts(service, namespace, cluster_domain), *extra_hosts],
        basic_constraints=False,
    )
    return CertBundle(
        ca_pem=cert_pem(ca_cert), cert_pem=cert_pem(cert), key_pem=key_pem(key, traditional=True)
    )  # "EC PRIVATE KEY", as upstream


def bundle_problem(bundle: CertBundle, *, hosts: list[str], now: dt.datetime) -> str | None:
    """Why ``bundle`` is unusable for ``hosts`` at ``now``, or None if it is fine.

    Usable: the three parts parse, the server certificate (the first of ``tls.crt``) is valid at ``now`` and
    covers ``hosts``, ``tls.key`` is its key, and it was issued by a CA of ``ca.crt`` - directly, or through
    the certificates after it in ``tls.crt`` (a chain, which TLS sends along). ``ca.crt`` is what the CRDs'
    caBundle is made to trust: a pair it did not issue would be served to an API server that rejects it, and
    a key of another certificate is a pair no TLS listener loads.
    """
    try:
        cas = x509.load_pem_x509_certificates(bundle.ca_pem)
        chain = x509.load_pem_x509_certificates(bundle.cert_pem)
        key = serialization.load_pem_private_key(bundle.key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:  # TypeError: an encrypted key
        return f"PEM does not parse: {exc}"
    cert = chain[0]
    if not cert.not_valid_before_utc <= now < cert.not_valid_after_utc:
        return f"server certificate not valid at {now.isoformat()} (expires {cert.not_valid_after_utc.isoformat()})"
    if _public_der(key.public_key()) != _public_der(cert.public_key()):
        return "server key does not match the server certificate (tls.key is another certificate's key)"
    if not _chains_to(chain, cas):
        return f"server certificate is not issued by a CA of {CA_CERT_KEY} (issuer {cert.issuer.rfc4514_string()})"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "server certificate has no SubjectAlternativeName"
    covered = {str(n) for n in sans.get_values_for_type(x509.DNSName)}
    covered |= {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    missing = [h for h in hosts if h not in covered]
    return f"server certificate does not cover {missing}" if missing else None


def _public_der(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)


def _issued(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Whether ``issuer`` signed ``cert`` (names and signature; the API server checks the same)."""
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def _chains_to(chain: list[x509.Certificate], cas: list[x509.Certificate]) -> bool:
    """Whether ``chain[0]`` was issued by one of ``cas``, directly or through other certificates of ``chain``."""
    current, rest = chain[0], chain[1:]
    while True:
        if any(_issued(current, ca) for ca in cas):
            return True
        parent = next((c for c in rest if _issued(current, c)), None)
        if parent is None:
            return False
        rest = [c for c in rest if c is not parent]  # each used once: no loop on a cross-signed pair
        current = parent


def write_files(bundle: CertBundle, cert_dir: Path, cert_name: str, key_name: str) -> tuple[Path, Path]:
    """Write the serving pair (dir 0755, files 0600); returns (cert path, key path).

    Each file is replaced atomically (written aside, then renamed over), so a reader - this process's
    certificate watcher, or another replica's sharing the directory (the dev cluster's) - never sees a
    truncated file; between the two renames it can see a mismatched pair, which it does not load.
    """
    cert_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(cert_dir, 0o755)
    paths = (cert_dir / cert_name, cert_dir / key_name)
    for path, data in zip(paths, (bundle.cert_pem, bundle.key_pem), strict=True):
        fd, tmp = tempfile.mkstemp(dir=cert_dir, prefix=f".{path.name}.")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return paths


async def ensure_certificates(
    client: Client,
    *,
    namespace: str,
    service: str,
    cluster_domain: str,
    extra_hosts: tuple[str, ...] = (),
) -> CertBundle:
    """Load the shared serving bundle from its Secret, or create (or replace) it.

    Raises:
        CertificateError: the Secret cannot be read or written.
    """
    hosts = [*service_hosts(service, namespace, cluster_domain), *extra_hosts]
    name = c.WEBHOOK_CERTS_SECRET
    for _ in range(5):  # a few rounds of create/replace races with other replicas
        now = dt.datetime.now(dt.UTC)
        try:
            secret = await client.get(SECRET, name, namespace=namespace)
        except NotFound:
            secret = None
        if secret is not None:
            bundle = CertBundle.from_secret(secret)
            problem = bundle_problem(bundle, hosts=hosts, now=now)
            if problem is None:
                return bundle
            log.warning("replacing webhook certificate in Secret %s/%s: %s", namespace, name, problem)
        fresh = generate_bundle(
            service=service,
            namespace=namespace,
            cluster_domain=cluster_domain,
            extra_hosts=extra_hosts,
            now=now,
        )
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "type": "Opaque",
            "data": fresh.to_secret_data(),
        }
        try:
            if secret is None:
                await client.create(SECRET, body, namespace=namespace)
            else:
                body["metadata"]["resourceVersion"] = secret["metadata"]["resourceVersion"]
                await client.update(SECRET, body)
        except (AlreadyExists, Conflict):
            log.info("another replica wrote Secret %s/%s first; loading its certificate", namespace, name)
            continue
        log.info("stored a new webhook certificate in Secret %s/%s", namespace, name)
        return fresh
    raise CertificateError(f"could not settle Secret {namespace}/{name} after repeated races")
