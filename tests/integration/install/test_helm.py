"""The Helm chart (operations §5): lint, template (every value, upstream's argument rendering), install ->
controller ready -> upgrade keeps sandboxes -> uninstall, with helm v3 built from its Go module."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_sandbox.devcluster import ensure_binaries
from agent_sandbox.devcluster.install import helm
from agent_sandbox.manifests import LEADER_ELECTION_NAME, LEADER_ELECTION_ROLE, LEASE_NAME, REPO_ROOT, role
from tests.helpers import wait_for
from tests.integration.install.conftest import SYSTEM_NS, Installed, leads_with_ca

pytestmark = pytest.mark.integration

CHART = str(REPO_ROOT / "helm")
SELECTOR = {"app.kubernetes.io/name": "agent-sandbox", "app.kubernetes.io/instance": "agent-sandbox"}


def _helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """helm without a cluster (lint, template)."""
    out = subprocess.run([str(ensure_binaries().path("helm")), *args], capture_output=True, text=True)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def _template(
    *values: str, release: str = "agent-sandbox", namespace: str = "default"
) -> list[dict[str, Any]]:
    out = _helm("template", release, CHART, "--namespace", namespace, *values)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def _args(docs: list[dict[str, Any]]) -> list[str]:
    args: list[str] = _one(docs, "Deployment", "agent-sandbox-controller")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    return args


def test_lint() -> None:
    out = _helm("lint", CHART, "--strict", "--set", "image.tag=v0.1.0")
    assert "0 chart(s) failed" in out.stdout
    every = [
        "--set",
        "image.tag=v0.1.0",
        "--set",
        "router.enabled=true",
        "--set",
        "controller.extensions=true",
    ]
    every += ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true"]
    assert "0 chart(s) failed" in _helm("lint", CHART, "--strict", *every).stdout


def test_stock_values_render_upstreams_arguments_and_objects() -> None:
    docs = _template("--set", "image.tag=v0.1.0")
    assert _args(docs) == [
        "--leader-elect=true",
        "--extensions=false",
        "--webhook-service-name=agent-sandbox-webhook-service",
        "--webhook-namespace=agent-sandbox-system",
    ]
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert kinds == [
        ("ClusterRole", "agent-sandbox-controller"),
        ("ClusterRole", "agent-sandbox-controller-extensions"),  # always rendered, like upstream's
        ("ClusterRoleBinding", "agent-sandbox-controller"),
        # Not the SandboxArchive CRD: without a cluster to look it up in, only with lifecycle on (a real install
        # renders it with lifecycle off too: test_rollback_between_lifecycle_on_and_off).
        ("Deployment", "agent-sandbox-controller"),
        ("Namespace", "agent-sandbox-system"),
        ("Role", "agent-sandbox-controller"),
        ("Role", "agent-sandbox-controller-leader-election"),  # not upstream's: leases are not cluster-wide
        ("RoleBinding", "agent-sandbox-controller"),
        ("RoleBinding", "agent-sandbox-controller-leader-election"),
        ("Service", "agent-sandbox-controller"),
        ("Service", "agent-sandbox-webhook-service"),
        ("ServiceAccount", "agent-sandbox-controller"),
    ]
    dep = _one(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.k8s.io/agent-sandbox/agent-sandbox-controller:v0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "healthz"},
        "initialDelaySeconds": 15,
        "periodSeconds": 20,
    }
    assert container["readinessProbe"] == {
        "httpGet": {"path": "/readyz", "port": "healthz"},
        "initialDelaySeconds": 5,
        "periodSeconds": 10,
    }
    assert {"name": "config-volume", "configMap": {"name": "agent-sandbox-config", "optional": True}} in pod[
        "volumes"
    ]
    for key in ("resources", "securityContext"):
        assert key not in container
    for key in ("securityContext", "nodeSelector", "tolerations", "affinity", "imagePullSecrets"):
        assert key not in pod
    assert dep["metadata"]["labels"]["app.kubernetes.io/version"] == "v0.1.0"
    assert dep["spec"]["selector"]["matchLabels"] == SELECTOR
    for doc in docs:
        # The generated roles and CRD are byte-identical to k8s/ (no chart labels).
        if doc["kind"] not in ("ClusterRole", "CustomResourceDefinition"):
            assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", doc["kind"]
    # The generated ClusterRoles are byte-identical copies of k8s/ (checked by `generate --check`) and render
    # to the same objects.
    for name, path in (
        ("agent-sandbox-controller", "rbac.generated.yaml"),
        ("agent-sandbox-controller-extensions", "extensions-rbac.generated.yaml"),
    ):
        assert _one(docs, "ClusterRole", name) == yaml.safe_load(
            (REPO_ROOT / "k8s" / path).read_text().split("---\n", 1)[1]
        )


def test_image_tag_is_required() -> None:
    out = _helm("template", "x", CHART, check=False)
    assert out.returncode != 0
    assert "image.tag is required" in out.stderr


def test_every_named_controller_value_becomes_its_flag() -> None:
    values = {
        "controller": {
            "leaderElect": False,
            "extensions": True,
            "extraArgs": ["--api-connections=2", "--zap-log-level=debug"],
            "clusterDomain": "example.org",
            "leaderElectionNamespace": "le",
            "enableTracing": True,
            "enablePprof": True,
            "enablePprofDebug": False,
            "pprofBlockProfileRate": 1000000,
            "pprofMutexProfileFraction": 10,
            "kubeApiQps": 1000,
            "kubeApiBurst": 2000,
            "sandboxConcurrentWorkers": 400,
            "sandboxClaimConcurrentWorkers": 400,
            "sandboxWarmPoolConcurrentWorkers": 10,
            "sandboxTemplateConcurrentWorkers": 2,
            "sandboxWarmPoolMaxBatchSize": 300,
            "sandboxWarmPoolReadinessGracePeriod": "2m",
            "sandboxWarmPoolUnschedulableRecheckInterval": "30s",
            "enableWarmPoolEviction": False,
        },
        "webhookServiceName": "",
        "image": {"tag": "v1"},
    }
    out = subprocess.run(
        [str(ensure_binaries().path("helm")), "template", "r", CHART, "-f", "-"],
        input=yaml.safe_dump(values),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert _args(docs) == [
        "--leader-elect=false",
        "--extensions=true",
        "--cluster-domain=example.org",
        "--leader-election-namespace=le",
        "--enable-tracing=true",
        "--enable-pprof=true",
        "--enable-pprof-debug=false",
        "--pprof-block-profile-rate=1000000",
        "--pprof-mutex-profile-fraction=10",
        "--kube-api-qps=1000",
        "--kube-api-burst=2000",
        "--sandbox-concurrent-workers=400",
        "--sandbox-claim-concurrent-workers=400",
        "--sandbox-warm-pool-concurrent-workers=10",
        "--sandbox-template-concurrent-workers=2",
        "--sandbox-warm-pool-max-batch-size=300",
        "--sandbox-warm-pool-readiness-grace-period=2m",
        "--sandbox-warm-pool-unschedulable-recheck-interval=30s",
        "--enable-warm-pool-eviction=false",
        # webhookServiceName empty: no --webhook-service-name (the binary default applies)
        "--webhook-namespace=agent-sandbox-system",
        "--api-connections=2",
        "--zap-log-level=debug",
    ]
    _one(docs, "ClusterRoleBinding", "agent-sandbox-controller-extensions")  # only with extensions
    assert (
        _args(_template("--set", "image.tag=v1", "--set", "controller.kubeApiQps=12.5"))[2]
        == "--kube-api-qps=12.5"
    )


def test_lease_grants_are_a_role_in_the_leader_election_namespace() -> None:
    """The chart's leader-election Role holds LEADER_ELECTION_ROLE, in the namespace the controller elects in:
    the last --leader-election-namespace it gets, from controller.extraArgs (any form Go's flag package reads)
    or controller.leaderElectionNamespace, else the chart's namespace; the ClusterRoles grant no Lease
    anywhere (tenant10 finding 4). Until December 7 extraArgs were not read: the Role stayed in the chart's
    namespace and the controller got Forbidden on its Lease."""
    subject = [{"kind": "ServiceAccount", "name": "agent-sandbox-controller", "namespace": "ops"}]
    cases: list[tuple[tuple[str, ...], str]] = [
        ((), "ops"),
        (("--set", "controller.leaderElectionNamespace=le"), "le"),
        (("--set-json", 'controller.extraArgs=["--leader-election-namespace=ex"]'), "ex"),
        (("--set-json", 'controller.extraArgs=["-leader-election-namespace", "ex", "--zap-devel"]'), "ex"),
        # extraArgs follow the named flags: the binary takes the last value
        (
            (
                "--set", "controller.leaderElectionNamespace=le",
                "--set-json", 'controller.extraArgs=["--leader-election-namespace=ex"]',
            ),
            "ex",
        ),
        # empty: the binary auto-detects its own namespace, the chart's
        (
            (
                "--set", "controller.leaderElectionNamespace=le",
                "--set-json", 'controller.extraArgs=["--leader-election-namespace="]',
            ),
            "ops",
        ),
        (("--set-json", 'controller.extraArgs=["--leader-election-namespaces=x"]'), "ops"),  # another flag
    ]  # fmt: skip
    for values, lease_ns in cases:
        docs = _template("--set", "image.tag=v1", "--set", "namespace.name=ops", *values)
        got = _one(docs, "Role", LEADER_ELECTION_NAME)
        assert got["metadata"]["namespace"] == lease_ns
        assert got["rules"] == role(LEADER_ELECTION_NAME, lease_ns, LEADER_ELECTION_ROLE)["rules"]
        binding = _one(docs, "RoleBinding", LEADER_ELECTION_NAME)
        assert binding["metadata"]["namespace"] == lease_ns
        assert binding["roleRef"]["name"] == LEADER_ELECTION_NAME
        assert binding["subjects"] == subject
        for cluster_role in (d for d in docs if d["kind"] == "ClusterRole"):
            assert not [r for r in cluster_role["rules"] if "leases" in r["resources"]], cluster_role


def test_namespace_pod_and_scheduling_values() -> None:
    docs = _template(
        "--set", "image.tag=v1",
        "--set", "namespace.create=false",
        "--set", "namespace.name=",
        "--set", "replicaCount=2",
        "--set", "podLabels.team=a",
        "--set", "podLabels.app\\.kubernetes\\.io/name=spoofed",
        "--set", "podAnnotations.note=x",
        "--set", "imagePullSecrets[0].name=regcred",
        "--set", "resources.limits.memory=1Gi",
        "--set", "nodeSelector.pool=ctl",
        "--set", "tolerations[0].key=dedicated",
        "--set", "podSecurityContext.runAsNonRoot=true",
        "--set", "containerSecurityContext.readOnlyRootFilesystem=true",
        "--set", "service.name=metrics-svc",
        "--set", "webhookServiceName=wh",
        "--set", "nameOverride=sbx",
        namespace="ops",
    )  # fmt: skip
    assert not [d for d in docs if d["kind"] == "Namespace"]
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"):
            assert doc["metadata"]["namespace"] == "ops", doc["kind"]
    assert _args(docs)[-2:] == ["--webhook-service-name=wh", "--webhook-namespace=ops"]
    dep = _one(docs, "Deployment")
    template = dep["spec"]["template"]
    assert template["metadata"]["labels"] == {
        "app.kubernetes.io/name": "sbx",  # the selector label wins over podLabels
        "app.kubernetes.io/instance": "agent-sandbox",
        "team": "a",
    }
    assert template["metadata"]["annotations"] == {"note": "x"}
    assert dep["spec"]["replicas"] == 2
    pod = template["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"pool": "ctl"}
    assert pod["tolerations"] == [{"key": "dedicated"}]
    assert pod["securityContext"] == {"runAsNonRoot": True}
    assert pod["containers"][0]["securityContext"] == {"readOnlyRootFilesystem": True}
    assert pod["containers"][0]["resources"] == {"limits": {"memory": "1Gi"}}
    assert _one(docs, "Service", "metrics-svc")["spec"]["selector"]["app.kubernetes.io/name"] == "sbx"
    assert _one(docs, "Service", "wh")["spec"]["ports"][0]["targetPort"] == "webhook"


def test_monitoring_objects() -> None:
    docs = _template(
        "--set", "image.tag=v1",
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.serviceMonitor.additionalLabels.release=kube-prometheus-stack",
        "--set", "metrics.serviceMonitor.scrapeTimeout=10s",
        "--set", "metrics.prometheusRule.enabled=true",
        "--set-json", 'metrics.prometheusRule.additionalGroups=[{"name":"extra","rules":[]}]',
    )  # fmt: skip
    monitor = _one(docs, "ServiceMonitor", "agent-sandbox-controller")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "scheme": "http", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    metrics_svc = _one(docs, "Service", "agent-sandbox-controller")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics_svc["metadata"]["labels"].items()
    rule = _one(docs, "PrometheusRule", "agent-sandbox-controller")
    groups = rule["spec"]["groups"]
    assert [g["name"] for g in groups] == ["agent-sandbox-controller.rules", "extra"]
    (alert,) = groups[0]["rules"]
    assert alert["alert"] == "AgentSandboxControllerMetricsTargetsDown"
    assert alert["for"] == "5m"
    assert alert["labels"] == {"severity": "warning"}
    assert 'up{job="agent-sandbox-controller",namespace="agent-sandbox-system"}' in alert["expr"]


def test_router_is_opt_in() -> None:
    assert not [d for d in _template("--set", "image.tag=v1") if "router" in d["metadata"]["name"]]
    docs = _template("--set", "image.tag=v1", "--set", "router.enabled=true")
    dep = _one(docs, "Deployment", "sandbox-router")
    assert dep["spec"]["template"]["metadata"]["labels"]["app"] == "sandbox-router"
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.k8s.io/agent-sandbox/sandbox-router:v1"
    assert container["args"] == [
        "--http-bind-address=:8080",
        "--metrics-bind-address=:9090",
        "--health-probe-bind-address=:8081",
        "--cluster-domain=cluster.local",
        "--proxy-timeout=180s",
        "--upstream-max-retries=3",
        "--cache-enabled=true",
        "--authz-mode=allow-all",
    ]
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Service", "sandbox-router-svc"), ("PodDisruptionBudget", "sandbox-router")} <= names
    assert {("ClusterRole", "sandbox-router"), ("NetworkPolicy", "sandbox-router")} <= names
    assert ("ClusterRoleBinding", "sandbox-router-auth-delegator") not in names
    review = _template(
        "--set", "image.tag=v1", "--set", "router.enabled=true", "--set", "router.authzMode=tokenreview"
    )
    _one(review, "ClusterRoleBinding", "sandbox-router-auth-delegator")
    # tokenreview refuses requests without a token unless told otherwise (docs/router.md).
    review_mode = ("--set", "router.authzMode=tokenreview")
    assert _router_args(*review_mode)[-2:] == [
        "--authz-mode=tokenreview",
        "--authz-tokenreview-require-token=true",
    ]
    for setting, flag in (("false", "false"), ("null", "true")):
        args = _router_args(*review_mode, "--set", f"router.tokenReviewRequireToken={setting}")
        assert args[-1] == f"--authz-tokenreview-require-token={flag}", setting
    bad = _helm(
        "template",
        "x",
        CHART,
        "--set",
        "image.tag=v1",
        "--set",
        "router.enabled=true",
        "--set",
        "router.authzMode=open",
        check=False,
    )
    assert (
        "at '/router/authzMode': value must be one of 'allow-all', 'tokenreview', 'scoped-token'"
        in bad.stderr
    )


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("replicaCount=-1", "at '/replicaCount': minimum: got -1, want 0"),
        ("router.replicaCount=-1", "at '/router/replicaCount': minimum: got -1, want 0"),
        (
            "controller.sandboxConcurrentWorkers=0",
            "at '/controller/sandboxConcurrentWorkers': minimum: got 0, want 1",
        ),
        ("controller.kubeApiBurst=0", "at '/controller/kubeApiBurst': minimum: got 0, want 1"),
        ("controller.sandboxWarmPoolReadinessGracePeriod=5", "got number, want null or string"),
        ("controller.sandboxWarmPoolReadinessGracePeriod=5 minutes", "does not match pattern"),
        ("router.proxyTimeout=abc", "at '/router/proxyTimeout': 'abc' does not match pattern"),
        ("router.service.port=70000", "at '/router/service/port': maximum: got 70,000, want 65,535"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy': value must be one of"),
        ("controller.leaderElect=maybe", "at '/controller/leaderElect': got string, want boolean"),
        (
            "router.lifecycle.enabled=true,lifecycle.enabled=true,router.cacheEnabled=false",
            "router.lifecycle.enabled=true needs router.cacheEnabled=true",
        ),
        ("router.lifecycle.enabled=true", "router.lifecycle.enabled=true needs lifecycle.enabled=true"),
        (
            "controller.leaderElect=false,replicaCount=2",
            "replicaCount=2 needs controller.leaderElect=true: without leader election every replica reconciles",
        ),
        # "A positive Go duration": the binaries refuse zero, whatever its units.
        ("router.proxyTimeout=0s", "at '/router/proxyTimeout': '0s' does not match pattern"),
        (
            "controller.sandboxWarmPoolReadinessGracePeriod=0s",
            "at '/controller/sandboxWarmPoolReadinessGracePeriod': '0s' does not match pattern",
        ),
        (
            "controller.sandboxWarmPoolUnschedulableRecheckInterval=0h0m",
            "at '/controller/sandboxWarmPoolUnschedulableRecheckInterval': '0h0m' does not match pattern",
        ),
        # Empty means the release namespace, which exists already: the chart cannot create it.
        ("namespace.name=", "at '/namespace/name': minLength: got 0, want 1"),
        # The router refuses to start without the key file.
        ("router.authzMode=scoped-token", "at '/router/scopedTokenSecret/name': minLength: got 0, want 1"),
    ],
)
def test_bad_values_are_refused_naming_the_value(value: str, error: str) -> None:
    """values.schema.json (types, ranges, choices) and the chart's own cross-checks refuse at template time,
    so a wrong value never becomes a crash-looping pod (or two controllers racing)."""
    out = _helm(
        "template", "x", CHART, "--set", "image.tag=v1,router.enabled=true", "--set", value, check=False
    )
    assert out.returncode != 0
    assert error in out.stderr, out.stderr


def test_positive_durations_are_accepted() -> None:
    """The zero-refusing pattern still takes every positive form Go's time.ParseDuration does."""
    for duration in ("90s", "1m30s", "0.5s", ".5s", "1h0m0s", "0s1ms", "250ms"):
        args = _router_args("--set", f"router.proxyTimeout={duration}")
        assert f"--proxy-timeout={duration}" in args, duration


def _router_args(*values: str) -> list[str]:
    docs = _template("--set", "image.tag=v1", "--set", "router.enabled=true", *values)
    dep = _one(docs, "Deployment", "sandbox-router")
    args: list[str] = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_router_scoped_token_mounts_the_operators_secret() -> None:
    """scoped-token needs --authz-scoped-token-secret-file: the chart mounts the Secret the operator made."""
    docs = _template(
        "--set", "image.tag=v1", "--set", "router.enabled=true", "--set", "router.authzMode=scoped-token",
        "--set", "router.scopedTokenSecret.name=router-key", "--set", "router.scopedTokenSecret.key=hmac",
    )  # fmt: skip
    pod = _one(docs, "Deployment", "sandbox-router")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][-2:] == [
        "--authz-mode=scoped-token",
        "--authz-scoped-token-secret-file=/etc/sandbox-router/scoped-token/hmac",
    ]
    assert container["volumeMounts"] == [
        {"name": "scoped-token", "mountPath": "/etc/sandbox-router/scoped-token", "readOnly": True}
    ]
    assert pod["volumes"] == [{"name": "scoped-token", "secret": {"secretName": "router-key"}}]
    assert not [d for d in docs if d["kind"] == "Secret"]  # the key stays the operator's
    # Other modes mount nothing.
    assert (
        "volumes"
        not in _one(
            _template("--set", "image.tag=v1", "--set", "router.enabled=true"), "Deployment", "sandbox-router"
        )["spec"]["template"]["spec"]
    )
    # Without the schema (--skip-schema-validation) the template still refuses, in words.
    out = _helm(
        "template", "x", CHART, "--skip-schema-validation", "--set", "image.tag=v1,router.enabled=true",
        "--set", "router.authzMode=scoped-token", check=False,
    )  # fmt: skip
    assert out.returncode != 0
    assert "router.authzMode=scoped-token needs router.scopedTokenSecret.name" in out.stderr


