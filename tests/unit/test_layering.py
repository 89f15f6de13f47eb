"""The package layering of docs/development.md holds: imports only point downwards."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src" / "agent_sandbox"

# package -> packages it may import (besides itself). cli and devcluster compose the rest.
ALLOWED: dict[str, set[str]] = {
    "api": set(),
    "kube": {"api"},
    "controllers": {"api", "kube"},
    "router": {"api", "kube"},
    "runtime": {"api"},
    "sdk": {"api", "kube"},
    # devcluster's local runner serves the runtime for dev-cluster pods
    "devcluster": {"api", "kube", "runtime"},
    "cli": {"api", "kube", "controllers", "router", "runtime", "sdk", "devcluster"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "agent_sandbox" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_allowed_layers(package: str) -> None:
    offenders: list[str] = []
    for path in sorted((SRC / package).rglob("*.py")):
        bad = _imports(path) - ALLOWED[package] - {package}
        if bad:
            offenders.append(f"{path.relative_to(SRC)} imports {sorted(bad)}")
    assert not offenders, "\n".join(offenders)
