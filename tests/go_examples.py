"""The Go SDK's examples (clients/go/examples) built as binaries, for tests that run them against a cluster.

Built with the Go toolchain that also builds the local control plane; its build cache makes a rebuild cheap.
"""

from __future__ import annotations

import os
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


def run_go_basic(out_dir: Path, kubeconfig: Path | str, *args: str, timeout: float = 300) -> str:
    """Build and run `examples/basic` with `args` against the cluster of `kubeconfig` (no router URL from the
    environment); assert it ran the command and the file round trip; its stdout."""
    binary = build_go_example("basic", out_dir)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    env.pop("AGENT_SANDBOX_ROUTER_URL", None)
    out = subprocess.run([str(binary), *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    assert "Hello from Agent Sandbox!" in out.stdout
    assert "hello.txt: hi" in out.stdout
    return out.stdout
