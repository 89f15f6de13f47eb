"""grpc-js (@grpc/grpc-js, Node's gRPC), a gRPC client nobody here wrote, with its own HTTP/2 stack (Node's
nghttp2 bindings, not grpcio's C core), for compatibility tests.

Installed once with npm from the registry into the project cache (`<cache>/node-tools/grpc-js-<version>`),
under a file lock so parallel test workers install it once; the directory is moved into place only when the
install succeeded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from filelock import FileLock

from agent_sandbox.devcluster.binaries import cache_root

VERSIONS = {"@grpc/grpc-js": "1.14.7", "@grpc/proto-loader": "0.8.1"}


def ensure_grpc_js() -> Path:
    """A directory whose `node_modules` holds grpc-js and proto-loader at `VERSIONS` (~15 s cold)."""
    tools = cache_root() / "node-tools"
    tag = "-".join(v for v in VERSIONS.values())
    target = tools / f"grpc-js-{tag}"
    tools.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock", timeout=900):
        if (target / "node_modules" / "@grpc" / "grpc-js").is_dir():
            return target
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is not on PATH: Node.js is needed for the grpc-js compatibility test")
        with tempfile.TemporaryDirectory(dir=tools) as work:
            subprocess.run(
                [
                    npm,
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--silent",
                    "--prefix",
                    work,
                    *(f"{name}@{version}" for name, version in VERSIONS.items()),
                ],
                check=True,
                env={**os.environ, "npm_config_cache": str(tools / ".npm-cache")},
                timeout=600,
            )
            shutil.rmtree(target, ignore_errors=True)
            os.replace(work, target)
            os.mkdir(work)  # TemporaryDirectory removes it on exit
    return target
