"""The stand-in kubelet's translation of a pod into a host command line (pure parts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.devcluster.podprocess import PROGRAMS, pod_argv, probe_port, program_for

pytestmark = pytest.mark.unit


def _pod(image: str, args: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ops", "uid": "u"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": image,
                    "args": args,
                    "ports": [{"name": "healthz", "containerPort": 8081}],
                }
            ]
        },
        "status": {"podIP": "127.12.0.9"},
    }


def test_program_for_images() -> None:
    assert (
        program_for("ko://sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller")
        is PROGRAMS["agent-sandbox-controller"]
    )
    assert (
        program_for("registry.k8s.io/agent-sandbox/agent-sandbox-controller:v1")
        is PROGRAMS["agent-sandbox-controller"]
    )
    assert program_for("example.com/sandbox-router@sha256:" + "0" * 64) is PROGRAMS["sandbox-router"]
    assert program_for("busybox") is None


def test_controller_pod_argv_binds_the_pod_ip_and_adds_in_pod_facts() -> None:
    pod = _pod("x/agent-sandbox-controller:v1", ["--leader-elect=true", "--metrics-bind-address=:8080"])
    argv = pod_argv(
        pod,
        PROGRAMS["agent-sandbox-controller"],
        kubeconfig=Path("/k/kubeconfig"),
        workdir=Path("/w"),
        bin_dir=Path("/venv/bin"),
    )
    assert argv == [
        "/venv/bin/agent-sandbox-controller",
        "--leader-elect=true",
        "--metrics-bind-address=127.12.0.9:8080",
        "--health-probe-bind-address=127.12.0.9:8081",  # the default would bind every interface
        "--leader-election-namespace=ops",
        "--webhook-cert-dir=/w/tmp/k8s-webhook-server/serving-certs",
        "--kubeconfig=/k/kubeconfig",
    ]
    assert PROGRAMS["agent-sandbox-controller"].extra_env(pod) == {"AGENT_SANDBOX_WEBHOOK_HOST": "127.12.0.9"}


def test_explicit_args_win_and_every_wildcard_bind_is_rewritten() -> None:
    pod = _pod(
        "x/sandbox-router:v1",
        ["--http-bind-address=0.0.0.0:8080", "--health-probe-bind-address=:8081", "--https-bind-address="],
    )
    argv = pod_argv(
        pod, PROGRAMS["sandbox-router"], kubeconfig=Path("/k"), workdir=Path("/w"), bin_dir=Path("/b")
    )
    assert argv[1:4] == [
        "--http-bind-address=127.12.0.9:8080",
        "--health-probe-bind-address=127.12.0.9:8081",
        "--https-bind-address=",  # empty stays empty (disabled)
    ]
    controller = _pod("x/agent-sandbox-controller", ["--leader-election-namespace=elsewhere"])
    argv = pod_argv(
        controller,
        PROGRAMS["agent-sandbox-controller"],
        kubeconfig=Path("/k"),
        workdir=Path("/w"),
        bin_dir=Path("/b"),
    )
    assert [a for a in argv if a.startswith("--leader-election-namespace")] == [
        "--leader-election-namespace=elsewhere"
    ]


def test_probe_port_resolves_names() -> None:
    pod = _pod("x", [])
    assert probe_port(pod, "healthz") == 8081
    assert probe_port(pod, 9) == 9
    assert probe_port(pod, "10") == 10
    assert probe_port(pod, "nope") is None


def test_a_non_loopback_bind_is_refused() -> None:
    pod = _pod("x/sandbox-router", ["--http-bind-address=10.0.0.5:8080"])
    with pytest.raises(ValueError, match=r"only binds 127\.0\.0\.0/8"):
        pod_argv(
            pod, PROGRAMS["sandbox-router"], kubeconfig=Path("/k"), workdir=Path("/w"), bin_dir=Path("/b")
        )