def test_empty_webhook_service_name_means_the_binarys_default() -> None:
    """No --webhook-service-name: the controller points the CRDs at its default Service name, so the
    Service must have that name (an empty name would not even be created)."""
    docs = _template("--set", "image.tag=v1", "--set", "webhookServiceName=")
    assert not [a for a in _args(docs) if a.startswith("--webhook-service-name")]
    service = _one(docs, "Service", "agent-sandbox-webhook-service")
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"


def test_single_router_replica_gets_no_disruption_budget() -> None:
    """minAvailable 1 of 1 replica allows no eviction: every node drain would wait forever."""

    def pdbs(*values: str) -> list[dict[str, Any]]:
        docs = _template("--set", "image.tag=v1", "--set", "router.enabled=true", *values)
        return [d for d in docs if d["kind"] == "PodDisruptionBudget"]

    assert not pdbs("--set", "router.replicaCount=1")
    assert not pdbs("--set", "router.replicaCount=0")
    (pdb,) = pdbs("--set", "router.replicaCount=2")
    assert pdb["spec"]["minAvailable"] == 1


def test_values_written_for_other_chart_versions_still_render() -> None:
    """The schema checks the keys it knows; unknown keys (a newer upstream chart's) are left alone."""
    docs = _template(
        "--set", "image.tag=v1", "--set", "futureKey.enabled=true", "--set", "controller.futureFlag=1",
        "--set", "controller.kubeApiQps=50.5", "--set", "controller.sandboxWarmPoolReadinessGracePeriod=1m30s",
    )  # fmt: skip
    args = _args(docs)
    assert "--kube-api-qps=50.5" in args
    assert "--sandbox-warm-pool-readiness-grace-period=1m30s" in args


