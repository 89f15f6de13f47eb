"""The package layering of docs/development.md holds: imports only point downwards.

Relative imports (`from ..kube import x`, `from . import y`) are resolved against the importing module,
so they count like absolute ones. Imports under `if TYPE_CHECKING:` count too: a cycle that only the
type checker sees is still a cycle in the design.
"""

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
    "manifests": {"api"},
    # devcluster's local runner serves the runtime for dev-cluster pods
    "devcluster": {"api", "kube", "runtime", "manifests"},
    # The Python SDK is its own distribution (clients/python, `agent_sandbox_sdk`): tests/unit/sdk.
    "cli": {"api", "kube", "controllers", "router", "runtime", "devcluster", "manifests"},
}


def _module_name(path: Path) -> list[str]:
    parts = ["agent_sandbox", *path.relative_to(SRC).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_modules(path: Path) -> set[str]:
    """Absolute dotted names of everything `path` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            # `from pkg import sub` may name a submodule: count `pkg.sub` as well.
            found.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
    return found


def _layers(path: Path) -> set[str]:
    return {
        name.split(".")[1]
        for name in imported_modules(path)
        if name.startswith("agent_sandbox.") and (SRC / name.split(".")[1]).is_dir()
    }


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_allowed_layers(package: str) -> None:
    offenders: list[str] = []
    for path in sorted((SRC / package).rglob("*.py")):
        bad = _layers(path) - ALLOWED[package] - {package}
        if bad:
            offenders.append(f"{path.relative_to(SRC)} imports {sorted(bad)}")
    assert not offenders, "\n".join(offenders)


def test_controller_packages_never_import_the_process_module() -> None:
    """The kinds receive `context.ControllerContext`; only the process (`main`) composes them."""
    offenders = [
        f"{path.relative_to(SRC)}"
        for path in sorted((SRC / "controllers").rglob("*.py"))
        if path.name != "main.py" and "agent_sandbox.controllers.main" in imported_modules(path)
    ]
    assert not offenders, offenders


def test_relative_imports_are_resolved() -> None:
    module = SRC / "controllers" / "claim" / "watches.py"
    names = imported_modules(module)
    assert "agent_sandbox.kube" in names
    assert "agent_sandbox.controllers.context" in names  # `from ..context import ...`
    assert "agent_sandbox.controllers.claim.store" in names  # `from .store import ...`
