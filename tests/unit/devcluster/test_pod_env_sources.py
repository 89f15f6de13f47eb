"""The local runner reads a container's Secrets and ConfigMaps as a kubelet does (devcluster/pod_env.py):
`envFrom` first (prefix, later sources override earlier ones), then `env` overriding it, `configMapKeyRef` /
`secretKeyRef` (Secret values base64-decoded), `optional`, a missing non-optional source or key refusing the
container (CreateContainerConfigError), `resourceFieldRef`, and `$(VAR)` in `command`/`args` expanded with the
final environment. Until December 7 all of these were left out: a template taking its agent's API key from a
Secret ran without it in the dev cluster."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.devcluster.pod_env import (
    ContainerConfigError,
    EnvSources,
    container_env,
    expand_command,
    references,
)
from agent_sandbox.devcluster.podprocess import PROGRAMS, pod_argv
from agent_sandbox.devcluster.runtime_pods import runtime_pod

pytestmark = pytest.mark.unit


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


_SOURCES = EnvSources(
    config_maps={
        "cfg": {"data": {"MODE": "cfg-mode", "SHARED": "from-cfg", "dotted.key": "d", "1st": "one"}},
        "other": {"data": {"SHARED": "from-other"}, "binaryData": {"BIN": "AAE="}},
    },
    secrets={"creds": {"data": {"API_KEY": _b64("sk-123"), "SHARED": _b64("from-secret"), "RAW": "/w=="}}},
    allocatable={"cpu": "4", "memory": "8Gi"},
)


def _container(**fields: Any) -> dict[str, Any]:
    return {"name": "c", "image": "sandbox-runtime:latest", **fields}


def _pod(container: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"nodeName": "node-0", "containers": [container]},
        "status": {"podIP": "127.0.0.9"},
    }


def _env(container: dict[str, Any], sources: EnvSources = _SOURCES) -> dict[str, str]:
    return container_env(_pod(container), container, sources)


def test_env_from_first_in_order_then_env_overrides() -> None:
    container = _container(
        envFrom=[
            {"configMapRef": {"name": "cfg"}},
            {"secretRef": {"name": "creds"}},  # overrides cfg's SHARED
            {"configMapRef": {"name": "other"}, "prefix": "O_"},
            {"configMapRef": {"name": "absent", "optional": True}},  # adds nothing
            {"secretRef": {"name": "absent", "optional": True}},
        ],
        env=[
            {"name": "MODE", "value": "env-mode"},  # env overrides envFrom
            {"name": "URL", "value": "https://x/$(API_KEY)/$(O_SHARED)"},  # envFrom's are expandable
            {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "other", "key": "SHARED"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "API_KEY"}}},
            # an optional key that is missing leaves the variable as envFrom set it
            {
                "name": "SHARED",
                "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope", "optional": True}},
            },
            {"name": "GONE", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": True}}},
        ],
    )
    assert _env(container) == {
        "MODE": "env-mode",
        "SHARED": "from-secret",
        # kubelet no longer skips keys that are not C identifiers (relaxed env var names, KEP-4369)
        "dotted.key": "d",
        "1st": "one",
        "API_KEY": "sk-123",  # base64-decoded
        "RAW": "\udcff",  # not UTF-8: the byte survives (0xff)
        "O_SHARED": "from-other",  # a ConfigMap's binaryData is not env
        "URL": "https://x/sk-123/from-other",
        "FROM_CM": "from-other",
        "TOKEN": "sk-123",
    }


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"envFrom": [{"configMapRef": {"name": "absent"}}]}, 'configmap "absent" not found'),
        ({"envFrom": [{"secretRef": {"name": "absent"}}]}, 'secret "absent" not found'),
        (
            {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}]},
            'configmap "absent" not found',
        ),
        (
            {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}]},
            "couldn't find key k in ConfigMap ns/cfg",
        ),
        (
            {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}}]},
            "couldn't find key k in Secret ns/creds",
        ),
        (
            {
                "env": [
                    {
                        "name": "X",
                        "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k", "optional": False}},
                    }
                ]
            },
            "couldn't find key k in Secret ns/creds",
        ),
    ],
)
def test_a_missing_source_or_key_that_is_not_optional_refuses_the_container(
    entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ContainerConfigError) as err:
        _env(_container(**entry))
    assert str(err.value) == message


def test_references_name_what_is_read() -> None:
    container = _container(
        envFrom=[{"configMapRef": {"name": "a"}}, {"secretRef": {"name": "s1"}, "prefix": "P_"}],
        env=[
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "b", "key": "k"}}},
            {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "s2", "key": "k"}}},
            {"name": "Z", "value": "v", "valueFrom": {"secretKeyRef": {"name": "never", "key": "k"}}},
        ],
    )
    refs = references(container)
    assert (refs.config_maps, refs.secrets, refs.node) == (
        frozenset({"a", "b"}),
        frozenset({"s1", "s2"}),
        False,
    )
    cpu = {"name": "C", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}
    assert references(_container(env=[cpu])).node


@pytest.mark.parametrize(
    ("resources", "ref", "value"),
    [
        ({"limits": {"cpu": "500m"}}, {"resource": "limits.cpu", "divisor": "1m"}, "500"),
        ({"limits": {"cpu": "1500m"}}, {"resource": "limits.cpu"}, "2"),  # rounded up
        ({"limits": {"cpu": "250m"}}, {"resource": "limits.cpu", "divisor": "0"}, "1"),  # zero divisor: 1
        ({}, {"resource": "limits.cpu"}, "4"),  # no limit: the node's allocatable
        ({}, {"resource": "limits.memory", "divisor": "1Mi"}, "8192"),
        ({"requests": {"memory": "64Mi"}}, {"resource": "requests.memory", "divisor": "1Mi"}, "64"),
        ({"requests": {"memory": "1G"}}, {"resource": "requests.memory", "divisor": "1Mi"}, "954"),
        ({}, {"resource": "requests.cpu"}, "0"),  # no request: zero
        ({"limits": {"memory": "1e3"}}, {"resource": "limits.memory"}, "1000"),
    ],
)
def test_resource_field_ref(resources: dict[str, Any], ref: dict[str, Any], value: str) -> None:
    container = _container(resources=resources, env=[{"name": "R", "valueFrom": {"resourceFieldRef": ref}}])
    assert _env(container) == {"R": value}


def test_resource_field_ref_of_another_container() -> None:
    sidecar = {"name": "side", "image": "busybox", "resources": {"limits": {"memory": "2Ki"}}}
    ref = {"resource": "limits.memory", "containerName": "side"}
    container = _container(env=[{"name": "R", "valueFrom": {"resourceFieldRef": ref}}])
    pod = _pod(container)
    pod["spec"]["containers"].append(sidecar)
    assert container_env(pod, container, _SOURCES) == {"R": "2048"}


def test_command_and_args_expanded_with_the_final_env() -> None:
    container = _container(
        command=["/bin/$(TOOL)"],
        args=["--key=$(API_KEY)", "--mode=$(MODE)", "$$(MODE)", "$(UNKNOWN)", "$(HOSTNAME)"],
        envFrom=[{"secretRef": {"name": "creds"}}, {"configMapRef": {"name": "cfg"}}],
        env=[{"name": "TOOL", "value": "agent"}, {"name": "MODE", "value": "fast"}],
    )
    assert expand_command(container, _env(container)) == (
        ["/bin/agent"],
        ["--key=sk-123", "--mode=fast", "$(MODE)", "$(UNKNOWN)", "$(HOSTNAME)"],  # HOSTNAME: not declared
    )


def test_the_runtime_reads_its_flags_and_environment_so() -> None:
    """The runtime container's `args` are expanded before they are read as flags, and the runtime's own
    environment variables (SANDBOX_BASE_DIR) come from the container's environment."""
    container = _container(
        args=["--metadata-env-prefix=$(PREFIX)", "--legacy-port=$(PORT)"],
        envFrom=[{"secretRef": {"name": "creds"}}],
        env=[
            {"name": "PREFIX", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "MODE"}}},
            {"name": "PORT", "value": "9999"},
            {"name": "SANDBOX_BASE_DIR", "value": "/data"},
        ],
    )
    spec = runtime_pod(_pod(container), base_env={"PATH": "/bin"}, sources=_SOURCES)
    assert spec.problems == []
    assert spec.config.metadata_env_prefix == "cfg-mode"
    assert spec.config.legacy_port == 9999
    assert str(spec.config.root_dir) == "/data"
    assert spec.env["API_KEY"] == "sk-123"
    assert spec.env["PATH"] == "/bin"
    with pytest.raises(ContainerConfigError):
        runtime_pod(_pod(container), base_env={}, sources=EnvSources())