def test_install_upgrade_uninstall(installed: Installed, install_ns: str) -> None:
    """helm install -> controller ready -> sandboxes -> helm upgrade keeps them -> helm uninstall.

    Installed into a namespace other than agent-sandbox-system: the controller rewrites the CRDs' Service
    reference at start-up, so conversion must work there too (operations §4.1).
    """
    cluster, ns = installed.cluster, "sandbox-ops"
    helm(
        cluster, "install", "agent-sandbox", CHART,
        "--set", "image.tag=v0.0.1-test", "--set", "controller.extensions=true", "--set", f"namespace.name={ns}",
        "--wait", "--timeout", "2m",
    )  # fmt: skip
    pods = installed.pods

    def controller() -> dict[str, Any]:
        ready = installed.controller_pods(SELECTOR, namespace=ns)
        assert len(ready) == 1
        return ready[0]

    pod = controller()
    assert pod["spec"]["containers"][0]["args"] == [
        "--leader-elect=true",
        "--extensions=true",
        "--webhook-service-name=agent-sandbox-webhook-service",
        f"--webhook-namespace={ns}",
    ]
    installed.wait_conversion(install_ns)
    # Leadership through the chart's namespaced Role (no Lease grant is cluster-wide): a Lease of its own here.
    lease = wait_for(
        lambda: cluster.kubectl("get", "lease", LEASE_NAME, "-n", ns, "-o", "json").stdout or None,
        what=f"the controller's Lease in {ns}",
    )
    assert json.loads(lease)["spec"]["holderIdentity"]

    def patched() -> dict[str, Any] | None:
        crd: dict[str, Any] = installed.kubectl_json("get", "crd", "sandboxclaims.extensions.agents.x-k8s.io")
        return (
            crd
            if crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["namespace"] == ns
            else None
        )

    crd = wait_for(patched, what=f"the claim CRD's webhook Service reference moved to {ns}")
    secret = installed.kubectl_json("get", "secret", "agent-sandbox-webhook-certs", "-n", ns)
    # The Secret's CA first; the controller may keep CAs the caBundle already held after it (KEPT_CAS).
    config = crd["spec"]["conversion"]["webhook"]["clientConfig"]
    assert leads_with_ca(config, base64.b64decode(secret["data"]["ca.crt"])), config.get("caBundle")
    installed.sandbox(install_ns, "keep")
    keep = installed.pod_uid(install_ns, "keep")

    helm(
        cluster,
        "upgrade",
        "agent-sandbox",
        CHART,
        "--reuse-values",
        "--set",
        "image.tag=v0.0.2-test",
        "--wait",
    )
    new = installed.controller_pods(
        SELECTOR, namespace=ns, image="registry.k8s.io/agent-sandbox/agent-sandbox-controller:v0.0.2-test"
    )[0]
    assert new["metadata"]["uid"] != pod["metadata"]["uid"]
    assert pod["metadata"]["uid"] not in pods.started
    installed.wait_sandbox_ready(install_ns, "keep")
    assert installed.pod_uid(install_ns, "keep") == keep
    installed.sandbox(install_ns, "after-upgrade")

    helm(cluster, "uninstall", "agent-sandbox", "--wait")
    assert json.loads(helm(cluster, "list", "-A", "-o", "json").stdout) == []
    wait_for(lambda: not installed.pods.sync(ns, SELECTOR), what="controller pods gone", timeout=60)
    assert not pods.started
    assert cluster.kubectl("get", "clusterrole", "agent-sandbox-controller").returncode != 0
    # CRDs are left behind (Helm never deletes crds/); deleting them would delete every sandbox.
    assert cluster.kubectl("get", "crd", "sandboxes.agents.x-k8s.io").returncode == 0


