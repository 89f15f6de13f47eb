"""CRD generation: deterministic, matches k8s/crds, and matches the wire contract of api spec §1-§6."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_sandbox.api import crdgen
from agent_sandbox.api.v1beta1 import VCT_IMMUTABLE_MESSAGE, VCT_IMMUTABLE_RULE
from agent_sandbox.manifests.generated import main as generate_main

pytestmark = pytest.mark.unit

CRD_DIR = Path(__file__).resolve().parents[3] / "k8s" / "crds"


@pytest.fixture(scope="module")
def crds() -> dict[str, dict[str, Any]]:
    return {crd["spec"]["names"]["kind"]: crd for crd in crdgen.crds()}


def version(crd: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in crd["spec"]["versions"] if v["name"] == name)


def schema(crd: dict[str, Any], name: str) -> dict[str, Any]:
    s: dict[str, Any] = version(crd, name)["schema"]["openAPIV3Schema"]
    return s


def walk(node: Any, path: str = "") -> Any:
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}/{i}")


def test_generation_is_deterministic_and_checked_in() -> None:
    first, second = crdgen.generate(), crdgen.generate()
    assert first == second
    assert sorted(first) == [
        "agents.x-k8s.io_sandboxes.yaml",
        "extensions.agents.x-k8s.io_sandboxclaims.yaml",
        "extensions.agents.x-k8s.io_sandboxtemplates.yaml",
        "extensions.agents.x-k8s.io_sandboxwarmpools.yaml",
    ]
    for name, text in first.items():
        assert (CRD_DIR / name).read_text() == text, f"k8s/crds/{name} drifted: run `agent-sandbox generate`"


def test_check_cli_detects_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`agent-sandbox generate [--check]` (manifests.generated) over a scratch checkout."""
    assert generate_main(["--check", "--root", str(tmp_path)]) == 1  # nothing written yet
    assert generate_main(["--root", str(tmp_path)]) == 0
    assert generate_main(["--check", "--root", str(tmp_path)]) == 0
    target = tmp_path / "k8s" / "crds" / "extensions.agents.x-k8s.io_sandboxwarmpools.yaml"
    target.write_text(target.read_text().replace("default: 1\n", "default: 2\n"))
    capsys.readouterr()
    assert generate_main(["--check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "-                default: 2" in out
    assert "+                default: 1" in out
    generate_main(["--root", str(tmp_path)])
    (tmp_path / "helm" / "crds" / "stray.yaml").write_text("---\n")
    assert generate_main(["--check", "--root", str(tmp_path)]) == 1


def test_yaml_parses_back_to_the_objects() -> None:
    for crd in crdgen.crds():
        assert yaml.safe_load(crdgen.render(crd)) == crd


@pytest.mark.parametrize(
    ("kind", "crd_name", "group", "plural", "singular", "list_kind", "short"),
    [
        ("Sandbox", "sandboxes.agents.x-k8s.io", "agents.x-k8s.io", "sandboxes", "sandbox", "SandboxList", "sandbox"),
        ("SandboxTemplate", "sandboxtemplates.extensions.agents.x-k8s.io", "extensions.agents.x-k8s.io",
         "sandboxtemplates", "sandboxtemplate", "SandboxTemplateList", "sandboxtemplate"),
        ("SandboxClaim", "sandboxclaims.extensions.agents.x-k8s.io", "extensions.agents.x-k8s.io",
         "sandboxclaims", "sandboxclaim", "SandboxClaimList", "sandboxclaim"),
        ("SandboxWarmPool", "sandboxwarmpools.extensions.agents.x-k8s.io", "extensions.agents.x-k8s.io",
         "sandboxwarmpools", "sandboxwarmpool", "SandboxWarmPoolList", "swp"),
    ],
)  # fmt: skip
def test_names_scope_versions_conversion(
    crds: dict[str, dict[str, Any]], kind: str, crd_name: str, group: str, plural: str, singular: str,
    list_kind: str, short: str,
) -> None:  # fmt: skip
    crd = crds[kind]
    assert crd["metadata"] == {"name": crd_name}
    spec = crd["spec"]
    assert spec["group"] == group
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {"kind": kind, "listKind": list_kind, "plural": plural, "shortNames": [short],
                             "singular": singular}  # fmt: skip
    assert [v["name"] for v in spec["versions"]] == ["v1beta1", "v1alpha1"]
    beta, alpha = spec["versions"]
    assert (beta["served"], beta["storage"], "deprecated" in beta) == (True, True, False)
    assert (alpha["served"], alpha["storage"], alpha["deprecated"]) == (True, False, True)
    assert alpha["deprecationWarning"] == (
        f"{group}/v1alpha1 {kind} is deprecated; use {group}/v1beta1 {kind} instead"
    )
    assert spec["conversion"] == {
        "strategy": "Webhook",
        "webhook": {
            "clientConfig": {"service": {"name": "agent-sandbox-webhook-service",
                                         "namespace": "agent-sandbox-system", "path": "/convert"}},
            "conversionReviewVersions": ["v1", "v1beta1"],
        },
    }  # fmt: skip
    for ver in spec["versions"]:
        root = ver["schema"]["openAPIV3Schema"]
        assert root["required"] == ["spec"]
        assert root["properties"]["metadata"] == {"type": "object"}
        assert root["properties"]["apiVersion"] == {"type": "string"}


SCALE = {"labelSelectorPath": ".status.selector", "specReplicasPath": ".spec.replicas",
         "statusReplicasPath": ".status.replicas"}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "ver", "subresources"),
    [
        ("Sandbox", "v1beta1", {"status": {}}),
        ("Sandbox", "v1alpha1", {"status": {}, "scale": SCALE}),
        ("SandboxTemplate", "v1beta1", None),
        ("SandboxTemplate", "v1alpha1", None),
        ("SandboxClaim", "v1beta1", {"status": {}}),
        ("SandboxClaim", "v1alpha1", {"status": {}}),
        ("SandboxWarmPool", "v1beta1", {"status": {}, "scale": SCALE}),
        ("SandboxWarmPool", "v1alpha1", {"status": {}, "scale": SCALE}),
    ],
)
def test_subresources(crds: dict[str, dict[str, Any]], kind: str, ver: str, subresources: Any) -> None:
    assert version(crds[kind], ver).get("subresources") == subresources


