"""The local runner builds a container's environment as a kubelet does (devcluster/pod_env.py): an empty value is
set (`E=`), `$(VAR)` references to earlier entries are expanded, label and annotation `fieldRef`s resolve.
Until December 7 the first was dropped, the second passed through literally, the third dropped (probe p1) -
for the runtimes' commands and for the project's own pods' processes alike."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent_sandbox.devcluster import podprocess
from agent_sandbox.devcluster.pod_env import container_env, expand
from agent_sandbox.devcluster.runtime_pods import runtime_pod

pytestmark = pytest.mark.unit

_VARS = {"VAR_A": "A", "VAR_B": "B", "VAR_EMPTY": ""}


@pytest.mark.parametrize(
    ("value", "expanded"),
    [
        ("$(VAR_A)", "A"),
        ("___$(VAR_B)___", "___B___"),
        ("$(VAR_A)-$(VAR_A)", "A-A"),
        ("$(VAR_A)$(VAR_B)", "AB"),
        ("x$(VAR_EMPTY)y", "xy"),
        ("$(VAR_DNE)", "$(VAR_DNE)"),  # unknown: kept as written
        ("$()", "$()"),
        ("$$(VAR_A)", "$(VAR_A)"),  # `$$` escapes
        ("$$$(VAR_A)", "$A"),
        ("$$$$(VAR_A)", "$$(VAR_A)"),
        ("f000-$$VAR_A", "f000-$VAR_A"),
        ("$$", "$"),
        ("$(VAR_A)$$", "A$"),
        ("$VAR_A", "$VAR_A"),  # no parenthesis: not a reference
        ("$", "$"),
        ("x$", "x$"),
        ("$(VAR_A", "$(VAR_A"),  # unterminated
        ("$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"),  # the name runs to the first `)`: unknown
        ("$(VAR_A)$(", "A$("),
        ("héllo $(VAR_A) wörld", "héllo A wörld"),
    ],
)
def test_expand_follows_kubernetes(value: str, expanded: str) -> None:
    assert expand(value, _VARS.get) == expanded


def _pod(env: list[dict[str, Any]], image: str = "sandbox-runtime:latest") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "envexp",
            "namespace": "ns",
            "uid": "u1",
            "labels": {"x": "ex", "app": "a"},
            "annotations": {"note": "n=1"},
        },
        "spec": {
            "nodeName": "kwok-node-0",
            "serviceAccountName": "sa",
            "containers": [{"name": "c", "image": image, "env": env}],
        },
        "status": {"podIP": "127.0.0.7", "podIPs": [{"ip": "127.0.0.7"}], "hostIP": "127.0.0.1"},
    }


#: probe p1's Sandbox, with a few more of kubelet's rules
_ENV: list[dict[str, Any]] = [
    {"name": "A", "value": "alpha"},
    {"name": "B", "value": "$(A)-beta"},
    {"name": "E"},  # `value: ""`, as the API server stores it (omitempty)
    {"name": "LBL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['x']"}}},
    {"name": "NONE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['missing']"}}},
    {
        "name": "NOTE",
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.annotations['note']"}},
    },
    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    {"name": "IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    {"name": "LATER", "value": "$(C)/$(HOSTNAME)"},  # C comes later, HOSTNAME is the runtime's: not declared
    {"name": "C", "value": "c"},
    {"name": "NOTEXP", "value": "$(NOTE)!"},  # a fieldRef's value may be referred to, once declared
    {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},  # without sources: left out
    {"name": "A", "value": "$(A)$(A)"},  # declared again: refers to the earlier A
]

_EXPECTED = {
    "A": "alphaalpha",
    "B": "alpha-beta",
    "E": "",
    "LBL": "ex",
    "NONE": "",
    "NOTE": "n=1",
    "IP": "127.0.0.7",
    "IPS": "127.0.0.7",
    "NODE": "kwok-node-0",
    "LATER": "$(C)/$(HOSTNAME)",
    "C": "c",
    "NOTEXP": "n=1!",
}


def test_container_env_as_a_kubelet_builds_it() -> None:
    pod = _pod(_ENV)
    assert container_env(pod, pod["spec"]["containers"][0]) == _EXPECTED


def test_the_runtime_s_commands_get_it() -> None:
    env = runtime_pod(_pod(_ENV), base_env={"PATH": "/bin"}).env
    assert env == {"PATH": "/bin", "LANG": "C.UTF-8", "HOSTNAME": "envexp", **_EXPECTED}


def test_the_project_s_own_pods_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The stand-in kubelet for the controller and router pods (podprocess.py) builds it the same way."""
    started: dict[str, dict[str, str]] = {}

    def add_process(name: str, argv: list[str], *, env: dict[str, str]) -> object:
        started[name] = env
        return object()

    def request(method: str, path: str) -> tuple[int, dict[str, Any]]:  # the Secret it reads
        assert (method, path) == ("GET", "/api/v1/namespaces/ns/secrets/s")
        return 200, {"data": {"k": "c2VjcmV0"}}

    admin = SimpleNamespace(request=request)
    cluster = SimpleNamespace(directory=tmp_path, add_process=add_process, admin=lambda: admin)
    monkeypatch.setattr(podprocess, "token_kubeconfig", lambda *a, **k: tmp_path / "kubeconfig")
    processes = podprocess.PodProcesses(cluster=cluster)  # type: ignore[arg-type]
    processes._start(_pod(_ENV, image="registry.k8s.io/agent-sandbox/agent-sandbox-controller:v1"))
    assert started["pod-ns-envexp"] == {
        **_EXPECTED,
        "KEY": "secret",
        "AGENT_SANDBOX_WEBHOOK_HOST": "127.0.0.7",
    }