def test_a_leader_election_namespace_in_extra_args_gets_the_lease_role(
    installed: Installed, install_ns: str
) -> None:
    """`--leader-election-namespace` passed through controller.extraArgs: the chart's Lease Role and RoleBinding
    go there too, so the controller (as its ServiceAccount) takes its Lease in that namespace. Until December 7
    they stayed in the chart's namespace and the controller was Forbidden on the Lease, never leading."""
    cluster = installed.cluster
    helm(
        cluster, "install", "agent-sandbox", CHART, "--set", "image.tag=v0.0.1-test",
        "--set-json", f'controller.extraArgs=["--leader-election-namespace={install_ns}"]',
        "--wait", "--timeout", "2m",
    )  # fmt: skip
    installed.controller_pods(SELECTOR)
    lease = wait_for(
        lambda: cluster.kubectl("get", "lease", LEASE_NAME, "-n", install_ns, "-o", "json").stdout or None,
        what=f"the controller's Lease in {install_ns}",
        timeout=60,
    )
    assert json.loads(lease)["spec"]["holderIdentity"]
    binding = installed.kubectl_json("get", "rolebinding", LEADER_ELECTION_NAME, "-n", install_ns)
    assert binding["subjects"][0]["namespace"] == SYSTEM_NS


def test_moving_the_leader_election_namespace_keeps_the_old_grant_for_one_revision(
    installed: Installed, install_ns: str
) -> None:
    """`helm upgrade --set controller.leaderElectionNamespace=<other>` on a live release: the old pod keeps its
    Lease grant until it stops, so it releases its Lease (holder cleared) without a Forbidden; the next upgrade
    drops the old grant. Until December 7 Helm deleted the old Role with the upgrade, while the old pod still
    held its Lease: Forbidden on renew and release, and the Lease left held in the old namespace (inst12
    finding 2)."""
    cluster = installed.cluster

    def lease(namespace: str) -> dict[str, Any]:
        found: dict[str, Any] = installed.kubectl_json("get", "lease", LEASE_NAME, "-n", namespace)
        return found

    def has_role(namespace: str) -> bool:
        return all(
            cluster.kubectl("get", kind, LEADER_ELECTION_NAME, "-n", namespace).returncode == 0
            for kind in ("role", "rolebinding")
        )

    helm(
        cluster,
        "install",
        "agent-sandbox",
        CHART,
        "--set",
        "image.tag=v0.0.1-test",
        "--wait",
        "--timeout",
        "2m",
    )
    (old,) = installed.controller_pods(SELECTOR)
    old_log = installed.pods.log(old["metadata"]["uid"])
    wait_for(
        lambda: (
            cluster.kubectl("get", "lease", LEASE_NAME, "-n", SYSTEM_NS).returncode == 0
            and bool(lease(SYSTEM_NS)["spec"].get("holderIdentity"))
        ),
        what=f"the controller's Lease in {SYSTEM_NS}",
        timeout=60,
    )

    reuse = ("upgrade", "agent-sandbox", CHART, "--reuse-values", "--set")
    helm(cluster, *reuse, f"controller.leaderElectionNamespace={install_ns}")
    assert has_role(install_ns)
    assert has_role(SYSTEM_NS), "the old pod lost its Lease grant while it still runs"
    dep = installed.kubectl_json("get", "deployment", "agent-sandbox-controller", "-n", SYSTEM_NS)
    installed.controller_pods(SELECTOR, args=dep["spec"]["template"]["spec"]["containers"][0]["args"])
    wait_for(
        lambda: (
            cluster.kubectl("get", "lease", LEASE_NAME, "-n", install_ns).returncode == 0
            and bool(lease(install_ns)["spec"].get("holderIdentity"))
        ),
        what=f"the controller's Lease in {install_ns}",
        timeout=60,
    )
    # The old pod was stopped (SIGTERM) by the rollout: it released its Lease, refused nothing.
    wait_for(lambda: not lease(SYSTEM_NS)["spec"].get("holderIdentity"), what="the old Lease released")
    assert "Forbidden" not in old_log.read_text()

    helm(cluster, *reuse, f"controller.leaderElectionNamespace={install_ns}")  # the next revision
    assert has_role(install_ns)
    assert not any(
        cluster.kubectl("get", kind, LEADER_ELECTION_NAME, "-n", SYSTEM_NS).returncode == 0
        for kind in ("role", "rolebinding")
    )


ARCHIVE_CRD = "sandboxarchives.lifecycle.agents.x-k8s.io"


def test_lifecycle_crd_and_archives_outlive_disabling_and_uninstall(
    installed: Installed, install_ns: str
) -> None:
    """The SandboxArchive CRD is a template, and Helm deletes a template's objects on uninstall and on an
    upgrade or rollback to a revision that does not render them (one made by an older chart, which rendered
    it only with lifecycle.enabled): that would delete every archive and, by garbage collection, the PVCs
    they own (hibernated sandboxes' data). It is kept."""
    cluster = installed.cluster
    archives = f"/apis/lifecycle.agents.x-k8s.io/v1alpha1/namespaces/{install_ns}/sandboxarchives"

    def archive_left() -> bool:
        status, _ = cluster.admin().request("GET", f"{archives}/hibernated")
        return cluster.kubectl("get", "crd", ARCHIVE_CRD).returncode == 0 and status == 200

    # One an earlier test applied (k8s/lifecycle) is not this release's: lifecycle on would be refused.
    cluster.kubectl("delete", "crd", ARCHIVE_CRD, "--ignore-not-found", "--timeout=60s")
    try:
        helm(
            cluster,
            "install",
            "agent-sandbox",
            CHART,
            "--set",
            "image.tag=v1",
            "--set",
            "lifecycle.enabled=true",
        )
        wait_for(
            lambda: cluster.admin().request("GET", archives)[0] == 200, what="the SandboxArchive CRD served"
        )
        archive = {
            "apiVersion": "lifecycle.agents.x-k8s.io/v1alpha1",
            "kind": "SandboxArchive",
            "metadata": {"name": "hibernated"},
            "spec": {"sandbox": {"spec": {}}, "sandboxUID": "u-1", "archivedAt": "2026-01-01T00:00:00Z"},
        }
        status, body = cluster.admin().request("POST", archives, archive)
        assert status == 201, body

        helm(cluster, "upgrade", "agent-sandbox", CHART, "--reuse-values", "--set", "lifecycle.enabled=false")
        # The upgrade did remove the other lifecycle objects; the CRD (still rendered) and its archive stay.
        assert cluster.kubectl("get", "clusterrole", "agent-sandbox-controller-lifecycle").returncode != 0
        time.sleep(2)  # a deletion would have been requested by now (helm deletes before it returns)
        assert archive_left()
        helm(cluster, "upgrade", "agent-sandbox", CHART, "--reuse-values", "--set", "lifecycle.enabled=true")

        helm(cluster, "uninstall", "agent-sandbox", "--wait")
        time.sleep(2)
        assert archive_left()
    finally:
        cluster.kubectl("delete", "crd", ARCHIVE_CRD, "--ignore-not-found", "--timeout=60s")


