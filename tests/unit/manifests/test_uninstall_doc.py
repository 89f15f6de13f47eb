"""The uninstall commands of docs/install.md and helm/README.md remove what the install left.

Until December 6 the release-asset uninstall deleted `extensions.yaml` and `sandbox.yaml` only, leaving the
router's ClusterRole and ClusterRoleBinding that `sandbox-router.yaml` applied; the kustomize one said
`kubectl delete -k k8s/` even after an install with components (whose cluster-scoped objects it leaves); and
`helm uninstall` from a namespace the chart did not create leaves the controller's run-time Secret (the
webhook CA's private key) and its leader Lease, which neither document named.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from agent_sandbox.api.constants import WEBHOOK_CERTS_SECRET
from agent_sandbox.controllers.main import LEADER_ELECTION_ID
from agent_sandbox.manifests import REPO_ROOT, render_assets

pytestmark = pytest.mark.unit

INSTALL = REPO_ROOT / "docs" / "install.md"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


def _section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def _commands(text: str) -> list[str]:
    """Shell lines of the fenced blocks, continuation lines joined, `# or: <command>` taken as a command."""
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if line.startswith("# or: "):
                line = line[len("# or: ") :]
            if line and not line.startswith("#"):
                lines.append(line.split(" #", 1)[0].strip())
    return lines


def _assets(command: str) -> list[str]:
    return re.findall(r"release_assets/([\w.-]+\.yaml)", command)


def _cluster_scoped(text: str) -> set[str]:
    return {
        f"{d['kind']}/{d['metadata']['name']}"
        for d in yaml.safe_load_all(text)
        if d and d["kind"] in CLUSTER_SCOPED
    }


def test_the_release_asset_uninstall_deletes_every_cluster_scoped_object_the_install_applied() -> None:
    rendered = render_assets(REPO_ROOT / "k8s", tag="v0.0.1", kustomize=lambda _d: "").files
    applied = {
        a for c in _commands(_section(INSTALL, "### Release assets")) if "apply" in c for a in _assets(c)
    }
    router = _cluster_scoped(rendered["sandbox-router.yaml"])
    assert "sandbox-router.yaml" in applied
    assert {"ClusterRole/sandbox-router", "ClusterRoleBinding/sandbox-router"} <= router
    deletes = [c for c in _commands(_section(INSTALL, "## Uninstall")) if "delete" in c and _assets(c)]
    assert len(deletes) == 2  # after the sandbox.yaml + extensions.yaml pair, or sandbox-with-extensions.yaml
    for command in deletes:
        deleted = set().union(*(_cluster_scoped(rendered[a]) for a in _assets(command)))
        assert router <= deleted, f"{command!r} leaves {sorted(router - deleted)}"
        assert "--ignore-not-found" in command  # the router file (maybe never applied), one of the pair


def test_the_kustomize_uninstall_says_to_delete_the_overlay_applied() -> None:
    kustomize = [c for c in _commands(_section(INSTALL, "## Uninstall")) if re.search(r"delete .*-k ", c)]
    assert kustomize
    assert all(not c.rstrip("/").endswith("-k k8s") for c in kustomize), kustomize


@pytest.mark.parametrize(
    ("path", "heading"), [(INSTALL, "## Uninstall"), (REPO_ROOT / "helm" / "README.md", "Uninstall:")]
)
def test_the_helm_uninstall_names_what_the_controller_made_at_run_time(path: Path, heading: str) -> None:
    deletes = [c for c in _commands(_section(path, heading)) if c.startswith("kubectl") and " delete " in c]
    wanted = {f"secret/{WEBHOOK_CERTS_SECRET}", f"lease.coordination.k8s.io/{LEADER_ELECTION_ID}"}
    named = {word for c in deletes for word in c.split()}
    assert wanted <= named, deletes


@pytest.mark.parametrize(
    ("path", "heading"), [(INSTALL, "## Uninstall"), (REPO_ROOT / "helm" / "README.md", "Uninstall:")]
)
def test_the_helm_uninstall_names_the_lease_in_the_leader_election_namespace(
    path: Path, heading: str
) -> None:
    """With controller.leaderElectionNamespace elsewhere the Lease is not in namespace.name, and an upgrade
    that moved it left one in the namespace before (inst12 finding 2): a delete names that namespace too."""
    deletes = [c for c in _commands(_section(path, heading)) if c.startswith("kubectl") and " delete " in c]
    lease = f"lease.coordination.k8s.io/{LEADER_ELECTION_ID}"
    assert any("<leader-election namespace>" in c and lease in c.split() for c in deletes), deletes
