"""Pure parts of the dev cluster: rendered files, PKI, process identity."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agent_sandbox.devcluster.certs import write_cluster_pki
from agent_sandbox.devcluster.config import (
    ClusterConfig,
    kubeconfig_yaml,
    kwok_stages_yaml,
    node_manifest,
    scheduler_config_yaml,
)
from agent_sandbox.devcluster.processes import is_ours, spawn, stop

pytestmark = pytest.mark.unit


def test_kubeconfig_has_one_context_pointing_at_the_server(tmp_path: Path) -> None:
    doc = yaml.safe_load(
        kubeconfig_yaml(
            name="c",
            server="https://127.0.0.1:1",
            ca=tmp_path / "ca",
            cert=tmp_path / "c",
            key=tmp_path / "k",
            user="u",
        )
    )
    assert doc["current-context"] == "c"
    assert doc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:1"
    assert doc["users"][0]["user"]["client-key"] == str(tmp_path / "k")


def test_scheduler_config_carries_client_qps_and_disables_leader_election(tmp_path: Path) -> None:
    doc = yaml.safe_load(
        scheduler_config_yaml(tmp_path / "kc", ClusterConfig(scheduler_qps=7, scheduler_burst=9))
    )
    assert doc["clientConnection"] == {"kubeconfig": str(tmp_path / "kc"), "qps": 7, "burst": 9}
    assert doc["leaderElection"] == {"leaderElect": False}


def _stage_docs(cfg: ClusterConfig) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(kwok_stages_yaml(cfg)) if d["kind"] == "Stage"]


def test_kwok_stages_are_valid_yaml_and_pod_delete_honours_finalizers() -> None:
    docs = _stage_docs(ClusterConfig(pod_grace_period_cap_ms=250))
    names = {d["metadata"]["name"] for d in docs}
    assert {"node-initialize", "pod-ready", "pod-delete"} <= names
    delete = next(d for d in docs if d["metadata"]["name"] == "pod-delete")
    keys = {e["key"]: e["operator"] for e in delete["spec"]["selector"]["matchExpressions"]}
    assert keys[".metadata.finalizers"] == "DoesNotExist"
    assert "finalizers" not in delete["spec"]["next"]
    assert "pod-delete-instant" not in names


_GRACEFUL = {"pod-not-ready-on-delete", "pod-terminating", "pod-terminated", "pod-delete"}


def test_instant_pod_deletion_swaps_the_graceful_stages_for_one_delete_that_keeps_finalizers() -> None:
    docs = _stage_docs(ClusterConfig(pod_deletion="instant"))
    names = {d["metadata"]["name"] for d in docs}
    assert "pod-delete-instant" in names
    assert not names & _GRACEFUL
    assert {"pod-ready", "pod-exit", "node-initialize"} <= names
    delete = next(d for d in docs if d["metadata"]["name"] == "pod-delete-instant")
    keys = {e["key"]: e["operator"] for e in delete["spec"]["selector"]["matchExpressions"]}
    assert keys == {
        ".metadata.deletionTimestamp": "Exists",
        ".metadata.finalizers": "DoesNotExist",
        ".metadata.deletionGracePeriodSeconds | tostring": "NotIn",
    }
    assert delete["spec"]["next"] == {"delete": True}
    graceful = {d["metadata"]["name"] for d in _stage_docs(ClusterConfig())}
    assert graceful >= _GRACEFUL


def test_kwoks_configuration_comes_first_with_its_pod_parallelism() -> None:
    docs = list(yaml.safe_load_all(kwok_stages_yaml(ClusterConfig(kwok_pod_parallelism=24))))
    assert (docs[0]["apiVersion"], docs[0]["kind"]) == ("config.kwok.x-k8s.io/v1alpha1", "KwokConfiguration")
    assert docs[0]["options"]["podPlayStageParallelism"] == 24
    assert [d["kind"] for d in docs[1:]] == ["Stage"] * (len(docs) - 1)
    default = next(yaml.safe_load_all(kwok_stages_yaml(ClusterConfig())))["options"]
    # kwok skips its own defaults once given a configuration: every parallelism must be stated (> 0).
    assert default["podPlayStageParallelism"] == 4
    assert default["nodePlayStageParallelism"] == default["nodeLeaseParallelism"] == 4
    assert default["podsOnNodeSyncParallelism"] == 1
    with pytest.raises(ValueError, match="kwok_pod_parallelism"):
        kwok_stages_yaml(ClusterConfig(kwok_pod_parallelism=0))


def test_an_unknown_pod_deletion_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="pod_deletion"):
        kwok_stages_yaml(ClusterConfig(pod_deletion="fast"))


def test_node_manifest_is_managed_by_kwok_and_reports_capacity() -> None:
    node = node_manifest("n1", ClusterConfig(node_cpu="4", node_memory="8Gi", node_pods=50))
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"  # type: ignore[index]
    assert node["status"]["allocatable"] == {"cpu": "4", "memory": "8Gi", "pods": "50"}  # type: ignore[index]


def test_pki_chains_to_the_ca_with_the_right_identities(tmp_path: Path) -> None:
    pki = write_cluster_pki(tmp_path, service_ip="10.96.0.1")
    ca = x509.load_pem_x509_certificate(pki.ca.cert.read_bytes())
    server = x509.load_pem_x509_certificate(pki.apiserver.cert.read_bytes())
    admin = x509.load_pem_x509_certificate(pki.admin.cert.read_bytes())
    for leaf in (server, admin):
        leaf.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    assert (
        ExtendedKeyUsageOID.SERVER_AUTH
        in server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    )
    org = admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value
    assert org == "system:masters"
    assert oct(pki.admin.key.stat().st_mode & 0o777) == "0o600"


def test_stop_only_stops_the_process_we_started(tmp_path: Path) -> None:
    started = spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], log=tmp_path / "s.log")
    assert is_ours(started.pid, started.exe)
    # A recycled PID running something else is not ours.
    assert not is_ours(started.pid, "/bin/definitely-not-this")
    stop(started, grace=5)
    assert not is_ours(started.pid, started.exe)


def test_spawned_processes_do_not_inherit_in_cluster_addresses(tmp_path: Path) -> None:
    env_probe = "import os; print(os.environ.get('KUBERNETES_SERVICE_HOST', 'unset'))"
    os.environ["KUBERNETES_SERVICE_HOST"] = "10.96.0.1"
    try:
        started = spawn("probe", [sys.executable, "-c", env_probe], log=tmp_path / "p.log")
        for _ in range(100):
            if not is_ours(started.pid, started.exe):
                break
            time.sleep(0.05)
    finally:
        del os.environ["KUBERNETES_SERVICE_HOST"]
    assert (tmp_path / "p.log").read_text().strip() == "unset"


def test_audit_policy_keeps_writes_and_sandbox_creates_with_their_response() -> None:
    from agent_sandbox.devcluster.config import audit_policy_yaml

    rules = yaml.safe_load(audit_policy_yaml())["rules"]
    assert rules[0] == {"level": "None", "verbs": ["get", "list", "watch"]}
    creates = next(r for r in rules if r["level"] == "RequestResponse")
    assert creates["verbs"] == ["create"]
    assert creates["resources"] == [{"group": "agents.x-k8s.io", "resources": ["sandboxes"]}]
    assert "omitStages" not in creates  # RequestReceived kept: the trace of a create the server died in
    assert rules[-1] == {"level": "Metadata", "omitStages": ["RequestReceived"]}  # every other write
    assert "omitStages" not in yaml.safe_load(audit_policy_yaml())  # per rule, or it would cover creates


def test_audit_policy_with_bodies_logs_every_write_at_request_level_and_events() -> None:
    from agent_sandbox.devcluster.config import audit_policy_yaml

    def events_ignored(rules: list[dict[str, object]]) -> bool:
        return any(r["level"] == "None" and "resources" in r for r in rules)

    plain = yaml.safe_load(audit_policy_yaml())["rules"]
    bodies = yaml.safe_load(audit_policy_yaml(bodies=True))["rules"]
    assert events_ignored(plain)
    assert not events_ignored(bodies)
    assert bodies[-2] == {
        "level": "Request",
        "omitStages": ["RequestReceived"],
    }  # before the Metadata catch-all
    assert bodies[-1] == plain[-1]
    assert [r for r in plain if r["level"] != "None" or "resources" not in r] == [
        r for r in bodies if r != bodies[-2]
    ]