def _deployed_args(installed: Installed) -> list[str]:
    dep = installed.kubectl_json(
        "get", "deployment", "agent-sandbox-controller", "-n", "agent-sandbox-system"
    )
    args: list[str] = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_rollback_between_lifecycle_on_and_off(installed: Installed) -> None:
    """Every revision holds the SandboxArchive CRD when it is the release's, lifecycle on or off: a rollback
    from a revision with it off to one with it on used to fail (`no CustomResourceDefinition with the name
    ... found`: the CRD kept by the upgrade that turned it off is in the cluster but not in the current
    revision, and a rollback does not adopt), leaving the release failed."""
    cluster = installed.cluster
    cluster.kubectl("delete", "crd", ARCHIVE_CRD, "--ignore-not-found", "--timeout=60s")  # another test's
    try:
        helm(
            cluster, "install", "agent-sandbox", CHART, "--set", "image.tag=v1",
            "--set", "controller.extensions=true", "--set", "lifecycle.enabled=true",
        )  # fmt: skip
        helm(cluster, "upgrade", "agent-sandbox", CHART, "--reuse-values", "--set", "lifecycle.enabled=false")
        assert cluster.kubectl("get", "clusterrole", "agent-sandbox-controller-lifecycle").returncode != 0
        assert "--sandbox-lifecycle" not in _deployed_args(installed)

        out = helm(cluster, "rollback", "agent-sandbox", "1", check=False)
        assert out.returncode == 0, out.stderr
        assert "--sandbox-lifecycle" in _deployed_args(installed)
        role = installed.kubectl_json("get", "clusterrole", "agent-sandbox-controller-lifecycle")
        assert {
            "apiGroups": ["extensions.agents.x-k8s.io"],
            "resources": ["sandboxclaims"],
            "verbs": ["patch"],
        } in (role["rules"])
        # And back to the revision with it off: the CRD stays (kept, and rendered there too).
        helm(cluster, "rollback", "agent-sandbox", "2")
        assert "--sandbox-lifecycle" not in _deployed_args(installed)
        assert cluster.kubectl("get", "crd", ARCHIVE_CRD).returncode == 0
        history = json.loads(helm(cluster, "history", "agent-sandbox", "-o", "json").stdout)
        assert [h["status"] for h in history] == ["superseded", "superseded", "superseded", "deployed"]
    finally:
        helm(cluster, "uninstall", "agent-sandbox", check=False)
        cluster.kubectl("delete", "crd", ARCHIVE_CRD, "--ignore-not-found", "--timeout=60s")


def test_a_sandboxarchive_crd_the_release_does_not_own_is_left_alone(installed: Installed) -> None:
    """Rendering the CRD with lifecycle off must not make an install without lifecycle fail Helm's ownership
    check on a SandboxArchive CRD someone else made (k8s/lifecycle, or a release under another name): that
    one is not rendered while lifecycle is off, and never taken over or deleted."""
    cluster = installed.cluster
    crd_file = REPO_ROOT / "k8s" / "lifecycle" / "lifecycle.agents.x-k8s.io_sandboxarchives.yaml"
    cluster.kubectl("delete", "crd", ARCHIVE_CRD, "--ignore-not-found", "--timeout=60s")
    cluster.kubectl("apply", "--server-side", "-f", str(crd_file), check=True)
    try:
        helm(cluster, "install", "agent-sandbox", CHART, "--set", "image.tag=v1")
        manifest = helm(cluster, "get", "manifest", "agent-sandbox").stdout
        assert ARCHIVE_CRD not in manifest
        crd = installed.kubectl_json("get", "crd", ARCHIVE_CRD)
        assert "meta.helm.sh/release-name" not in (crd["metadata"].get("annotations") or {})
        # With lifecycle on it is rendered, and Helm's own check names the ownership problem.
        out = helm(
            cluster, "upgrade", "agent-sandbox", CHART, "--reuse-values", "--set", "lifecycle.enabled=true",
            check=False,
        )  # fmt: skip
        assert out.returncode != 0
        assert "invalid ownership metadata" in out.stderr, out.stderr
        helm(cluster, "uninstall", "agent-sandbox", "--wait")
        assert cluster.kubectl("get", "crd", ARCHIVE_CRD).returncode == 0
    finally:
        cluster.kubectl("delete", "crd", ARCHIVE_CRD, "--ignore-not-found", "--timeout=60s")


