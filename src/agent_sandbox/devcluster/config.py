"""Knobs of one dev cluster and the files it writes (kubeconfigs, scheduler config, kwok stages).

Owns: `ClusterConfig` (defaults for tests, tunables for benchmarks) and rendering of the static files the
components read. Nothing here starts a process.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

# The dev cluster's Service range. ClusterIPs are only ever allocated, never dialled: there is no
# kube-proxy, and every component and webhook is reached through a loopback URL.
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
NODE_ANNOTATION = "kwok.x-k8s.io/node"

# Knobs of the simulated behaviours (docs/devcluster.md). The kwok stages in stages/ spell the same names.
SIM_PREFIX = "devcluster.agents.x-k8s.io/"
EXIT_CODE_ANNOTATION = SIM_PREFIX + "exit-code"
EXIT_AFTER_ANNOTATION = SIM_PREFIX + "exit-after"
START_AFTER_ANNOTATION = SIM_PREFIX + "start-after"
READINESS_ANNOTATION = SIM_PREFIX + "readiness"
READINESS_EXTERNAL = "external"
TERMINATE_AT_ANNOTATION = SIM_PREFIX + "terminate-at"
NOT_READY_LABEL = SIM_PREFIX + "not-ready"
HOST_PATH_ANNOTATION = SIM_PREFIX + "host-path"

# ClusterConfig.pod_deletion values, and the stage files each one leaves out (docs/devcluster.md).
POD_DELETION_GRACEFUL = "graceful"
POD_DELETION_INSTANT = "instant"
_DELETION_STAGES = {
    POD_DELETION_GRACEFUL: frozenset({"pod-delete-instant.yaml"}),
    POD_DELETION_INSTANT: frozenset(
        {"pod-not-ready-on-delete.yaml", "pod-terminating.yaml", "pod-terminated.yaml", "pod-delete.yaml"}
    ),
}

# Storage: one provisioner name, two classes (docs/devcluster.md "Storage").
PROVISIONER_NAME = "devcluster.agents.x-k8s.io/hostpath"
STORAGE_CLASS_IMMEDIATE = "standard"
STORAGE_CLASS_WFFC = "standard-wffc"
PROVISIONER_USER = "agent-sandbox:volume-provisioner"

# kwok's own default pod stage parallelism (what kwokctl runs upstream's KWOK gate with).
KWOK_POD_PARALLELISM = 4


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Everything `dev up` can tune. Defaults suit tests; benchmarks raise limits and nodes."""

    name: str = "default"
    nodes: int = 1
    node_cpu: str = "32"
    node_memory: str = "256Gi"
    node_pods: int = 1100
    max_requests_inflight: int = 800
    max_mutating_requests_inflight: int = 400
    etcd_unsafe_no_fsync: bool = True
    scheduler_qps: float = 200.0
    scheduler_burst: int = 400
    controller_manager_qps: float = 200.0
    controller_manager_burst: int = 400
    # Pod stage plays kwok runs at once (its `podPlayStageParallelism`, default 4; kwok's client is not
    # rate-limited). Every simulated kubelet write - a pod turning Ready, a deleted pod going away - waits for
    # one of these, so under a busy API server 4 of them become a queue that no real cluster has (one kubelet
    # per node): the soak's pods took a median 2.9 s (up to 13 s) to start with instant stages
    # (docs/reliability.md).
    kwok_pod_parallelism: int = KWOK_POD_PARALLELISM
    # Bound for each component to become ready, in seconds.
    ready_timeout: float = 90.0
    # A scheduled pod's containers start (Running, Ready) after pod_start_delay_ms plus a uniformly random
    # 0..pod_start_jitter_ms, unless its start-after annotation says otherwise. 0/0 is kwok's instant start
    # (what upstream's KWOK scalability gate measures; the benchmarks use it).
    pod_start_delay_ms: int = 800
    pod_start_jitter_ms: int = 400
    # A deleted pod stays Terminating for min(its grace period, this cap) before its containers stop.
    pod_grace_period_cap_ms: int = 1000
    # How kwok ends a deleted pod: POD_DELETION_GRACEFUL (NotReady at once, Terminating for the capped grace
    # period, terminated status, then removed: a kubelet's writes) or POD_DELETION_INSTANT (removed at once,
    # kwok's fast pod-delete stage as upstream's KWOK gate runs it: one DELETE, no status writes).
    pod_deletion: str = POD_DELETION_GRACEFUL
    # Delay before a pod marked to exit (exit-code annotation or `exit N` command) completes, unless the pod's
    # exit-after annotation says otherwise.
    pod_exit_delay_ms: int = 1000
    # Which of the two StorageClasses ("standard": Immediate, "standard-wffc": WaitForFirstConsumer) is the
    # cluster default.
    default_storage_class: str = STORAGE_CLASS_IMMEDIATE
    # Serve kube-apiserver's /debug/pprof (benchmarks profile the API server; off like a hardened cluster).
    apiserver_profiling: bool = False
    # Run the local runner: runtime pods (runtime image or annotation) really execute (docs/devcluster.md).
    runner: bool = True
    # Route the API server's calls to Services (webhooks by Service reference) to Ready pods' 127.x IPs
    # through the `service-proxy` component (devcluster/serviceproxy.py), as kube-proxy would on a node.
    service_proxy: bool = False
    # Write kube-apiserver's audit log (`logs/audit.log`, JSON lines, policy `audit_policy_yaml`): every
    # write with who sent it, counted from outside the controller (`devcluster/audit.py` reads it).
    audit_log: bool = False
    # With `audit_log`: every write's request body and Events too (probes that ask what each write changed).
    audit_bodies: bool = False
    # Extra kube-apiserver flags, appended last (a later flag wins), e.g. "--feature-gates=ListFromCacheSnapshot=false"
    # for an experiment that asks what one of its features costs; like kind's `apiServer.extraArgs`.
    apiserver_extra_args: tuple[str, ...] = ()


