"""A webhook Secret replaced behind the controller's back does not break conversion on new connections.

With managed certificates every replica re-reads the shared Secret `agent-sandbox-webhook-certs` and takes a
bundle that replaced it. Something other than a starting replica may replace it - a backup restore, a GitOps
re-apply, a manual rotation, a replica stopped between storing the Secret and patching the CRDs - and leave
the CRDs' caBundle trusting only the old CA. The webhook used to serve the new pair anyway: every v1alpha1
request on a new connection then failed with "x509: certificate signed by unknown authority", and v1beta1
writes to objects with a v1alpha1 manager silently lost all their managedFields (kube-apiserver logs "[SHOULD
NOT HAPPEN] failed to update managedFields"), with nothing in the controller's log.

The API server keeps its connections to the webhook open, so a test that only waited could pass on a
connection made before the switch. Here the CRD points at a TCP relay in front of the webhook (TLS passes
through it untouched); cutting the relay's connections makes every later conversion use a new connection,
which gets the pair served at that moment. Runs as the controller's identity (the install's ServiceAccount
with AGENT_SANDBOX_CONTROLLER_IDENTITY=serviceaccount): the switch patches the CRDs' caBundle.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.webhook import ConversionWebhook, WebhookOptions, generate_bundle
from agent_sandbox.controllers.webhook.crds import KEPT_CAS
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import install_crds
from agent_sandbox.devcluster.identity import controller_kubeconfig
from agent_sandbox.kube import ApiClient
from tests.helpers import eventually
from tests.loopback_relays import pipe as _pipe
from tests.unit.controllers.webhook.test_cert_reload import _verified as _serves

pytestmark = pytest.mark.integration

CRD_NAME = "sandboxes.agents.x-k8s.io"
POLL = 1.0  # both poll intervals here (10 s and 60 s by default)
ALPHA = "sandboxes.v1alpha1.agents.x-k8s.io"
BETA = "sandboxes.v1beta1.agents.x-k8s.io"


class _Relay:
    """A loopback TCP relay to the webhook whose open connections the test can cut."""

    def __init__(self) -> None:
        self.target = 0
        self.accepted = 0
        self._open: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            self._handlers.discard(task)
            return
        self._open |= {writer, up_writer}
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._open -= {writer, up_writer}
            self._handlers.discard(task)

    def cut(self) -> None:
        """Abort every relayed connection (both sides): the API server must connect anew."""
        for writer in list(self._open):
            writer.transport.abort()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        await asyncio.gather(*self._handlers, return_exceptions=True)


async def _kubectl(cluster: DevCluster, *args: str, check: bool = False, stdin: str | None = None) -> Any:
    return await asyncio.to_thread(cluster.kubectl, *args, check=check, input=stdin)


def _ders(pem: bytes) -> list[bytes]:
    return [cert.public_bytes(Encoding.DER) for cert in x509.load_pem_x509_certificates(pem)]


async def _trusted(cluster: DevCluster) -> list[bytes]:
    """The CAs the CRD's caBundle holds now (DER, in its order)."""
    got = json.loads((await _kubectl(cluster, "get", "crd", CRD_NAME, "-o", "json", check=True)).stdout)
    return _ders(base64.b64decode(got["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"]))


def _switched(new_ca: bytes, served_ca: bytes, before: list[bytes]) -> list[bytes]:
    """The caBundle a switch to ``new_ca`` must leave: that CA, the served pair's, then the CAs the caBundle
    already held (an earlier test or replica on this cluster may have left one), at most KEPT_CAS besides."""
    head = _ders(new_ca) + _ders(served_ca)
    return (head + [der for der in before if der not in head])[: len(_ders(new_ca)) + KEPT_CAS]