def test_a_dry_run_leaves_a_foreign_sandboxarchive_crd_alone(installed: Installed) -> None:
    """`helm install/upgrade --dry-run` (client, Helm's default) answers every `lookup` with nothing, yet
    still runs Helm's ownership check against the cluster: a SandboxArchive CRD made by `k8s/lifecycle` must
    not fail it while lifecycle is off, as it does not fail the real install
    (test_a_sandboxarchive_crd_the_release_does_not_own_is_left_alone). And the probe that tells a dry run
    from a real install must not be the release namespace: `--create-namespace` creates it after rendering."""
    cluster = installed.cluster
    crd_file = REPO_ROOT / "k8s" / "lifecycle" / "lifecycle.agents.x-k8s.io_sandboxarchives.yaml"
    release_ns = f"t-rel-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("delete", "crd", ARCHIVE_CRD, "--ignore-not-found", "--timeout=60s")
    cluster.kubectl("apply", "--server-side", "-f", str(crd_file), check=True)
    try:
        for dry_run in ("--dry-run", "--dry-run=client", "--dry-run=server"):
            out = helm(
                cluster, "install", "agent-sandbox", CHART, "--set", "image.tag=v1", dry_run, check=False
            )
            assert out.returncode == 0, (dry_run, out.stderr)
            assert f"name: {ARCHIVE_CRD}" not in out.stdout, dry_run
        # With lifecycle on the dry run says what the install would: hand it over first.
        out = helm(
            cluster, "install", "agent-sandbox", CHART, "--set", "image.tag=v1", "--set",
            "lifecycle.enabled=true", "--dry-run", check=False,
        )  # fmt: skip
        assert "invalid ownership metadata" in out.stderr, out.stderr
        helm(cluster, "install", "agent-sandbox", CHART, "--set", "image.tag=v1")
        out = helm(
            cluster, "upgrade", "agent-sandbox", CHART, "--reuse-values", "--set", "image.tag=v2", "--dry-run",
            check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        helm(cluster, "uninstall", "agent-sandbox", "--wait")

        # No CRD: a real install with lifecycle off renders it (so every revision holds it), also into a
        # release namespace that --create-namespace makes after rendering.
        cluster.kubectl("delete", "crd", ARCHIVE_CRD, "--timeout=60s", check=True)
        helm(
            cluster, "install", "agent-sandbox", CHART, "--set", "image.tag=v1",
            "--namespace", release_ns, "--create-namespace",
        )  # fmt: skip
        manifest = helm(cluster, "get", "manifest", "agent-sandbox", "--namespace", release_ns).stdout
        assert f"name: {ARCHIVE_CRD}" in manifest
    finally:
        helm(cluster, "uninstall", "agent-sandbox", "--namespace", release_ns, "--wait", check=False)
        cluster.kubectl("delete", "namespace", release_ns, "--ignore-not-found", "--wait=false")
        cluster.kubectl("delete", "crd", ARCHIVE_CRD, "--ignore-not-found", "--timeout=60s")


def _upstream_chart(directory: Path) -> Path:
    """A copy of the chart as upstream ships it: no `router` or `lifecycle` values, nor their templates."""
    chart = directory / "upstream-chart"
    shutil.copytree(CHART, chart)
    for part in ("router", "lifecycle"):
        shutil.rmtree(chart / "templates" / part)
    values = (chart / "values.yaml").read_text()
    (chart / "values.yaml").write_text(
        values[: values.index("# Beyond upstream's chart: the sandbox router")]
    )
    args = chart / "templates" / "_controller-args.tpl"
    block = r"\{\{- if [^}]*lifecycle[^}]*\}\}.*?\{\{- end \}\}\n"
    args.write_text(re.sub(block, "", args.read_text(), flags=re.S))
    notes = chart / "templates" / "NOTES.txt"
    block = r"\{\{- if [^}]*router[^}]*\}\}.*?(?=\n\nUpgrades)"
    notes.write_text(re.sub(block, "", notes.read_text(), flags=re.S))
    return chart


def test_reuse_values_upgrade_of_a_release_made_by_upstreams_chart(
    installed: Installed, tmp_path: Path
) -> None:
    """`helm upgrade --reuse-values --set image.tag=<new>` (the documented upgrade) renders with the defaults
    of the chart that made the release: from upstream's chart there is no `router` or `lifecycle` map, which
    means off (not a nil-pointer error). Turning the router on that way is refused, naming the way out."""
    cluster = installed.cluster
    helm(cluster, "install", "agent-sandbox", str(_upstream_chart(tmp_path)), "--set", "image.tag=v1")
    helm(cluster, "upgrade", "agent-sandbox", CHART, "--reuse-values", "--set", "image.tag=v2")
    dep = installed.kubectl_json(
        "get", "deployment", "agent-sandbox-controller", "-n", "agent-sandbox-system"
    )
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.k8s.io/agent-sandbox/agent-sandbox-controller:v2"
    assert "--sandbox-lifecycle" not in container["args"]
    assert (
        cluster.kubectl("get", "deployment", "sandbox-router", "-n", "agent-sandbox-system").returncode != 0
    )

    out = helm(
        cluster,
        "upgrade",
        "agent-sandbox",
        CHART,
        "--reuse-values",
        "--set",
        "router.enabled=true",
        check=False,
    )
    assert out.returncode != 0
    assert "upgrade with --reset-then-reuse-values instead of --reuse-values" in out.stderr
    helm(
        cluster,
        "upgrade",
        "agent-sandbox",
        CHART,
        "--reset-then-reuse-values",
        "--set",
        "router.enabled=true",
    )
    assert (
        cluster.kubectl("get", "deployment", "sandbox-router", "-n", "agent-sandbox-system").returncode == 0
    )


def test_notes_warn_about_a_router_outside_the_system_namespace(installed: Installed) -> None:
    """The template controller's managed NetworkPolicy admits router pods only from agent-sandbox-system
    (controllers spec), so a router installed elsewhere cannot reach template-made sandboxes: said at
    install time. A warning, not a refusal: plain Sandboxes, Unmanaged templates and clusters that do not
    enforce NetworkPolicy work."""

    def notes(*values: str) -> str:
        out = helm(
            installed.cluster, "install", "agent-sandbox", CHART, "--dry-run=client",
            "--set", "image.tag=v1,router.enabled=true,controller.extensions=true", *values,
        )  # fmt: skip
        return out.stdout.split("NOTES:", 1)[1]

    warning = "admits router pods only from\nagent-sandbox-system"
    assert warning in notes("--set", "namespace.name=ops")
    assert warning not in notes()
    assert warning not in notes("--set", "namespace.name=ops", "--set", "controller.extensions=false")


# ---------------------------------------------------------------- values that used to break an install

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_optional_controller_values_may_be_null() -> None:
    """null is how a values file (or `--set key=null`) says "not set": no flag, the binary's default. A
    stored null must not make the schema refuse every later `--reuse-values` upgrade."""
    optional = [
        "clusterDomain", "leaderElectionNamespace", "enableTracing", "enablePprof", "enablePprofDebug",
        "pprofBlockProfileRate", "pprofMutexProfileFraction", "kubeApiQps", "kubeApiBurst",
        "sandboxConcurrentWorkers", "sandboxClaimConcurrentWorkers", "sandboxWarmPoolConcurrentWorkers",
        "sandboxTemplateConcurrentWorkers", "sandboxWarmPoolMaxBatchSize", "sandboxWarmPoolReadinessGracePeriod",
        "sandboxWarmPoolUnschedulableRecheckInterval", "enableWarmPoolEviction", "extraArgs",
    ]  # fmt: skip
    values = {"image": {"tag": "v1"}, "controller": dict.fromkeys(optional)}
    out = subprocess.run(
        [str(ensure_binaries().path("helm")), "template", "r", CHART, "-f", "-"],
        input=yaml.safe_dump(values),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    stock = _args(_template("--set", "image.tag=v1"))
    assert _args([d for d in yaml.safe_load_all(out.stdout) if d]) == stock
    assert _args(_template("--set", "image.tag=v1", "--set", "controller.clusterDomain=null")) == stock
    # A non-null value is still checked.
    bad = _helm("template", "r", CHART, "--set", "image.tag=v1,controller.kubeApiBurst=0", check=False)
    assert "at '/controller/kubeApiBurst': minimum: got 0, want 1" in bad.stderr, bad.stderr
    # The nullable duration repeats the duration pattern (a $ref would bring its "type": "string").
    definitions = json.loads((Path(CHART) / "values.schema.json").read_text())["definitions"]
    assert definitions["optionalDuration"]["pattern"] == definitions["duration"]["pattern"]


def test_without_a_cluster_the_sandboxarchive_crd_follows_lifecycle() -> None:
    """`helm template` (and --dry-run=client) cannot look the CRD up: rendering it with lifecycle off could
    name one the real install leaves alone (test_a_dry_run_leaves_a_foreign_sandboxarchive_crd_alone), so it
    is rendered with lifecycle on only. Against a cluster it is in every revision it can be
    (test_rollback_between_lifecycle_on_and_off)."""
    off = _template("--set", "image.tag=v1")
    on = _template("--set", "image.tag=v1", "--set", "lifecycle.enabled=true")
    assert not [d for d in off if d["kind"] == "CustomResourceDefinition"]
    crd = _one(on, "CustomResourceDefinition", "sandboxarchives.lifecycle.agents.x-k8s.io")
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert not [d for d in off if d["metadata"]["name"] == "agent-sandbox-controller-lifecycle"]
    assert "--sandbox-lifecycle" not in _args(off)
    _one(on, "ClusterRole", "agent-sandbox-controller-lifecycle")
    _one(on, "ClusterRoleBinding", "agent-sandbox-controller-lifecycle")
    assert "--sandbox-lifecycle" in _args(on)


def test_a_digest_pinned_image_tag_makes_a_valid_version_label() -> None:
    """`tag@sha256:<digest>` is a valid image reference but not a label value (`@`, `:`, over 63 bytes):
    the label gets a sanitized copy, the image the tag as given."""
    tag = "v0.1.0@sha256:" + "0123456789abcdef" * 4
    router_tag = "v0.1.0@sha256:" + "fedcba9876543210" * 4
    docs = _template(
        "--set", f"image.tag={tag}", "--set", "router.enabled=true", "--set", f"router.image.tag={router_tag}"
    )  # fmt: skip
    container = _one(docs, "Deployment", "agent-sandbox-controller")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["image"] == f"registry.k8s.io/agent-sandbox/agent-sandbox-controller:{tag}"
    router = _one(docs, "Deployment", "sandbox-router")["spec"]["template"]["spec"]["containers"][0]
    assert router["image"] == f"registry.k8s.io/agent-sandbox/sandbox-router:{router_tag}"
    versions = {
        d["metadata"]["labels"]["app.kubernetes.io/version"]
        for d in docs
        if "app.kubernetes.io/version" in (d["metadata"].get("labels") or {})
    }
    assert versions == {"v0.1.0_sha256_0123456789abcdef0123456789abcdef0123456789abcdef0"}
    for value in versions:
        assert len(value) <= 63, value
        assert _LABEL_VALUE.match(value), value
    # Ends that are not alphanumeric are trimmed; a tag with nothing left gets no label.
    docs = _template("--set", "image.tag=_v1.2-")
    assert _one(docs, "Deployment")["metadata"]["labels"]["app.kubernetes.io/version"] == "v1.2"
    assert (
        "app.kubernetes.io/version"
        not in _one(_template("--set", "image.tag=@"), "Deployment")["metadata"]["labels"]
    )


def test_a_digest_pinned_image_tag_is_not_the_routers() -> None:
    """router.image.tag defaults to image.tag, but a digest names one image: `sandbox-router:<tag>@<the
    controller's digest>` cannot be pulled. Refused at render time, naming router.image.tag."""
    tag = "v0.1.0@sha256:" + "0123456789abcdef" * 4
    out = _helm(
        "template", "x", CHART, "--set", f"image.tag={tag}", "--set", "router.enabled=true", check=False
    )
    assert out.returncode != 0
    assert "set router.image.tag" in out.stderr, out.stderr
    # Without the router nothing is refused, and a plain tag is still the router's default.
    _one(_template("--set", f"image.tag={tag}"), "Deployment", "agent-sandbox-controller")
    docs = _template("--set", "image.tag=v0.1.0", "--set", "router.enabled=true")
    router = _one(docs, "Deployment", "sandbox-router")["spec"]["template"]["spec"]["containers"][0]
    assert router["image"] == "registry.k8s.io/agent-sandbox/sandbox-router:v0.1.0"


def test_creating_the_release_namespace_is_refused_before_anything_is_installed() -> None:
    """`helm install -n agent-sandbox-system [--create-namespace]` with the default namespace.create=true
    would render the release's own namespace: the install fails half-way (it exists) and an uninstall would
    delete the namespace holding the release record. Refused at render time, naming the way out."""
    out = _helm("template", "x", CHART, "-n", "agent-sandbox-system", "--set", "image.tag=v1", check=False)
    assert out.returncode != 0
    assert "--set namespace.create=false" in out.stderr, out.stderr
    docs = _template(
        "--set", "image.tag=v1", "--set", "namespace.create=false", namespace="agent-sandbox-system"
    )
    assert not [d for d in docs if d["kind"] == "Namespace"]
    assert _args(docs)[-1] == "--webhook-namespace=agent-sandbox-system"
    # Another release namespace (the documented install) still creates agent-sandbox-system.
    _one(_template("--set", "image.tag=v1", namespace="ops"), "Namespace", "agent-sandbox-system")


def test_externally_managed_webhook_certificates() -> None:
    """controller.webhookCertSecret: the operator's Secret (cert-manager's tls.crt/tls.key) is mounted at
    the binary's cert dir and the controller neither generates nor stores a pair."""
    docs = _template(
        "--set", "image.tag=v1", "--set", "controller.webhookCertSecret=agent-sandbox-webhook-tls"
    )
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "--manage-webhook-certs=false" in container["args"]
    assert not [a for a in container["args"] if "webhookCertSecret" in a or "webhook-cert-secret" in a]
    assert {
        "name": "webhook-certs",
        "mountPath": "/tmp/k8s-webhook-server/serving-certs",
        "readOnly": True,
    } in container["volumeMounts"]
    assert {"name": "webhook-certs", "secret": {"secretName": "agent-sandbox-webhook-tls"}} in pod["volumes"]
    stock = _one(_template("--set", "image.tag=v1"), "Deployment")["spec"]["template"]["spec"]
    assert "--manage-webhook-certs=false" not in stock["containers"][0]["args"]
    assert [v["name"] for v in stock["volumes"]] == ["config-volume", "tmp"]


def _bound_rules(docs: list[dict[str, Any]], subject: tuple[str, str]) -> list[dict[str, Any]]:
    """Every rule of the ClusterRoles the rendered ClusterRoleBindings give `subject` (namespace, name)."""
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    rules: list[dict[str, Any]] = []
    for binding in (d for d in docs if d["kind"] == "ClusterRoleBinding"):
        subjects = {
            (s.get("namespace"), s["name"]) for s in binding["subjects"] if s["kind"] == "ServiceAccount"
        }
        if subject in subjects:
            rules += roles[binding["roleRef"]["name"]]["rules"]
    return rules


def _allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"]
        and resource in r["resources"]
        and verb in r["verbs"]
        and not r.get("resourceNames")
        for r in rules
    )


@pytest.mark.parametrize("extensions", ["false", "true"])
def test_lifecycle_grants_cover_marking_a_hibernated_sandboxs_claim(extensions: str) -> None:
    """Hibernating a claim-owned Sandbox marks its claim (patch, annotation `hibernated-sandbox`) whether or
    not --extensions is on; the chart binds the extensions ClusterRole only with controller.extensions=true,
    so the lifecycle grant has to cover the patch itself."""
    docs = _template(
        "--set",
        "image.tag=v1",
        "--set",
        "lifecycle.enabled=true",
        "--set",
        f"controller.extensions={extensions}",
    )
    rules = _bound_rules(docs, ("agent-sandbox-system", "agent-sandbox-controller"))
    assert _allows(rules, "extensions.agents.x-k8s.io", "sandboxclaims", "patch")
    for verb in ("create", "delete", "get", "list", "patch", "update", "watch"):
        assert _allows(rules, "lifecycle.agents.x-k8s.io", "sandboxarchives", verb), verb


# ---------------------------------------------------------------- upgrades that used to break a live release


def test_switching_off_the_chart_made_namespace_is_refused(installed: Installed) -> None:
    """`helm upgrade --reuse-values --set namespace.create=false` on a release that created the Namespace
    drops it from the manifest, and Helm deletes it - with the controller, its Secrets and whatever else is
    in it - and reports success. Refused before anything changes, naming the hand-over (the keep policy),
    after which the same upgrade goes through and the Namespace stays."""
    cluster = installed.cluster
    helm(cluster, "install", "agent-sandbox", CHART, "--set", "image.tag=v1")
    for values in (("--set", "namespace.create=false"), ("--set", "namespace.name=elsewhere")):
        out = helm(cluster, "upgrade", "agent-sandbox", CHART, "--reuse-values", *values, check=False)
        assert out.returncode != 0, values
        assert f'would delete Namespace "{SYSTEM_NS}"' in out.stderr, out.stderr
        assert "helm.sh/resource-policy=keep" in out.stderr, out.stderr
        ns = installed.kubectl_json("get", "namespace", SYSTEM_NS)
        assert "deletionTimestamp" not in ns["metadata"]
    history = json.loads(helm(cluster, "history", "agent-sandbox", "-o", "json").stdout)
    assert [h["status"] for h in history] == ["deployed"]

    cluster.kubectl("annotate", "namespace", SYSTEM_NS, "helm.sh/resource-policy=keep", check=True)
    helm(cluster, "upgrade", "agent-sandbox", CHART, "--reuse-values", "--set", "namespace.create=false")
    assert "kind: Namespace" not in helm(cluster, "get", "manifest", "agent-sandbox").stdout
    ns = installed.kubectl_json("get", "namespace", SYSTEM_NS)
    assert "deletionTimestamp" not in ns["metadata"]
    cluster.kubectl("get", "deployment", "agent-sandbox-controller", "-n", SYSTEM_NS, check=True)


def test_changing_name_override_on_a_live_release_is_refused(installed: Installed) -> None:
    """nameOverride is in the controller Deployment's selector, which the API server refuses to change: the
    upgrade used to fail only after Helm had re-pointed the Services at labels no pod has. Refused before
    anything is applied; the Services keep their selectors."""
    cluster = installed.cluster
    helm(cluster, "install", "agent-sandbox", CHART, "--set", "image.tag=v1")
    out = helm(
        cluster, "upgrade", "agent-sandbox", CHART, "--reuse-values", "--set", "nameOverride=renamed",
        check=False,
    )  # fmt: skip
    assert out.returncode != 0
    assert "nameOverride is install-time only" in out.stderr, out.stderr
    for name in ("agent-sandbox-controller", "agent-sandbox-webhook-service"):
        svc = installed.kubectl_json("get", "service", name, "-n", SYSTEM_NS)
        assert svc["spec"]["selector"] == SELECTOR, name
    # Without leader election a rollout must not run two controllers at once: the live Deployment moves
    # from the default rolling update to Recreate (the API server clears rollingUpdate).
    helm(
        cluster, "upgrade", "agent-sandbox", CHART, "--reuse-values", "--set", "controller.leaderElect=false"
    )
    dep = installed.kubectl_json("get", "deployment", "agent-sandbox-controller", "-n", SYSTEM_NS)
    assert dep["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ("router.service.name=agent-sandbox-webhook-service", ("webhookServiceName", "router.service.name")),
        ("webhookServiceName=agent-sandbox-controller", ("service.name", "webhookServiceName")),
        ("service.name=agent-sandbox-webhook-service", ("service.name", "webhookServiceName")),
        ("service.name=sandbox-router-svc", ("service.name", "router.service.name")),
        # An empty webhookServiceName means the default name, which the Service then has.
        (
            "webhookServiceName=,service.name=agent-sandbox-webhook-service",
            ("service.name", "webhookServiceName"),
        ),
    ],
)
def test_colliding_service_names_are_refused(values: str, names: tuple[str, str]) -> None:
    """Two of the chart's Services under one name would be one object: the later template's selector and
    ports win, and the other Service's clients reach the wrong pods or port. Refused naming both values."""
    out = _helm(
        "template", "x", CHART, "--set", "image.tag=v1,router.enabled=true", "--set", values, check=False
    )
    assert out.returncode != 0
    assert f"{names[0]} and {names[1]} are both" in out.stderr, out.stderr
    # Without the router its Service name cannot collide.
    if "router" not in " ".join(names):
        return
    _one(_template("--set", "image.tag=v1", "--set", values), "Deployment", "agent-sandbox-controller")