def kubeconfig_yaml(*, name: str, server: str, ca: Path, cert: Path, key: Path, user: str) -> str:
    """Render a one-context kubeconfig with file references (readable by kubectl and client libraries)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
        "preferences": {},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def scheduler_config_yaml(kubeconfig: Path, cfg: ClusterConfig) -> str:
    """KubeSchedulerConfiguration: client QPS/burst only apply through the config file."""
    doc = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {
            "kubeconfig": str(kubeconfig),
            "qps": cfg.scheduler_qps,
            "burst": cfg.scheduler_burst,
        },
        "leaderElection": {"leaderElect": False},
    }
    return yaml.safe_dump(doc, sort_keys=False)


# jq over a pod: "ready" while its Ready or ContainersReady condition is True or any container is ready, else
# "not-ready". pod-not-ready-on-delete acts on "ready" deleted pods and pod-terminating on "not-ready" ones:
# one expression for both keeps the two selectors exclusive (kwok picks at random among matching stages).
POD_READINESS_EXPRESSION = (
    'if ([.status.conditions[]? | select(.type == "Ready" or .type == "ContainersReady") | .status == "True"]'
    ' + [.status.containerStatuses[]? | .ready == true] | any) then "ready" else "not-ready" end'
)


def readiness_held_jq() -> str:
    """jq over a pod: "held" when something outside kwok decides its readiness, else "kwok".

    Held: a runtime pod (`runtime_pods.is_runtime_pod`: the local runner sets it Ready once its runtime
    answers) or a pod annotated `devcluster.agents.x-k8s.io/readiness: external` (any other component,
    `DevCluster.set_pod_ready`). pod-ready starts "kwok" pods Ready; pod-start-held starts "held" ones not
    Ready. One expression for both keeps them exclusive.
    """
    from agent_sandbox.devcluster.runtime_pods import runtime_pod_jq

    return (
        f'if (({runtime_pod_jq()}) == "yes") '
        f'or ((.metadata.annotations // {{}})["{READINESS_ANNOTATION}"] == "{READINESS_EXTERNAL}") '
        'then "held" else "kwok" end'
    )


def stage_placeholders(cfg: ClusterConfig) -> dict[str, str]:
    """`@@NAME@@` markers in stages/*.yaml and the ClusterConfig values that replace them."""
    return {
        "POD_READINESS_HELD_JQ": readiness_held_jq(),
        "POD_GRACE_PERIOD_CAP_MS": str(int(cfg.pod_grace_period_cap_ms)),
        "POD_EXIT_DELAY_MS": str(int(cfg.pod_exit_delay_ms)),
        "POD_START_DELAY_MS": str(int(cfg.pod_start_delay_ms)),
        # kwok draws a stage's delay uniformly from [durationMilliseconds, jitterDurationMilliseconds).
        "POD_START_DELAY_MAX_MS": str(int(cfg.pod_start_delay_ms) + int(cfg.pod_start_jitter_ms)),
        "POD_READINESS_EXPRESSION": POD_READINESS_EXPRESSION,
    }


# kwok v0.8.0 applies its option defaults only when no KwokConfiguration is given (config/vars.go), so ours
# restates every defaulted option (v1alpha1/zz_generated.defaults.go; a missing nodeLeaseParallelism made
# kwok exit). Flags on kwok's command line (components.kwok_argv) still override these.
_KWOK_DEFAULT_OPTIONS: dict[str, Any] = {
    "cidr": "10.0.0.0/24",
    "manageAllNodes": False,
    "enableDebuggingHandlers": True,
    "enableContentionProfiling": False,
    "enableProfilingHandler": True,
    "podPlayStageParallelism": KWOK_POD_PARALLELISM,
    "nodePlayStageParallelism": 4,
    "nodeLeaseParallelism": 4,
    "podsOnNodeSyncParallelism": 1,
    "enablePodsOnNodeSyncListPager": True,
    "enablePodsOnNodeSyncStreamWatch": False,
}


def _kwok_configuration(cfg: ClusterConfig) -> str:
    doc = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {**_KWOK_DEFAULT_OPTIONS, "podPlayStageParallelism": cfg.kwok_pod_parallelism},
    }
    return yaml.safe_dump(doc, sort_keys=False).strip()


def kwok_stages_yaml(cfg: ClusterConfig) -> str:
    """kwok's configuration and the Stage documents the dev cluster runs (docs/devcluster.md: each behaviour).

    Raises:
        ValueError: a stage file holds a `@@NAME@@` marker that no knob fills (a typo in a stage), a negative
            delay, or an unknown `pod_deletion`.
    """
    if cfg.pod_deletion not in _DELETION_STAGES:
        raise ValueError(f"pod_deletion must be one of {sorted(_DELETION_STAGES)}, not {cfg.pod_deletion!r}")
    left_out = _DELETION_STAGES[cfg.pod_deletion]
    for knob in ("pod_grace_period_cap_ms", "pod_exit_delay_ms", "pod_start_delay_ms", "pod_start_jitter_ms"):
        if getattr(cfg, knob) < 0:
            raise ValueError(f"{knob} must be >= 0, not {getattr(cfg, knob)}")
    if cfg.kwok_pod_parallelism < 1:
        raise ValueError(f"kwok_pod_parallelism must be >= 1, not {cfg.kwok_pod_parallelism}")
    docs: list[str] = [_kwok_configuration(cfg)]
    values = stage_placeholders(cfg)
    stage_dir = resources.files("agent_sandbox.devcluster") / "stages"
    for entry in sorted(stage_dir.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml") and entry.name not in left_out:
            text = entry.read_text()
            for key, value in values.items():
                text = text.replace(f"@@{key}@@", value)
            if "@@" in text:
                raise ValueError(f"stage {entry.name} has an unknown @@ placeholder")
            docs.append(text.strip())
    return "\n---\n".join(docs) + "\n"


# Users whose writes the audit log leaves out: kwok heartbeats and pod status writes dwarf everything else
# and say nothing about the controller.
AUDIT_IGNORED_USERS = ("kwok",)


def audit_policy_yaml(*, bodies: bool = False) -> str:
    """kube-apiserver's audit Policy: every write at Metadata level (verb, object, user, user agent,
    response code); Sandbox creates with their response (a generated name and the owner are known only
    then) and Sandbox patches/updates with their request (a claim's takeover of a warm member is a JSON
    patch of `ownerReferences`); reads, Events, node Leases and kwok are left out. Rules match top-down,
    first match wins.

    Only Sandbox creates are also logged at RequestReceived: a SIGKILLed kube-apiserver can commit a
    create to etcd and die before it logs the response, and the (blocking-mode) RequestReceived line,
    written before the request is handled, is then the only trace that the create was in flight.
    A per-rule `omitStages` adds to the policy-wide one, so the omission is per rule.

    `bodies`: Events are logged too, and every write at Request level (what each write changed)."""
    events_none: list[dict[str, Any]] = [
        {"level": "None", "resources": [{"group": "", "resources": ["events"]}, {"group": "events.k8s.io"}]}
    ]
    every_body: list[dict[str, Any]] = [{"level": "Request", "omitStages": ["RequestReceived"]}]
    rules: list[dict[str, Any]] = [
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "None", "users": list(AUDIT_IGNORED_USERS)},
        {"level": "None", "namespaces": ["kube-node-lease"]},
        *([] if bodies else events_none),
        {
            "level": "RequestResponse",
            "verbs": ["create"],
            "resources": [{"group": "agents.x-k8s.io", "resources": ["sandboxes"]}],
        },
        {
            "level": "Request",
            "verbs": ["patch", "update"],
            "resources": [{"group": "agents.x-k8s.io", "resources": ["sandboxes"]}],
            "omitStages": ["RequestReceived"],
        },
        *(every_body if bodies else []),
        {"level": "Metadata", "omitStages": ["RequestReceived"]},
    ]
    doc = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitManagedFields": True, "rules": rules}
    return yaml.safe_dump(doc, sort_keys=False)


def storage_class_manifests(cfg: ClusterConfig) -> list[dict[str, Any]]:
    """The two StorageClasses served by the host-side provisioner; `cfg.default_storage_class` is default."""
    if cfg.default_storage_class not in (STORAGE_CLASS_IMMEDIATE, STORAGE_CLASS_WFFC):
        raise ValueError(
            f"default_storage_class must be {STORAGE_CLASS_IMMEDIATE!r} or {STORAGE_CLASS_WFFC!r}, "
            f"not {cfg.default_storage_class!r}"
        )
    out: list[dict[str, Any]] = []
    for name, mode in ((STORAGE_CLASS_IMMEDIATE, "Immediate"), (STORAGE_CLASS_WFFC, "WaitForFirstConsumer")):
        default = "true" if name == cfg.default_storage_class else "false"
        out.append(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {
                    "name": name,
                    "annotations": {"storageclass.kubernetes.io/is-default-class": default},
                },
                "provisioner": PROVISIONER_NAME,
                "reclaimPolicy": "Delete",
                "volumeBindingMode": mode,
                "allowVolumeExpansion": False,
            }
        )
    return out


def provisioner_binding_manifest() -> dict[str, Any]:
    """Bind the provisioner's client identity to Kubernetes' built-in provisioner role (least privilege)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "agent-sandbox:volume-provisioner"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "system:persistent-volume-provisioner",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": PROVISIONER_USER}],
    }


def node_manifest(name: str, cfg: ClusterConfig) -> dict[str, object]:
    """A fake Node that kwok manages; capacity makes scheduling pressure real."""
    capacity = {"cpu": cfg.node_cpu, "memory": cfg.node_memory, "pods": str(cfg.node_pods)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/role": "agent",
                "node-role.kubernetes.io/agent": "",
                "type": "kwok",
            },
        },
        "spec": {},
        "status": {"allocatable": capacity, "capacity": capacity},
    }