READY = {"jsonPath": ".status.conditions[?(@.type=='Ready')].status", "name": "Ready", "type": "string"}
REASON = {"jsonPath": ".status.conditions[?(@.type=='Ready')].reason", "name": "Reason", "type": "string"}
AGE = {"jsonPath": ".metadata.creationTimestamp", "name": "Age", "type": "date"}
POOL = [{"jsonPath": ".status.readyReplicas", "name": "Ready", "type": "integer"},
        {"jsonPath": ".spec.replicas", "name": "Desired", "type": "integer"}, AGE]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "ver", "columns"),
    [
        ("Sandbox", "v1beta1", [READY, REASON, AGE]),
        ("Sandbox", "v1alpha1", None),
        ("SandboxClaim", "v1beta1",
         [READY, {"jsonPath": ".status.sandbox.name", "name": "Sandbox", "type": "string"}, REASON, AGE]),
        ("SandboxClaim", "v1alpha1", None),
        ("SandboxTemplate", "v1beta1", None),
        ("SandboxWarmPool", "v1beta1", POOL),
        ("SandboxWarmPool", "v1alpha1", POOL),
    ],
)  # fmt: skip
def test_printer_columns(crds: dict[str, dict[str, Any]], kind: str, ver: str, columns: Any) -> None:
    assert version(crds[kind], ver).get("additionalPrinterColumns") == columns


def count_rows(node: dict[str, Any], path: str = "") -> int:
    """Count field-table rows; ``path`` uses /name and /items segments only."""
    if path.endswith(("/podTemplate/spec", "/volumeClaimTemplates/items/spec", "/ingress/items", "/egress/items",
                      "/conditions/items")):  # fmt: skip
        return 0
    total = 0
    for name, child in (node.get("properties") or {}).items():
        total += 1 + count_rows(child, f"{path}/{name}")
    if "items" in node:
        total += count_rows(node["items"], f"{path}/items")
    return total


