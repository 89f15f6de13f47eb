"""The published upstream Python SDK (`k8s-agent-sandbox`, PyPI) in its own virtualenv, for compatibility tests.

Created once under the project cache (`<cache>/upstream-sdk/k8s-agent-sandbox-<version>/`) with the `grpc`
extra, guarded by a file lock so parallel test workers build it once; a half-built environment (no
`.complete` marker) is removed and rebuilt. Tests run scripts with its interpreter, so the SDK uses its own
dependency versions, exactly as a user's installation would.
"""

from __future__ import annotations

import ast
import asyncio
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from subprocess import PIPE

from filelock import FileLock

from agent_sandbox.devcluster.binaries import cache_root

VERSION = "1.0.8"


def sdk_dir(version: str = VERSION) -> Path:
    return cache_root() / "upstream-sdk" / f"k8s-agent-sandbox-{version}"


#: The published extras installed: gRPC (sandboxd) and async (its AsyncSandboxClient: httpx, kubernetes_asyncio).
EXTRAS = "grpc,async"


def ensure_upstream_sdk(version: str = VERSION) -> Path:
    """The interpreter of a virtualenv with `k8s-agent-sandbox[grpc,async]==version` (built on first use)."""
    venv = sdk_dir(version)
    python = venv / "bin" / "python"
    marker = venv / ".complete"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(venv) + ".lock", timeout=900):
        if marker.exists() and marker.read_text() == f"{version}[{EXTRAS}]":
            return python
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                f"k8s-agent-sandbox[{EXTRAS}]=={version}",
            ],
            check=True,
        )
        marker.write_text(f"{version}[{EXTRAS}]")
    return python


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [
            str(python),
            "-c",
            "import k8s_agent_sandbox, os; print(os.path.dirname(os.path.dirname(k8s_agent_sandbox.__file__)))",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def published_descriptor(python: Path) -> bytes:
    """The serialized FileDescriptorProto embedded in the wheel's generated `process_pb2.py` (read as text)."""
    source = (
        site_packages(python) / "k8s_agent_sandbox" / "_proto" / "process" / "v1" / "process_pb2.py"
    ).read_text()
    match = re.search(r"AddSerializedFile\((b'.*?')\)\n", source)
    assert match, "no serialized descriptor in the published process_pb2.py"
    value = ast.literal_eval(match.group(1))
    assert isinstance(value, bytes)
    return value


async def run_script(
    python: Path, script: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> str:
    """Run `script` with the SDK's interpreter (without blocking the loop a server under test runs on).

    Returns stdout; fails the test with stderr on a non-zero exit.
    """
    proc = await asyncio.create_subprocess_exec(
        str(python), "-c", script, *args, stdout=PIPE, stderr=PIPE, env=None if env is None else dict(env)
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, (
        f"upstream SDK script failed ({proc.returncode}):\n{err.decode()}\n{out.decode()}"
    )
    return out.decode()


# Upstream's SDK with no connection config, against the warm pool `pool` of namespace argv[1]: create, run
# `echo argv[2]`, write and read a file, terminate; prints the outcomes as JSON.
DEFAULT_MODE_JOURNEY = r"""
import json, sys
from k8s_agent_sandbox import SandboxClient
client = SandboxClient()  # no connection config: upstream's default, kubectl port-forward svc/sandbox-router-svc
sb = client.create_sandbox("pool", namespace=sys.argv[1], sandbox_ready_timeout=90)
r = sb.commands.run("echo " + sys.argv[2])
sb.files.write("hello.txt", "hi")
out = {"run": [r.stdout, r.exit_code], "read": sb.files.read("hello.txt").decode()}
sb.terminate()
print(json.dumps(out))
"""
