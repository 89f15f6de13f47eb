"""Exec credential plugins that give client certificates, as Teleport's `tsh kube credentials` and Pinniped
do, for tests of the SDK's and the controller's kubeconfig loading against a dev cluster."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509 import load_pem_x509_certificate

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.kube import x509

__all__ = ["admin_certificate", "certificate_plugin_kubeconfig"]


def certificate_plugin_kubeconfig(
    cluster: DevCluster, directory: Path, credentials: list[dict[str, str]]
) -> tuple[Path, Path]:
    """The cluster's kubeconfig with its user replaced by a plugin that gives a client certificate instead of a
    token, as Teleport's `tsh kube credentials` and Pinniped do: run N prints `credentials[N-1]` (the last one
    from then on). Returns the kubeconfig and the plugin's run log."""
    runs = directory / "cert-plugin-runs.log"
    outputs = []
    for number, status in enumerate(credentials, start=1):
        body = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status}
        path = directory / f"credential-{number}.json"
        path.write_text(json.dumps(body))
        outputs.append(path)
    plugin = directory / "cert-plugin"
    plugin.write_text(
        "#!/bin/sh\n"
        f"echo run >> {runs}\n"
        f"n=$(wc -l < {runs} | tr -d ' ')\n"
        f'[ "$n" -gt {len(outputs)} ] && n={len(outputs)}\n'
        f"cat {directory}/credential-$n.json\n"
    )
    plugin.chmod(0o755)
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    doc["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(plugin),
            "interactiveMode": "Never",
        }
    }
    path = directory / "cert-exec.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path, runs


def admin_certificate(cluster: DevCluster, *, lifetime: timedelta, user: str) -> dict[str, str]:
    """An ExecCredential status with a fresh `system:masters` client certificate signed by the cluster's CA."""
    pki = Path(cluster.directory) / "pki"
    issuer = x509.Issuer(
        load_pem_x509_certificate((pki / "ca.crt").read_bytes()),
        load_pem_private_key((pki / "ca.key").read_bytes(), password=None),  # type: ignore[arg-type]
    )
    key = x509.new_key()
    now = datetime.now(UTC)
    cert = x509.issue(
        x509.name(user, "system:masters"),
        key,
        issuer=issuer,
        not_before=now - timedelta(minutes=5),
        not_after=now + lifetime,
        usages=[x509.CLIENT_AUTH],
    )
    return {
        "clientCertificateData": x509.cert_pem(cert).decode(),
        "clientKeyData": x509.key_pem(key).decode(),
        "expirationTimestamp": (now + lifetime).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