async def test_a_secret_replaced_without_the_crds_keeps_v1alpha1_working_on_new_connections(
    cluster: DevCluster, namespace: str, tmp_path: Path
) -> None:
    await asyncio.to_thread(install_crds, cluster)
    crd = json.loads((await _kubectl(cluster, "get", "crd", CRD_NAME, "-o", "json", check=True)).stdout)
    original_webhook = crd["spec"]["conversion"].get("webhook")
    client = await ApiClient.from_kubeconfig(str(await asyncio.to_thread(controller_kubeconfig, cluster)))
    relay = _Relay()
    relay_port = await relay.start()
    opts = WebhookOptions(host="127.0.0.1", port=0, cert_dir=tmp_path, crd_names=(CRD_NAME,),
                          webhook_url=f"https://127.0.0.1:{relay_port}/convert", cert_poll_interval=POLL,
                          secret_poll_interval=POLL)  # fmt: skip
    webhook = ConversionWebhook(client, opts)
    await webhook.start()
    try:
        assert webhook.port is not None
        assert webhook.ca_pem is not None
        relay.target, old_ca = webhook.port, webhook.ca_pem
        # A v1alpha1 manager in the object's managedFields: v1beta1 writes then convert them through the webhook.
        sandbox = {"apiVersion": c.SANDBOX_API_VERSION_V1ALPHA1, "kind": "Sandbox", "metadata": {"name": "probe"},
                   "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}  # fmt: skip
        last: dict[str, str] = {}

        async def applied() -> bool:
            out = await _kubectl(cluster, "apply", "--server-side", "--field-manager=alpha-mgr", "-n", namespace,
                                 "-f", "-", stdin=json.dumps(sandbox))  # fmt: skip
            last.update(code=str(out.returncode), stderr=out.stderr.strip()[-300:])
            return bool(out.returncode == 0)

        async def converted() -> bool:
            out = await _kubectl(cluster, "get", ALPHA, "probe", "-n", namespace, "-o", "name")
            last.update(code=str(out.returncode), stderr=out.stderr.strip()[-300:])
            return bool(out.returncode == 0)

        await eventually(applied, "a v1alpha1 server-side apply through the webhook", within=60)
        await eventually(converted, "v1alpha1 reads through the managed webhook")
        before = await _trusted(cluster)

        # The Secret replaced with a fresh bundle (a backup restore, say); the CRDs are left as they were.
        fresh = generate_bundle(service=opts.service_name, namespace=opts.namespace,
                                cluster_domain=opts.cluster_domain, extra_hosts=("127.0.0.1",),
                                now=dt.datetime.now(dt.UTC))  # fmt: skip
        await _kubectl(cluster, "-n", opts.namespace, "patch", "secret", c.WEBHOOK_CERTS_SECRET, "--type=merge",
                       "-p", json.dumps({"data": fresh.to_secret_data()}), check=True)  # fmt: skip
        await eventually(
            lambda: _serves(webhook.port or 0, fresh.ca_pem), "the Secret's new pair served", within=30
        )

        # Every connection the API server had is gone: whatever it converts from now on is on a new one.
        accepted = relay.accepted
        relay.cut()
        try:
            await eventually(converted, "v1alpha1 reads on new connections after the switch", within=30)
        except pytest.fail.Exception:
            pytest.fail(
                f"no v1alpha1 read on a new connection 30 s after the Secret was replaced; last: {last}"
            )
        assert relay.accepted > accepted

        got = json.loads((await _kubectl(cluster, "get", "crd", CRD_NAME, "-o", "json", check=True)).stdout)
        ca_bundle = base64.b64decode(got["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"])
        assert _ders(ca_bundle) == _switched(fresh.ca_pem, old_ca, before)  # both, during the switch
        assert got["spec"]["conversion"]["webhook"]["clientConfig"]["url"] == webhook.url

        async def taken() -> bool:  # at the Secret poll after the watcher served the pair
            return webhook.ca_pem == fresh.ca_pem

        await eventually(taken, "the served pair's CA taken as the replica's", within=10)

        # A v1beta1 write keeps the v1alpha1 manager's entry (with the pair untrusted, all entries were lost).
        await _kubectl(cluster, "patch", BETA, "probe", "-n", namespace, "--type=merge",
                       "-p", json.dumps({"metadata": {"labels": {"touched": "yes"}}}), check=True)  # fmt: skip
        obj = json.loads((await _kubectl(cluster, "get", BETA, "probe", "-n", namespace, "-o", "json",
                                         "--show-managed-fields", check=True)).stdout)  # fmt: skip
        managers = {entry.get("manager") for entry in obj["metadata"].get("managedFields") or ()}
        assert "alpha-mgr" in managers, obj["metadata"].get("managedFields")
    finally:
        await webhook.stop()
        await client.close()
        await relay.close()
        if original_webhook is not None:  # leave the CRD as found (another suite's webhook may be live)
            restore = [{"op": "replace", "path": "/spec/conversion/webhook", "value": original_webhook}]
            with contextlib.suppress(Exception):
                await _kubectl(cluster, "patch", "crd", CRD_NAME, "--type=json", "-p", json.dumps(restore),
                               check=True)  # fmt: skip


async def test_a_replica_starting_after_the_secret_was_replaced_keeps_the_running_replicas_pair_trusted(
    cluster: DevCluster, namespace: str, tmp_path: Path
) -> None:
    """A backup restore replaces the Secret; before the running replica's next poll another one starts (a pod
    restart, a scale-up) and patches the CRDs. It wrote the Secret's CA alone: the API server rejected the
    running replica's pair on every new connection until that replica's poll (up to 70 s)."""
    await asyncio.to_thread(install_crds, cluster)
    crd = json.loads((await _kubectl(cluster, "get", "crd", CRD_NAME, "-o", "json", check=True)).stdout)
    original_webhook = crd["spec"]["conversion"].get("webhook")
    client = await ApiClient.from_kubeconfig(str(await asyncio.to_thread(controller_kubeconfig, cluster)))
    relay = _Relay()
    relay_port = await relay.start()
    # Both replicas behind the relay's URL (as behind the Service in a cluster); the running one does not poll
    # the Secret during the test.
    opts = WebhookOptions(host="127.0.0.1", port=0, cert_dir=tmp_path / "running", crd_names=(CRD_NAME,),
                          webhook_url=f"https://127.0.0.1:{relay_port}/convert", cert_poll_interval=POLL,
                          secret_poll_interval=3600.0)  # fmt: skip
    running = ConversionWebhook(client, opts)
    await running.start()
    try:
        assert running.port is not None
        assert running.ca_pem is not None
        relay.target, served = running.port, running.ca_pem
        sandbox = {"apiVersion": c.SANDBOX_API_VERSION, "kind": "Sandbox", "metadata": {"name": "probe"},
                   "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}  # fmt: skip
        await _kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(sandbox), check=True)
        last: dict[str, str] = {}

        async def converted() -> bool:
            out = await _kubectl(cluster, "get", ALPHA, "probe", "-n", namespace, "-o", "name")
            last.update(code=str(out.returncode), stderr=out.stderr.strip()[-300:])
            return bool(out.returncode == 0)

        await eventually(converted, "v1alpha1 reads through the running replica", within=60)
        before = await _trusted(cluster)

        fresh = generate_bundle(service=opts.service_name, namespace=opts.namespace,
                                cluster_domain=opts.cluster_domain, extra_hosts=("127.0.0.1",),
                                now=dt.datetime.now(dt.UTC))  # fmt: skip
        await _kubectl(cluster, "-n", opts.namespace, "patch", "secret", c.WEBHOOK_CERTS_SECRET, "--type=merge",
                       "-p", json.dumps({"data": fresh.to_secret_data()}), check=True)  # fmt: skip
        starting = ConversionWebhook(
            client, replace(opts, cert_dir=tmp_path / "starting", secret_poll_interval=0)
        )
        await starting.start()
        await starting.stop()
        assert await _trusted(cluster) == _switched(fresh.ca_pem, served, before)

        # The API server applies the new caBundle within moments; from then on, each read on a new connection
        # reaches the running replica, which still serves the old pair.
        await asyncio.sleep(3)
        for _ in range(5):
            accepted = relay.accepted
            relay.cut()
            if not await converted():
                pytest.fail(f"a v1alpha1 read on a new connection failed after a replica started: {last}")
            assert relay.accepted > accepted
            await asyncio.sleep(1)
        assert await _serves(running.port, served)
    finally:
        await running.stop()
        await client.close()
        await relay.close()
        if original_webhook is not None:  # leave the CRD as found (another suite's webhook may be live)
            restore = [{"op": "replace", "path": "/spec/conversion/webhook", "value": original_webhook}]
            with contextlib.suppress(Exception):
                await _kubectl(cluster, "patch", "crd", CRD_NAME, "--type=json", "-p", json.dumps(restore),
                               check=True)  # fmt: skip
