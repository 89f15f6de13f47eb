"""Each image's entry point runs from the installed wheel (no source checkout on the path): the wheel is
built, installed into a fresh virtualenv, and every console script the Dockerfiles name is run from it.

No image is built here (no container engine); the Dockerfiles install exactly this wheel
(`pip install .`), so a script that starts from the wheel starts in the image.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

import pytest

from agent_sandbox.manifests import REPO_ROOT

pytestmark = pytest.mark.integration

IMAGE_SCRIPTS = {
    "controller": "agent-sandbox-controller",
    "router": "agent-sandbox-router",
    "runtime": "agent-sandbox-runtime",
}


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding only the wheels (project + SDK); other dependencies come from this venv's site-packages."""
    tmp = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(tmp / "dist"),
            str(REPO_ROOT),
            str(REPO_ROOT / "clients" / "python"),  # the CLI's SDK, a dependency that is not on PyPI
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    wheels = sorted(str(w) for w in (tmp / "dist").glob("agent_sandbox*.whl"))
    assert len(wheels) == 2, wheels
    env = tmp / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", *wheels],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr
    # Dependencies (not the project: its editable .pth lives there but is not processed from a .pth path).
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env


def test_the_wheel_not_the_checkout_is_imported(wheel_env: Path) -> None:
    out = subprocess.run(
        [str(wheel_env / "bin" / "python"), "-c", "import agent_sandbox; print(agent_sandbox.__file__)"],
        capture_output=True,
        text=True,
        cwd=wheel_env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(wheel_env)), out.stdout
    assert "/src/agent_sandbox" not in out.stdout


@pytest.mark.parametrize("image", sorted(IMAGE_SCRIPTS))
def test_image_entry_point_runs_from_the_wheel(wheel_env: Path, image: str) -> None:
    script = IMAGE_SCRIPTS[image]
    assert script in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    path = wheel_env / "bin" / script
    assert path.is_file(), f"the wheel installs no {script}"
    version = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, timeout=60, cwd=wheel_env
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() or version.stderr.strip()
    usage = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=60, cwd=wheel_env)
    assert usage.returncode == 0, usage.stderr
    # lists its flags (Go's flag package, which the router mimics, prints them with one dash)
    assert re.search(r"^\s+--?[a-z]", usage.stdout + usage.stderr, re.MULTILINE)


def test_cli_runs_from_the_wheel(wheel_env: Path) -> None:
    out = subprocess.run(
        [str(wheel_env / "bin" / "agent-sandbox"), "--help"], capture_output=True, text=True, cwd=wheel_env
    )
    assert out.returncode == 0, out.stderr
    assert "generate" in out.stdout