def test_the_project_s_own_pods_expand_their_args() -> None:
    pod = _pod(_container(image="x/agent-sandbox-controller:v1", args=["--zap-log-level=$(LEVEL)"]))
    argv = pod_argv(
        pod,
        PROGRAMS["agent-sandbox-controller"],
        kubeconfig=Path("/k"),
        workdir=Path("/w"),
        bin_dir=Path("/b"),
        env={"LEVEL": "debug"},
    )
    assert argv[1] == "--zap-log-level=debug"


def _resource_env(
    pod_resources: dict[str, Any] | None, resources: dict[str, Any], ref: dict[str, Any]
) -> str:
    container = _container(resources=resources, env=[{"name": "R", "valueFrom": {"resourceFieldRef": ref}}])
    pod = _pod(container)
    if pod_resources is not None:
        pod["spec"]["resources"] = pod_resources
    sources = EnvSources(allocatable={"cpu": "4", "memory": "8Gi", "hugepages-2Mi": "1Gi"})
    return container_env(pod, container, sources)["R"]


@pytest.mark.parametrize(
    ("pod_resources", "resources", "ref", "value"),
    [
        # kubelet 1.35 defaultPodLimitsForDownwardAPI: with PodLevelResources (beta, on) a pod-level cpu or
        # memory limit is the default of an unset container limit, not the node's allocatable
        ({"limits": {"cpu": "2"}}, {}, {"resource": "limits.cpu"}, "2"),
        ({"limits": {"memory": "1Gi"}}, {}, {"resource": "limits.memory", "divisor": "1Mi"}, "1024"),
        ({"limits": {"memory": "1Gi"}}, {}, {"resource": "limits.cpu"}, "4"),  # only that resource
        ({"limits": {"cpu": "2"}}, {"limits": {"cpu": "1"}}, {"resource": "limits.cpu"}, "1"),  # own wins
        # MergeContainerResourceLimits: a zero limit is unset; hugepages are never defaulted
        (None, {"limits": {"cpu": "0"}}, {"resource": "limits.cpu"}, "4"),
        (None, {}, {"resource": "limits.hugepages-2Mi"}, "0"),
    ],
)
def test_resource_field_ref_limits_default_as_kubelet_135(
    pod_resources: dict[str, Any] | None, resources: dict[str, Any], ref: dict[str, Any], value: str
) -> None:
    assert _resource_env(pod_resources, resources, ref) == value


def test_resource_field_ref_of_an_init_container_is_not_defaulted() -> None:
    """findContainerInPod also searches initContainers; the defaulted pod merges only spec.containers."""
    init = {"name": "init", "image": "busybox", "resources": {"requests": {"memory": "2Ki"}}}
    env = [
        {
            "name": "R",
            "valueFrom": {"resourceFieldRef": {"resource": "requests.memory", "containerName": "init"}},
        },
        {"name": "L", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "containerName": "init"}}},
    ]
    container = _container(env=env)
    pod = _pod(container)
    pod["spec"]["initContainers"] = [init]
    assert container_env(pod, container, _SOURCES) == {"R": "2048", "L": "0"}
