"""The controller's client authenticates with a client certificate from a kubeconfig's exec plugin (Teleport's
`tsh kube credentials`, Pinniped) against the real API server, and presents a renewed one on new connections
before the old one expires. Until December 6 such a plugin was refused ("client certs unsupported")."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.kube import NAMESPACE, ApiClient, load_config
from tests.exec_plugins import admin_certificate, certificate_plugin_kubeconfig

pytestmark = pytest.mark.integration


async def test_an_exec_plugin_certificate_lists_and_watches(cluster: DevCluster, tmp_path: Path) -> None:
    status = admin_certificate(cluster, lifetime=timedelta(hours=1), user="controller-exec-cert")
    kubeconfig, runs = certificate_plugin_kubeconfig(cluster, tmp_path, [status])
    async with ApiClient(load_config(kubeconfig)) as api:
        names = {ns["metadata"]["name"] for ns in await api.list(NAMESPACE)}
        assert "kube-system" in names
        async for event in api.watch(NAMESPACE, timeout_seconds=5):
            assert event.type == "ADDED"
            break
    assert len(runs.read_text().splitlines()) == 1


async def test_a_renewed_plugin_certificate_goes_out_on_new_connections(
    cluster: DevCluster, tmp_path: Path
) -> None:
    """kube-apiserver checks a client certificate's validity at every request, also on a keep-alive connection
    opened while it was valid: requests after the renewal (10 s before expiry) must not travel on it."""
    lifetime = 14.0
    short = admin_certificate(cluster, lifetime=timedelta(seconds=lifetime), user="controller-exec-short")
    later = admin_certificate(cluster, lifetime=timedelta(hours=1), user="controller-exec-later")
    kubeconfig, runs = certificate_plugin_kubeconfig(cluster, tmp_path, [short, later])
    deadline = time.monotonic() + lifetime + 4.0
    calls = 0
    async with ApiClient(load_config(kubeconfig)) as api:
        while time.monotonic() < deadline:  # one request a second: the pooled connection stays open
            assert await api.get(NAMESPACE, "default")
            calls += 1
            await asyncio.sleep(1.0)
    assert calls >= lifetime
    assert len(runs.read_text().splitlines()) == 2
