"""Lint of images/*/Dockerfile: parsed by the official BuildKit parser (PyPI `dockerfile`), then checked
against the rules the issue sets (multi-stage, pinned bases, non-root, minimal, exec-form entry point).

hadolint is not packaged for Debian or PyPI; these rules cover the hadolint checks that apply to our files
(DL3006/DL3007 pinned tags, DL3002 last USER not root, DL3020 COPY not ADD, DL3025 JSON entry point,
DL3042 no pip cache, DL3015/DL3009 apt hygiene, DL4006-style pipes into a shell) plus ours.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

dockerfile = pytest.importorskip("dockerfile", reason="the dev extra provides the `dockerfile` parser")

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
IMAGES = ROOT / "images"
# image -> (console script it runs, ports it exposes, user it runs as)
EXPECTED = {
    "controller": ("agent-sandbox-controller", {"8080", "8081", "9443"}, "65532:65532"),
    "router": ("agent-sandbox-router", {"8080", "8081", "9090"}, "65532:65532"),
    "runtime": ("agent-sandbox-runtime", {"8080", "9090", "8888"}, "1000:1000"),
}
PINNED = re.compile(r"^[\w./-]+(:[\w.-]*\d+\.\d+\.\d+[\w.-]*)?(@sha256:[0-9a-f]{64})?$")


def _stages(commands: tuple[Any, ...]) -> list[list[Any]]:
    stages: list[list[Any]] = []
    for cmd in commands:
        if cmd.cmd.upper() == "FROM":
            stages.append([])
        stages[-1].append(cmd)
    return stages


def test_every_image_has_a_dockerfile() -> None:
    assert sorted(p.name for p in IMAGES.iterdir() if (p / "Dockerfile").is_file()) == sorted(EXPECTED)


@pytest.mark.parametrize("image", sorted(EXPECTED))
def test_dockerfile_rules(image: str) -> None:
    path = IMAGES / image / "Dockerfile"
    text = path.read_text()
    commands = dockerfile.parse_string(text)
    assert text.startswith("# syntax=docker/dockerfile:1\n")
    for cmd in commands:
        assert cmd.original.split()[0] == cmd.cmd.upper(), (
            f"line {cmd.start_line}: instruction not upper-case"
        )
        assert cmd.cmd.upper() != "ADD", f"line {cmd.start_line}: use COPY, not ADD"
        assert cmd.cmd.upper() != "MAINTAINER", f"line {cmd.start_line}: MAINTAINER is deprecated"

    stages = _stages(commands)
    assert len(stages) >= 2, "multi-stage: build tools stay out of the final image"
    named = {s[0].value[2] for s in stages if len(s[0].value) == 3 and s[0].value[1].upper() == "AS"}
    for stage in stages:
        base = stage[0].value[0]
        if base in named:
            continue
        assert PINNED.match(base), f"base {base!r} is not pinned to an exact version or digest"
        assert ":" in base or "@" in base, f"base {base!r} has no tag or digest"
        assert not base.endswith(":latest")

    final = stages[-1]
    script, ports, user = EXPECTED[image]
    users = [c for c in final if c.cmd.upper() == "USER"]
    assert users, "the final stage sets a USER"
    assert users[-1].value[0] == user
    assert not users[-1].value[0].startswith("0"), "runs as root"
    last_run = max((c.start_line for c in final if c.cmd.upper() == "RUN"), default=0)
    assert users[-1].start_line > last_run, "nothing may run as root after USER is set"
    (entry,) = [c for c in final if c.cmd.upper() == "ENTRYPOINT"]
    assert entry.json, "ENTRYPOINT must use the exec (JSON) form, so signals reach the process"
    assert entry.value == (f"/opt/agent-sandbox/bin/{script}",)
    exposed = {p.split("/")[0] for c in final if c.cmd.upper() == "EXPOSE" for p in c.value}
    assert exposed == ports
    copies_from_context = [
        c for c in commands if c.cmd.upper() == "COPY" and not any(f.startswith("--from=") for f in c.flags)
    ]
    for copy in copies_from_context:
        for source in copy.value[:-1]:
            assert source.rstrip("/") in ("pyproject.toml", "README.md", "src", "clients/python"), (
                f"{source} is not in the build context (.dockerignore)"
            )

    for cmd in commands:
        if cmd.cmd.upper() != "RUN":
            continue
        line = " ".join(cmd.value)
        assert "sudo " not in line
        assert not re.search(r"(curl|wget)[^|]*\|\s*(ba)?sh", line), "piping a download into a shell"
        if "apt-get install" in line:
            assert "--no-install-recommends" in line
            assert "rm -rf /var/lib/apt/lists" in line
        if "pip install" in line:
            env = {
                c.value[i]: c.value[i + 1]
                for c in commands
                if c.cmd.upper() == "ENV"
                for i in range(0, len(c.value), 2)
            }
            assert "--no-cache-dir" in line or env.get("PIP_NO_CACHE_DIR") == "1", (
                "pip must not keep its cache"
            )


@pytest.mark.parametrize("image", sorted(EXPECTED))
def test_entry_point_is_a_console_script_of_the_wheel(image: str) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    script = EXPECTED[image][0]
    assert script in scripts, f"{script} is not a console script of the wheel"
    assert scripts[script].count(":") == 1


def test_dockerignore_keeps_the_build_context_small() -> None:
    lines = [ln for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!src/", "!clients/python/"} <= set(lines)