@pytest.mark.parametrize(
    ("kind", "ver", "spec_rows", "status_rows"),
    [
        ("Sandbox", "v1beta1", 15, 6),
        ("Sandbox", "v1alpha1", 15, 6),
        ("SandboxTemplate", "v1beta1", 18, None),
        ("SandboxTemplate", "v1alpha1", 17, None),
        ("SandboxClaim", "v1beta1", 19, 4),
        ("SandboxClaim", "v1alpha1", 14, 4),
        ("SandboxWarmPool", "v1beta1", 5, 4),
        ("SandboxWarmPool", "v1alpha1", 5, 3),
    ],
)
def test_field_counts_match_spec_table(
    crds: dict[str, dict[str, Any]], kind: str, ver: str, spec_rows: int, status_rows: int | None
) -> None:
    props = schema(crds[kind], ver)["properties"]
    assert count_rows(props["spec"]) == spec_rows
    if status_rows is None:
        assert "status" not in props
    else:
        assert count_rows(props["status"]) == status_rows


def test_spec_fields_enums_defaults(crds: dict[str, dict[str, Any]]) -> None:
    sb = schema(crds["Sandbox"], "v1beta1")["properties"]["spec"]
    assert sb["required"] == ["podTemplate"]
    p = sb["properties"]
    assert p["operatingMode"] == {"default": "Running", "enum": ["Running", "Suspended"], "type": "string"}
    assert p["shutdownPolicy"] == {"default": "Retain", "enum": ["Delete", "Retain"], "type": "string"}
    assert p["shutdownTime"] == {"format": "date-time", "type": "string"}
    assert p["service"] == {"type": "boolean"}
    assert p["volumeClaimTemplates"]["x-kubernetes-list-type"] == "atomic"
    assert p["volumeClaimTemplates"]["items"]["required"] == ["spec"]
    assert p["podTemplate"]["required"] == ["spec"]
    assert p["podTemplate"]["properties"]["spec"]["required"] == ["containers"]
    assert sb["x-kubernetes-validations"] == [{"message": VCT_IMMUTABLE_MESSAGE, "rule": VCT_IMMUTABLE_RULE}]
    assert VCT_IMMUTABLE_MESSAGE == "volumeClaimTemplates is immutable"

    alpha = schema(crds["Sandbox"], "v1alpha1")["properties"]
    assert "x-kubernetes-validations" not in alpha["spec"]
    assert alpha["spec"]["properties"]["replicas"] == {"default": 1, "format": "int32", "maximum": 1, "minimum": 0,
                                                       "type": "integer"}  # fmt: skip
    assert alpha["status"]["properties"]["replicas"] == {"format": "int32", "minimum": 0, "type": "integer"}
    assert "nodeName" not in alpha["status"]["properties"]

    tp = schema(crds["SandboxTemplate"], "v1beta1")["properties"]["spec"]["properties"]
    assert tp["networkPolicyManagement"] == {
        "default": "Managed",
        "enum": ["Managed", "Unmanaged"],
        "type": "string",
    }
    assert tp["envVarsInjectionPolicy"]["enum"] == ["Allowed", "Overrides", "Disallowed"]
    assert tp["envVarsInjectionPolicy"]["default"] == "Disallowed"
    assert tp["volumeClaimTemplatesPolicy"] == {"default": "Disallowed",
                                                "enum": ["Disallowed", "Allowed", "Overrides"], "type": "string"}  # fmt: skip

    cl = schema(crds["SandboxClaim"], "v1beta1")["properties"]["spec"]
    assert cl["required"] == ["warmPoolRef"]
    assert cl["properties"]["warmPoolRef"]["required"] == ["name"]
    life = cl["properties"]["lifecycle"]["properties"]
    assert life["shutdownPolicy"]["enum"] == ["Delete", "DeleteForeground", "Retain"]
    assert life["ttlSecondsAfterFinished"] == {"format": "int32", "minimum": 0, "type": "integer"}
    assert cl["properties"]["env"]["items"]["required"] == ["name", "value"]
    acl = schema(crds["SandboxClaim"], "v1alpha1")["properties"]["spec"]
    assert acl["required"] == ["sandboxTemplateRef"]
    assert acl["properties"]["warmpool"] == {"default": "default", "type": "string"}

    wp = schema(crds["SandboxWarmPool"], "v1beta1")["properties"]
    assert wp["spec"]["required"] == ["sandboxTemplateRef"]
    assert wp["spec"]["properties"]["replicas"] == {
        "default": 1,
        "format": "int32",
        "minimum": 0,
        "type": "integer",
    }
    assert wp["spec"]["properties"]["updateStrategy"]["properties"]["type"] == {
        "default": "OnReplenish", "enum": ["Recreate", "OnReplenish"], "type": "string"}  # fmt: skip
    assert wp["status"]["properties"]["observedGeneration"] == {
        "format": "int64",
        "minimum": 0,
        "type": "integer",
    }
    awp = schema(crds["SandboxWarmPool"], "v1alpha1")["properties"]
    assert awp["spec"]["required"] == ["replicas", "sandboxTemplateRef"]
    assert "default" not in awp["spec"]["properties"]["replicas"]


