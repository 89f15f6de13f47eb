"""Release assets (operations §3): membership, order, image substitution, drift guard."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from agent_sandbox.cli.main import main
from agent_sandbox.manifests import REPO_ROOT, DriftError, check_drift, render_assets, substitute_images

pytestmark = pytest.mark.unit


def _fake_kustomize(directory: Path) -> str:
    return (
        f"# kustomized {directory.name}\nimage: ko://sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller\n"
    )


def _sources(text: str) -> list[str]:
    """The `kind/name` of each document, in order."""
    return [f"{d['kind']}/{d['metadata']['name']}" for d in yaml.safe_load_all(text) if d]


def test_assets_membership_and_order() -> None:
    assets = render_assets(REPO_ROOT / "k8s", tag="v9.9.9", kustomize=_fake_kustomize).files
    assert set(assets) == {
        "sandbox.yaml",
        "extensions.yaml",
        "sandbox-with-extensions.yaml",
        "sandbox-router.yaml",
    }
    core = _sources(assets["sandbox.yaml"])
    # controller.yaml, then crds/agents.x-k8s.io_sandboxes.yaml, then rbac.generated.yaml (sorted by path).
    assert core[0] == "Namespace/agent-sandbox-system"
    assert core[-2:] == [
        "CustomResourceDefinition/sandboxes.agents.x-k8s.io",
        "ClusterRole/agent-sandbox-controller",
    ]
    assert core.count("Deployment/agent-sandbox-controller") == 1
    ext = _sources(assets["extensions.yaml"])
    assert ext == [
        "CustomResourceDefinition/sandboxclaims.extensions.agents.x-k8s.io",
        "CustomResourceDefinition/sandboxtemplates.extensions.agents.x-k8s.io",
        "CustomResourceDefinition/sandboxwarmpools.extensions.agents.x-k8s.io",
        "ClusterRole/agent-sandbox-controller-extensions",
        "Deployment/agent-sandbox-controller",
        "ClusterRoleBinding/agent-sandbox-controller-extensions",
    ]
    router = _sources(assets["sandbox-router.yaml"])
    assert "Deployment/sandbox-router" in router
    assert "Service/sandbox-router-svc" in router


def test_every_image_is_substituted() -> None:
    assets = render_assets(
        REPO_ROOT / "k8s", tag="v1.2.3", registry="example.com/as", kustomize=_fake_kustomize
    )
    for name, text in assets.files.items():
        assert "ko://" not in text, name
    assert "image: example.com/as/agent-sandbox-controller:v1.2.3\n" in assets.files["sandbox.yaml"]
    assert "image: example.com/as/agent-sandbox-controller:v1.2.3\n" in assets.files["extensions.yaml"]
    assert (
        "image: example.com/as/agent-sandbox-controller:v1.2.3\n"
        in assets.files["sandbox-with-extensions.yaml"]
    )
    assert "image: example.com/as/sandbox-router:v1.2.3\n" in assets.files["sandbox-router.yaml"]


def test_substitution_replaces_the_rest_of_the_line() -> None:
    text = "  image: ko://sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller:latest # dev\nnext: 1\n"
    assert substitute_images(text, tag="v1") == (
        "  image: registry.k8s.io/agent-sandbox/agent-sandbox-controller:v1\nnext: 1\n"
    )


def test_empty_tag_is_refused() -> None:
    with pytest.raises(ValueError, match="tag"):
        render_assets(REPO_ROOT / "k8s", tag=" ", kustomize=_fake_kustomize)


def test_registry_trailing_slash_is_not_doubled() -> None:
    assets = render_assets(REPO_ROOT / "k8s", tag="v1", registry="reg.example/x/", kustomize=_fake_kustomize)
    assert "image: reg.example/x/agent-sandbox-controller:v1\n" in assets.files["sandbox.yaml"]
    assert "//" not in assets.files["sandbox-router.yaml"].replace("://", "")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["release"], "usage error: agent-sandbox release needs --tag (e.g. --tag v0.1.0)\n"),
        (["release", "--tag", " "], "usage error: agent-sandbox release needs --tag (e.g. --tag v0.1.0)\n"),
        (
            ["release", "--tag", "v1", "--registry", "/"],
            "usage error: --registry must name a registry, e.g. registry.k8s.io/agent-sandbox\n",
        ),
    ],
)
def test_release_command_usage_errors_are_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not a traceback: the caller left out or mistyped an option."""
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.err == message
    assert captured.out == ""
    assert not (tmp_path / "out").exists()


def test_drift_guard(tmp_path: Path) -> None:
    k8s = tmp_path / "k8s"
    shutil.copytree(REPO_ROOT / "k8s", k8s)
    check_drift(k8s)  # the checked-in tree is consistent
    (k8s / "extra.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(DriftError, match=r"only in files \['extra.yaml'\]"):
        check_drift(k8s)
    (k8s / "extra.yaml").unlink()
    kustomization = yaml.safe_load((k8s / "kustomization.yaml").read_text())
    kustomization["resources"].remove("extensions.yaml")
    (k8s / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    with pytest.raises(DriftError, match=r"only in files \['extensions.yaml'\]"):
        render_assets(k8s, tag="v1", kustomize=_fake_kustomize)
    # Optional components are not install files: a new router file is no drift.
    (k8s / "router" / "extra.yaml").write_text("kind: ConfigMap\n")
    kustomization["resources"].append("extensions.yaml")
    (k8s / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    check_drift(k8s)
