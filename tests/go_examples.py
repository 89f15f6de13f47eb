"""The Go SDK's examples (clients/go/examples) built as binaries, for tests that run them against a cluster.

Built with the Go toolchain that also builds the local control plane; its build cache makes a rebuild cheap.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

GO_MODULE = Path(__file__).resolve().parents[1] / "clients" / "go"


def build_go_example(name: str, out_dir: Path) -> Path:
    """`go build` clients/go/examples/<name> into `out_dir`; the binary's path."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("the Go toolchain is not on PATH (it also builds the local control plane)")
    binary = out_dir / name
    subprocess.run(
        [go, "build", "-o", str(binary), f"./examples/{name}"], cwd=GO_MODULE, check=True, timeout=600
    )
    return binary
