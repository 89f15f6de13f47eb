"""SIGTERM - what `timeout`, CI runners and systemd send - stops the CLI the way Ctrl-C does. Until December 6
it killed `agent-sandbox create` mid-wait, and the auto-named claim stayed behind, its name never printed."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from tests.helpers import wait_for
from tests.integration.sdk.conftest import EXT, apply_pool

from .test_exec_cp import CLI

pytestmark = pytest.mark.integration


def _foreground() -> None:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _claims(cluster: DevCluster, namespace: str) -> list[str]:
    status, body = cluster.admin().request("GET", f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims")
    assert status == 200, body
    return [item["metadata"]["name"] for item in body["items"]]


def _waiting_create(
    cluster: DevCluster, namespace: str, preexec: Callable[[], object]
) -> subprocess.Popen[bytes]:
    """`agent-sandbox create` waiting for a sandbox that cannot come (a Pod no node takes, cold from the
    template), once its claim exists."""
    apply_pool(cluster, namespace, replicas=0, nodeSelector={"no-such-node": "x"})
    proc = subprocess.Popen(
        [CLI, "create", "--template", "tmpl", "-n", namespace, "--kubeconfig", str(cluster.kubeconfig),
         "--router-url", "http://127.0.0.1:9", "-o", "name"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=preexec,
    )  # fmt: skip
    try:
        wait_for(lambda: _claims(cluster, namespace), what="the claim the CLI creates")
    except BaseException:
        proc.kill()
        raise
    return proc


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"]
)
def test_a_signal_during_create_rolls_the_claim_back(
    cluster: DevCluster, namespace: str, controller: Started, sig: signal.Signals
) -> None:
    # pytest-xdist's workers ignore SIGINT (and under nohup SIGHUP), and an ignored signal is inherited: the
    # CLI then leaves it ignored (a shell's foreground job has the defaults, as restored here)
    proc = _waiting_create(cluster, namespace, _foreground)
    try:
        time.sleep(0.5)  # into the wait for Ready
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 128 + sig
    assert wait_for(lambda: _claims(cluster, namespace) == [] or None, timeout=30)


def test_nohup_keeps_a_hangup_ignored(cluster: DevCluster, namespace: str, controller: Started) -> None:
    """`nohup agent-sandbox ...`: an ignored SIGHUP stays ignored (the CLI's own handler is for a terminal
    that goes away under an interactive session)."""
    proc = _waiting_create(
        cluster, namespace, lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)
    )  # nohup's
    try:
        proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert proc.poll() is None  # still waiting for its sandbox
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_for(lambda: _claims(cluster, namespace) == [] or None, timeout=30)