def test_condition_schema(crds: dict[str, dict[str, Any]]) -> None:
    cond = schema(crds["SandboxClaim"], "v1beta1")["properties"]["status"]["properties"]["conditions"]
    assert "x-kubernetes-list-type" not in cond
    item = cond["items"]
    assert item["required"] == ["lastTransitionTime", "message", "reason", "status", "type"]
    p = item["properties"]
    assert p["status"]["enum"] == ["True", "False", "Unknown"]
    assert p["type"]["maxLength"] == 316
    assert p["reason"] == {"maxLength": 1024, "minLength": 1, "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                           "type": "string"}  # fmt: skip
    assert p["message"] == {"maxLength": 32768, "type": "string"}
    assert p["observedGeneration"] == {"format": "int64", "minimum": 0, "type": "integer"}
    assert p["lastTransitionTime"] == {"format": "date-time", "type": "string"}


def test_no_descriptions_and_no_preserve_unknown_fields() -> None:
    for crd in crdgen.crds():
        for path, node in walk(crd):
            if isinstance(node, dict):
                assert "description" not in node, path
                assert "x-kubernetes-preserve-unknown-fields" not in node, path
                assert "$ref" not in node, path


def test_embedded_pod_spec(crds: dict[str, dict[str, Any]]) -> None:
    ps = schema(crds["Sandbox"], "v1beta1")["properties"]["spec"]["properties"]["podTemplate"]["properties"][
        "spec"
    ]
    assert len(ps["properties"]) == 42
    assert ps["required"] == ["containers"]
    p = ps["properties"]
    for name in ("containers", "initContainers", "ephemeralContainers", "volumes", "resourceClaims",
                 "schedulingGates", "imagePullSecrets"):  # fmt: skip
        assert (p[name]["x-kubernetes-list-type"], p[name]["x-kubernetes-list-map-keys"]) == (
            "map",
            ["name"],
        ), name
    assert p["hostAliases"]["x-kubernetes-list-map-keys"] == ["ip"]
    assert p["topologySpreadConstraints"]["x-kubernetes-list-map-keys"] == [
        "topologyKey",
        "whenUnsatisfiable",
    ]
    container = p["containers"]["items"]
    assert "name" in container["required"]
    ports = container["properties"]["ports"]
    assert ports["x-kubernetes-list-map-keys"] == ["containerPort", "protocol"]
    assert ports["items"]["properties"]["protocol"]["default"] == "TCP"
    assert "default" not in ports["items"]["properties"]["containerPort"], (
        "zero-value defaults must be dropped"
    )
    assert "default" not in p["containers"]["items"], "item {} defaults must be dropped"
    assert p["restartPolicy"] == {"type": "string"}, "+enum lists are not rendered (controller-gen parity)"
    assert p["overhead"]["additionalProperties"]["x-kubernetes-int-or-string"] is True
    cpu = container["properties"]["resources"]["properties"]["limits"]["additionalProperties"]
    assert cpu["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert cpu["pattern"].startswith("^(\\+|-)?")
    eph = p["volumes"]["items"]["properties"]["ephemeral"]["properties"]["volumeClaimTemplate"]["properties"]
    assert eph["metadata"] == {"type": "object"}


def test_embedded_defaults_are_the_declared_ones(crds: dict[str, dict[str, Any]]) -> None:
    ps = schema(crds["Sandbox"], "v1beta1")["properties"]["spec"]["properties"]["podTemplate"]["properties"][
        "spec"
    ]
    defaults = {(path.replace("/properties", "").replace("/items", "[]"), json.dumps(node["default"]))
                for path, node in walk(ps) if isinstance(node, dict) and "default" in node}  # fmt: skip
    assert len(defaults) == 47  # api spec §2.4: 47 per version
    by_suffix = {(path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1], value) for path, value in defaults}
    expected = {
        ("ports[]/protocol", '"TCP"'),
        ("secretRef/name", '""'),
        ("secretKeyRef/name", '""'),
        ("configMapRef/name", '""'),
        ("configMapKeyRef/name", '""'),
        ("configMap/name", '""'),
        ("secret/name", '""'),
        ("imagePullSecrets[]/name", '""'),
        ("nodePublishSecretRef/name", '""'),
        ("grpc/service", '""'),
        ("fileKeyRef/optional", "false"),
        ("azureDisk/fsType", '"ext4"'),
        ("azureDisk/readOnly", "false"),
        ("iscsi/iscsiInterface", '"default"'),
        ("rbd/keyring", '"/etc/ceph/keyring"'),
        ("rbd/pool", '"rbd"'),
        ("rbd/user", '"admin"'),
        ("scaleIO/fsType", '"xfs"'),
        ("scaleIO/storageMode", '"ThinProvisioned"'),
    }
    assert expected <= by_suffix
    assert not {
        s
        for s in by_suffix
        if s[0].startswith("azureDisk/") and s[0].split("/")[1] in ("cachingMode", "kind")
    }


def test_embedded_pvc_and_network_rules(crds: dict[str, dict[str, Any]]) -> None:
    sb = schema(crds["Sandbox"], "v1beta1")["properties"]["spec"]["properties"]
    pvc = sb["volumeClaimTemplates"]["items"]["properties"]["spec"]
    assert sorted(pvc["properties"]) == ["accessModes", "dataSource", "dataSourceRef", "resources", "selector",
                                         "storageClassName", "volumeAttributesClassName", "volumeMode",
                                         "volumeName"]  # fmt: skip
    assert "required" not in pvc
    np = schema(crds["SandboxTemplate"], "v1beta1")["properties"]["spec"]["properties"]["networkPolicy"]
    for rule, peers in (("ingress", "from"), ("egress", "to")):
        item = np["properties"][rule]["items"]
        assert sorted(item["properties"]) == sorted([peers, "ports"])
        ports = item["properties"]["ports"]
        assert ports["x-kubernetes-list-type"] == "atomic"
        port = ports["items"]["properties"]
        assert port["port"]["x-kubernetes-int-or-string"] is True
        assert port["endPort"] == {"format": "int32", "type": "integer"}
        assert port["protocol"] == {"type": "string"}  # no schema default for NetworkPolicy ports


def test_vendor_extension_totals() -> None:
    text = "".join(crdgen.generate().values())
    # api spec §2.4 totals for controller-gen + k8s.io/api v0.36. Our embedded schemas come from the
    # pinned Kubernetes v1.35.4; map-type differs (194 vs 230): 9 fewer atomic structs per PodSpec.
    assert text.count("x-kubernetes-list-type:") == 646
    assert text.count("x-kubernetes-int-or-string:") == 202
    assert text.count("x-kubernetes-list-map-keys:") == 100
    assert text.count("x-kubernetes-validations:") == 1
    assert text.count("x-kubernetes-map-type:") == 194
    assert crdgen.kubernetes_version() == "v1.35.4"
