"""Every generated file of the install surfaces, and the check that the checked-in copies are current.

Owns: the list of generated files (path relative to the source checkout -> text): the four CRDs in
``k8s/crds/`` (from ``agent_sandbox.api.crdgen``) and their byte-identical copies in ``helm/crds/``; the two
generated ClusterRoles (from ``rbac``) in ``k8s/`` and their byte-identical copies in ``helm/templates/``.
``write`` regenerates them, ``check`` returns unified diffs (CI fails on any, via
``agent-sandbox generate --check`` in ``hack/test.sh``).
"""

from __future__ import annotations

import difflib
from pathlib import Path

from agent_sandbox.api.crdgen import archive_crd, file_name, render
from agent_sandbox.api.crdgen import generate as generate_crds
from agent_sandbox.manifests.lifecycle import (
    LIFECYCLE_NAME,
    LIFECYCLE_RULES,
    ROUTER_LIFECYCLE_NAME,
    ROUTER_LIFECYCLE_RULES,
)
from agent_sandbox.manifests.rbac import (
    CONTROLLER_NAME,
    CORE_RULES,
    EXTENSIONS_NAME,
    EXTENSIONS_RULES,
    render_cluster_role,
)

__all__ = ["REPO_ROOT", "check", "generated_files", "write"]

#: The source checkout (src layout: <root>/src/agent_sandbox/manifests/generated.py).
REPO_ROOT = Path(__file__).resolve().parents[3]

# The chart's switches of the generated lifecycle templates (helm/templates/_helpers.tpl): helpers, not
# `.Values.lifecycle.enabled`, because values stored by a chart without these maps (`helm upgrade
# --reuse-values` of a release made by upstream's chart) have no `lifecycle` or `router` to read.
_LIFECYCLE_ON = '{{- if include "agent-sandbox.lifecycle.enabled" . }}\n'
# The SandboxArchive CRD is rendered with lifecycle on and, where it can be, with it off, so that revisions
# hold it for `helm rollback` (the helper and its reasons: `agent-sandbox.lifecycle.crd` in _helpers.tpl).
_LIFECYCLE_CRD = '{{- if include "agent-sandbox.lifecycle.crd" . }}\n'
_ROUTER_LIFECYCLE_ON = '{{- if include "agent-sandbox.router.lifecycle.enabled" . }}\n'

# Directories whose every *.yaml must be generated (a stray file there is drift too).
_OWNED_DIRS = (Path("k8s/crds"), Path("helm/crds"))


def generated_files() -> dict[Path, str]:
    """``{path relative to the checkout: text}`` of every generated file."""
    out: dict[Path, str] = {}
    for name, text in generate_crds().items():
        out[Path("k8s/crds") / name] = text
        out[Path("helm/crds") / name] = text
    # Ours: the lifecycle component's CRD (docs/lifecycle.md); in Helm see _LIFECYCLE_CRD.
    archive = render(archive_crd())
    out[Path("k8s/lifecycle") / file_name(archive_crd())] = archive
    out[Path("helm/templates/lifecycle/crd.yaml")] = _LIFECYCLE_CRD + _helm_keep(archive) + "{{- end }}\n"
    lifecycle_role = render_cluster_role(LIFECYCLE_NAME, LIFECYCLE_RULES)
    router_role = render_cluster_role(ROUTER_LIFECYCLE_NAME, ROUTER_LIFECYCLE_RULES)
    out[Path("k8s/lifecycle/rbac.generated.yaml")] = lifecycle_role
    out[Path("k8s/router/lifecycle/rbac.generated.yaml")] = router_role
    out[Path("helm/templates/lifecycle/rbac.generated.yaml")] = (
        _LIFECYCLE_ON + lifecycle_role + "{{- end }}\n"
    )
    out[Path("helm/templates/router/lifecycle-rbac.generated.yaml")] = (
        _ROUTER_LIFECYCLE_ON + router_role + "{{- end }}\n"
    )
    roles = {
        "rbac.generated.yaml": render_cluster_role(CONTROLLER_NAME, CORE_RULES),
        "extensions-rbac.generated.yaml": render_cluster_role(EXTENSIONS_NAME, EXTENSIONS_RULES),
    }
    for name, text in roles.items():
        out[Path("k8s") / name] = text
        out[Path("helm/templates") / name] = text
    return out


def _helm_keep(crd: str) -> str:
    """``crd`` annotated ``helm.sh/resource-policy: keep``.

    A CRD under ``templates/`` (unlike ``crds/``) is deleted by ``helm uninstall`` and by any upgrade or
    rollback to a revision that does not render it (one made by an older chart, which rendered it only with
    ``lifecycle.enabled``). Deleting the SandboxArchive CRD deletes every archive and, by garbage collection,
    the PVCs they own: the data of every hibernated sandbox. With the annotation Helm leaves it (and the
    archives) in place; removing it is a deliberate ``kubectl delete`` (docs/install.md). It is in
    ``templates/``, not ``crds/``, so that ``helm upgrade`` upgrades it and ``crds/`` stays identical to
    ``k8s/crds/`` (operations spec §5.4); helm/README.md weighs the two.
    """
    marker = "\nmetadata:\n  name: "
    if marker not in crd:
        raise ValueError("the CRD has no `metadata.name` line to annotate")
    return crd.replace(marker, "\nmetadata:\n  annotations:\n    helm.sh/resource-policy: keep\n  name: ", 1)


def write(root: Path = REPO_ROOT) -> list[Path]:
    """(Re)write every generated file under ``root``; returns the paths written."""
    written = []
    for rel, text in generated_files().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def check(root: Path = REPO_ROOT) -> list[str]:
    """Unified diffs between generated and checked-in files (empty list: up to date)."""
    expected = generated_files()
    diffs: list[str] = []
    for rel, text in expected.items():
        path = root / rel
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            diff = difflib.unified_diff(
                current.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"{rel} (checked in)",
                tofile=f"{rel} (generated)",
            )
            diffs.append("".join(diff) or f"{rel}: differs\n")
    for directory in _OWNED_DIRS:
        for path in sorted((root / directory).glob("*.yaml")):
            if path.relative_to(root) not in expected:
                diffs.append(f"{path.relative_to(root)}: not produced by the generator\n")
    return diffs


def main(argv: list[str] | None = None) -> int:
    """``agent-sandbox generate [--check]``: write the files, or exit 1 with a diff when they drifted."""
    import argparse

    parser = argparse.ArgumentParser(prog="agent-sandbox generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail with a diff if checked-in files drifted")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="source checkout (default: this one)")
    args = parser.parse_args(argv)
    if args.check:
        diffs = check(args.root)
        for diff in diffs:
            print(diff, end="")
        if diffs:
            print(f"{len(diffs)} generated file(s) out of date; run `agent-sandbox generate`")
            return 1
        print(f"{len(generated_files())} generated files are up to date")
        return 0
    for path in write(args.root):
        print(f"wrote {path}")
    return 0
