"""grpcurl (github.com/fullstorydev/grpcurl), a gRPC client nobody here wrote, for compatibility tests.

Built once with the Go toolchain from the Go module proxy into the project cache
(`<cache>/go-tools/grpcurl-<version>`), under a file lock so parallel test workers build it once; the binary
is moved into place only when the build succeeded.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from filelock import FileLock

from agent_sandbox.devcluster.binaries import cache_root

VERSION = "v1.9.4"


def ensure_grpcurl(version: str = VERSION) -> Path:
    """The path of a grpcurl binary at `version` (built on first use, ~40 s cold)."""
    tools = cache_root() / "go-tools"
    binary = tools / f"grpcurl-{version}"
    tools.mkdir(parents=True, exist_ok=True)
    with FileLock(str(binary) + ".lock", timeout=900):
        if binary.exists():
            return binary
        with tempfile.TemporaryDirectory(dir=tools) as gobin:
            subprocess.run(
                ["go", "install", f"github.com/fullstorydev/grpcurl/cmd/grpcurl@{version}"],
                check=True,
                env={**os.environ, "GOBIN": gobin, "GOFLAGS": "-mod=mod"},
            )
            os.replace(Path(gobin) / "grpcurl", binary)
    return binary
