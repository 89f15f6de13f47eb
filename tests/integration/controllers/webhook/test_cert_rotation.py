"""The conversion webhook serves a rotated certificate to the real API server without a restart.

With `--manage-webhook-certs=false` an external provisioner (cert-manager) owns the serving pair: it replaces
`tls.crt`/`tls.key` in the cert dir and the CRDs' caBundle with a pair from another CA. The webhook kept the
pair it loaded at start-up, so from then on every v1alpha1 request failed with "x509: certificate signed by
unknown authority" until the controller restarted. Likewise with managed certificates when another replica
replaced the shared Secret. Here kube-apiserver (the local control plane) calls the webhook over TLS before
and after such a rotation.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.webhook import ConversionWebhook, WebhookOptions, generate_bundle
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import install_crds
from agent_sandbox.devcluster.identity import controller_kubeconfig
from agent_sandbox.kube import ApiClient
from tests.helpers import eventually
from tests.unit.controllers.webhook.test_cert_reload import _bundle, _replace
from tests.unit.controllers.webhook.test_cert_reload import _verified as _serves

pytestmark = pytest.mark.integration

CRD_NAME = "sandboxes.agents.x-k8s.io"
POLL = 1.0  # the certificate poll interval here (10 s by default, as upstream's certwatcher)


async def _kubectl(cluster: DevCluster, *args: str, check: bool = False, stdin: str | None = None) -> Any:
    return await asyncio.to_thread(cluster.kubectl, *args, check=check, input=stdin)


async def _point_crd(cluster: DevCluster, url: str, ca_pem: bytes) -> None:
    patch = {"spec": {"conversion": {"strategy": "Webhook", "webhook": {
        "conversionReviewVersions": ["v1", "v1beta1"],
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode(), "service": None}}}}}  # fmt: skip
    await _kubectl(cluster, "patch", "crd", CRD_NAME, "--type=merge", "-p", json.dumps(patch), check=True)


async def test_the_api_server_gets_conversions_after_the_pair_and_ca_bundle_are_rotated(
    cluster: DevCluster, namespace: str, kube: ApiClient, tmp_path: Path
) -> None:
    await asyncio.to_thread(install_crds, cluster)
    crd = json.loads((await _kubectl(cluster, "get", "crd", CRD_NAME, "-o", "json", check=True)).stdout)
    original_webhook = crd["spec"]["conversion"].get("webhook")

    first, second = _bundle(), _bundle()
    (tmp_path / "tls.crt").write_bytes(first.cert_pem)
    (tmp_path / "tls.key").write_bytes(first.key_pem)
    webhook = ConversionWebhook(
        kube,  # unused: with unmanaged certificates the webhook neither reads the Secret nor patches CRDs
        WebhookOptions(
            host="127.0.0.1", port=0, manage_certs=False, cert_dir=tmp_path, cert_poll_interval=POLL
        ),
    )
    await webhook.start()
    try:
        port = webhook.port
        assert port is not None
        url = f"https://127.0.0.1:{port}/convert"
        await _point_crd(cluster, url, first.ca_pem)
        sandbox = {"apiVersion": c.SANDBOX_API_VERSION, "kind": "Sandbox", "metadata": {"name": "probe"},
                   "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}  # fmt: skip
        await _kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(sandbox), check=True)
        last: dict[str, str] = {}

        async def converted() -> bool:
            out = await _kubectl(cluster, "get", "sandboxes.v1alpha1.agents.x-k8s.io", "probe", "-n", namespace,
                                 "-o", "json")  # fmt: skip
            last.update(code=str(out.returncode), stderr=out.stderr.strip()[-300:], stdout=out.stdout[:200])
            return out.returncode == 0 and bool(
                json.loads(out.stdout)["apiVersion"] == "agents.x-k8s.io/v1alpha1"
            )

        await eventually(converted, "v1alpha1 reads through the webhook with the first pair")

        # The provisioner's rotation: the new pair on disk (atomic renames, key first), then the CA bundle.
        _replace(tmp_path / "tls.key", second.key_pem)
        _replace(tmp_path / "tls.crt", second.cert_pem)
        await _point_crd(cluster, url, second.ca_pem)
        rotated = time.monotonic()
        await eventually(lambda: _serves(port, second.ca_pem), "the second pair served", within=30)
        try:
            await eventually(converted, "v1alpha1 reads after the rotation", within=30)
        except pytest.fail.Exception:
            pytest.fail(f"no v1alpha1 read through the webhook 30 s after the rotation; last attempt: {last}")
        # The poll interval plus the API server's rebuild of the CRD's storage for the new caBundle.
        assert time.monotonic() - rotated < 30
        assert webhook.certs is not None
        assert webhook.certs.reloads == 1
    finally:
        await webhook.stop()
        if original_webhook is not None:  # leave the CRD as found (another suite's webhook may be live)
            restore = [{"op": "replace", "path": "/spec/conversion/webhook", "value": original_webhook}]
            await _kubectl(
                cluster, "patch", "crd", CRD_NAME, "--type=json", "-p", json.dumps(restore), check=True
            )


async def test_a_running_replica_follows_a_webhook_secret_another_replica_replaced(
    cluster: DevCluster, namespace: str, tmp_path: Path
) -> None:
    """Managed certificates: replica B finds the stored bundle unusable (expired, say), stores a new one and
    re-points the CRDs' caBundle at its CA. Running replica A must serve the new pair too: the API server may
    call any replica and now trusts only the new CA. Runs as the controller's identity (the install's
    ServiceAccount with AGENT_SANDBOX_CONTROLLER_IDENTITY=serviceaccount): following needs only the Secret's
    `get` grant."""
    await asyncio.to_thread(install_crds, cluster)
    crd = json.loads((await _kubectl(cluster, "get", "crd", CRD_NAME, "-o", "json", check=True)).stdout)
    original_webhook = crd["spec"]["conversion"].get("webhook")
    client = await ApiClient.from_kubeconfig(str(await asyncio.to_thread(controller_kubeconfig, cluster)))
    opts = WebhookOptions(host="127.0.0.1", port=0, cert_dir=tmp_path, crd_names=(CRD_NAME,),
                          webhook_url="https://127.0.0.1:{port}/convert", cert_poll_interval=POLL,
                          secret_poll_interval=POLL)  # fmt: skip
    webhook = ConversionWebhook(client, opts)
    await webhook.start()
    try:
        port = webhook.port
        assert port is not None
        assert webhook.url is not None
        sandbox = {"apiVersion": c.SANDBOX_API_VERSION, "kind": "Sandbox", "metadata": {"name": "probe"},
                   "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}  # fmt: skip
        await _kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(sandbox), check=True)
        last: dict[str, str] = {}

        async def converted() -> bool:
            out = await _kubectl(cluster, "get", "sandboxes.v1alpha1.agents.x-k8s.io", "probe", "-n", namespace,
                                 "-o", "name")  # fmt: skip
            last.update(code=str(out.returncode), stderr=out.stderr.strip()[-300:])
            return bool(out.returncode == 0)

        await eventually(converted, "v1alpha1 reads through the managed webhook")

        # What replica B does at its start-up: a new bundle in the Secret, the CRD's caBundle at its CA.
        replacement = generate_bundle(service=opts.service_name, namespace=opts.namespace,
                                      cluster_domain=opts.cluster_domain, extra_hosts=("127.0.0.1",),
                                      now=dt.datetime.now(dt.UTC))  # fmt: skip
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                  "metadata": {"name": c.WEBHOOK_CERTS_SECRET, "namespace": opts.namespace},
                  "data": replacement.to_secret_data()}  # fmt: skip
        await _kubectl(cluster, "replace", "-f", "-", stdin=json.dumps(secret), check=True)
        await _point_crd(cluster, webhook.url, replacement.ca_pem)
        await eventually(lambda: _serves(port, replacement.ca_pem), "the Secret's new pair served", within=30)
        try:
            await eventually(converted, "v1alpha1 reads after the Secret was replaced", within=30)
        except pytest.fail.Exception:
            pytest.fail(
                f"no v1alpha1 read 30 s after another replica replaced the Secret; last attempt: {last}"
            )
        assert (tmp_path / "tls.crt").read_bytes() == replacement.cert_pem

        async def taken() -> bool:  # at the Secret poll after the watcher served the pair
            return webhook.ca_pem == replacement.ca_pem

        await eventually(taken, "the served pair's CA taken as the replica's", within=10)
    finally:
        await webhook.stop()
        await client.close()
        if original_webhook is not None:
            restore = [{"op": "replace", "path": "/spec/conversion/webhook", "value": original_webhook}]
            await _kubectl(
                cluster, "patch", "crd", CRD_NAME, "--type=json", "-p", json.dumps(restore), check=True
            )