def test_without_leader_election_a_rollout_replaces_the_controller() -> None:
    """leaderElect=false: the default rolling update (maxSurge 25%, rounded up to 1) would run the new
    controller beside the old, both unelected and reconciling. Recreate stops the old one first; with leader
    election the rolling update stays (the new pod waits for the lease)."""
    dep = _one(_template("--set", "image.tag=v1", "--set", "controller.leaderElect=false"), "Deployment")
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert "strategy" not in _one(_template("--set", "image.tag=v1"), "Deployment")["spec"]


def test_reuse_values_of_a_release_made_before_router_lifecycle_and_scoped_token(tmp_path: Path) -> None:
    """`--reuse-values` renders with the defaults of the chart that made the release: one from before
    router.lifecycle, router.scopedTokenSecret, lifecycle and controller.webhookCertSecret (8f41bc9) has
    none of them. A missing map means its default, not a nil-pointer error."""
    chart = tmp_path / "older-chart"
    shutil.copytree(CHART, chart)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    for part in ("lifecycle", "scopedTokenSecret"):
        del values["router"][part]
    del values["lifecycle"]
    del values["controller"]["webhookCertSecret"]
    (chart / "values.yaml").write_text(yaml.safe_dump(values))
    out = _helm("template", "r", str(chart), "--set", "image.tag=v1,router.enabled=true", check=False)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    router = _one(docs, "Deployment", "sandbox-router")["spec"]["template"]["spec"]["containers"][0]
    assert "--sandbox-lifecycle" not in router["args"]
    # scoped-token with only a name given: the key is values.yaml's default.
    out = _helm(
        "template", "r", str(chart), "--set", "image.tag=v1,router.enabled=true",
        "--set", "router.authzMode=scoped-token,router.scopedTokenSecret.name=key", check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "--authz-scoped-token-secret-file=/etc/sandbox-router/scoped-token/secret" in out.stdout


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ("imagePullSecrets[0]=regcred", "at '/imagePullSecrets/0': got string, want object"),
        ('imagePullSecrets=[{"name": ""}]', "at '/imagePullSecrets/0/name': minLength: got 0, want 1"),
        ('imagePullSecrets=[{"secret": "regcred"}]', "at '/imagePullSecrets/0': missing property 'name'"),
        ("router.podDisruptionBudget.minAvailable=eighty", "at '/router/podDisruptionBudget/minAvailable'"),
        ("router.podDisruptionBudget.minAvailable=101%", "at '/router/podDisruptionBudget/minAvailable'"),
        ("router.podDisruptionBudget.minAvailable=-1", "at '/router/podDisruptionBudget/minAvailable'"),
        ("router.podDisruptionBudget.minAvailable=2", "allows no voluntary disruption"),
        ("router.podDisruptionBudget.minAvailable=3", "allows no voluntary disruption"),
        ("router.podDisruptionBudget.minAvailable=100%", "allows no voluntary disruption"),
        # Kubernetes rounds a percentage of minAvailable up: 51% of 2 replicas is 2.
        ("router.podDisruptionBudget.minAvailable=51%", "allows no voluntary disruption"),
    ],
)
def test_pull_secrets_and_blocking_disruption_budgets_are_refused(values: str, error: str) -> None:
    """imagePullSecrets are LocalObjectReferences (a bare name is refused by the API server half-way through
    the install); a router PDB whose minAvailable leaves no pod to evict blocks every node drain."""
    flag = "--set-json" if values.endswith("]") else "--set"
    out = _helm(
        "template", "x", CHART, "--set", "image.tag=v1,router.enabled=true", flag, values, check=False
    )
    assert out.returncode != 0, values
    assert error in out.stderr, out.stderr


