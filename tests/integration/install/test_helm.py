"""The Helm chart (operations §5): lint, template (every value, upstream's argument rendering), install ->
controller ready -> upgrade keeps sandboxes -> uninstall, with helm v3 built from its Go module."""

from __future__ import annotations

import base64
import json
import subprocess
from typing import Any

import pytest
import yaml

from agent_sandbox.devcluster import ensure_binaries
from agent_sandbox.devcluster.install import helm
from agent_sandbox.manifests import REPO_ROOT
from tests.helpers import wait_for
from tests.integration.install.conftest import Installed

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
        ("Deployment", "agent-sandbox-controller"),
        ("Namespace", "agent-sandbox-system"),
        ("Role", "agent-sandbox-controller"),
        ("RoleBinding", "agent-sandbox-controller"),
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
        if doc["kind"] != "ClusterRole":  # the generated roles are byte-identical to k8s/ (no chart labels)
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
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
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
        ("controller.sandboxWarmPoolReadinessGracePeriod=5", "got number, want string"),
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

    def patched() -> dict[str, Any] | None:
        crd: dict[str, Any] = installed.kubectl_json("get", "crd", "sandboxclaims.extensions.agents.x-k8s.io")
        return (
            crd
            if crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["namespace"] == ns
            else None
        )

    crd = wait_for(patched, what=f"the claim CRD's webhook Service reference moved to {ns}")
    secret = installed.kubectl_json("get", "secret", "agent-sandbox-webhook-certs", "-n", ns)
    assert base64.b64decode(secret["data"]["ca.crt"]) == base64.b64decode(
        crd["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"]
    )
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
