"""docs/configuration.md lists every controller flag with the binary's default, and nothing else."""

from __future__ import annotations

import re

import pytest

from agent_sandbox.controllers.flags import format_duration
from agent_sandbox.controllers.options import FLAGS
from agent_sandbox.manifests import REPO_ROOT

pytestmark = pytest.mark.unit

ROW = re.compile(r"^\| `--([a-z0-9-]+)` \| ([^|]+) \|", re.MULTILINE)


def _default(kind: str, value: object) -> str:
    if kind == "duration":
        return format_duration(float(value))  # type: ignore[arg-type]
    if kind == "bool":
        return str(value).lower()
    if kind == "string":
        return f"`{value}`" if value else '""'
    if kind == "float":
        return f"{value:g}"
    return str(value)


def test_every_flag_is_documented_with_its_default() -> None:
    rows = {
        m.group(1): m.group(2).strip()
        for m in ROW.finditer((REPO_ROOT / "docs" / "configuration.md").read_text())
    }
    expected = {f.name: _default(f.kind, f.default) for f in FLAGS}
    assert rows == expected