def test_disruption_budgets_that_allow_an_eviction_render() -> None:
    for value, replicas in (("1", "2"), ("50%", "2"), ("2", "3"), ("66%", "3"), ("0", "2")):
        docs = _template(
            "--set", "image.tag=v1,router.enabled=true", "--set", f"router.replicaCount={replicas}",
            "--set-string" if value.endswith("%") else "--set",
            f"router.podDisruptionBudget.minAvailable={value}",
        )  # fmt: skip
        pdb = _one(docs, "PodDisruptionBudget")
        assert str(pdb["spec"]["minAvailable"]) == value
    docs = _template("--set", "image.tag=v1", "--set", "imagePullSecrets[0].name=regcred")
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_ordinary_upgrades_pass_the_install_time_checks(installed: Installed) -> None:
    """The Namespace and nameOverride checks refuse only what would break a live release: `helm upgrade
    --install` from scratch and again, a release whose Namespace came from `--create-namespace` (no release
    annotations), and leader election off and back on (Recreate, then the rolling update again) all go
    through."""
    cluster = installed.cluster
    reuse = ("agent-sandbox", CHART, "--reuse-values", "--set")
    for tag in ("v1", "v2"):  # the first is an install (nothing to check), the second an upgrade
        helm(cluster, "upgrade", "--install", *reuse, f"image.tag={tag}")
    for elect, strategy in (("false", "Recreate"), ("true", "RollingUpdate")):
        helm(cluster, "upgrade", *reuse, f"controller.leaderElect={elect}")
        dep = installed.kubectl_json("get", "deployment", "agent-sandbox-controller", "-n", SYSTEM_NS)
        assert dep["spec"]["strategy"]["type"] == strategy
    helm(cluster, "uninstall", "agent-sandbox", "--wait")
    cluster.kubectl("delete", "namespace", SYSTEM_NS, "--ignore-not-found", "--timeout=60s")

    in_ns = ("--namespace", SYSTEM_NS)
    helm(
        cluster, "install", "agent-sandbox", CHART, *in_ns, "--create-namespace", "--set",
        "image.tag=v1,namespace.create=false",
    )  # fmt: skip
    helm(cluster, "upgrade", "agent-sandbox", CHART, *in_ns, "--reuse-values", "--set", "image.tag=v2")
    history = json.loads(helm(cluster, "history", "agent-sandbox", *in_ns, "-o", "json").stdout)
    assert [h["status"] for h in history] == ["superseded", "deployed"]
    helm(cluster, "uninstall", "agent-sandbox", *in_ns, "--wait")
