"""Every function the api package exports is used by the code: one called only by tests is a second version
of a rule the code applies elsewhere, which the tests then check instead of the one that runs (until
December 7 `lifecycle.archive_auto_resume` was one: the router's `LifecycleState.archive_policy` applies the
rule, on its cached view of the archive)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import agent_sandbox.api

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[3] / "src" / "agent_sandbox"


def _referenced_names() -> set[str]:
    """Every name the package's code reads (`f(...)`, `module.f`, imported by name); definitions and `__all__`
    entries are not reads."""
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.ImportFrom):
                # `from m import f as g`: g's uses are f's (ruff refuses an import left unused)
                names.update(alias.name for alias in node.names)
    return names


def test_every_exported_api_function_is_used_by_the_code() -> None:
    used = _referenced_names()
    unused = []
    for info in pkgutil.iter_modules(agent_sandbox.api.__path__):
        module = importlib.import_module(f"agent_sandbox.api.{info.name}")
        for name in getattr(module, "__all__", ()):
            if inspect.isfunction(getattr(module, name, None)) and name not in used:
                unused.append(f"{info.name}.{name}")
    assert unused == []
