"""`make demo` end to end: `agent-sandbox demo` on its own dev cluster, twice (the second run reuses
everything), then `dev down`. Checks every step of the journey is printed with its time, including the
time to first instruction, and that the file written before suspend is read back after resume.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CLI = str(Path(sys.executable).with_name("agent-sandbox"))
STEPS = [
    "local control plane + runner",
    "controller",
    "router",
    "template demo-template + warm pool demo-pool",
    "create_sandbox (claim from the warm pool)",
    "commands.run (first command)",
    "time to first instruction (create -> output)",
    "files.write + files.read",
    "commands.stream (output as it happens)",
    "suspend (pod deleted, volume kept)",
    "resume (new pod, same volume)",
    "files.read after resume",
    "get_logs (the runtime's log: kubectl logs)",
    "terminate (claim deleted)",
]


def _demo(name: str) -> str:
    out = subprocess.run(
        [CLI, "demo", "--name", name], capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, f"demo failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def test_make_demo_twice_then_down() -> None:
    name = f"e2e-demo-{os.getpid()}"
    try:
        first = _demo(name)
        for title in STEPS:
            assert re.search(rf"^  {re.escape(title)}\s+\d+ ms", first, re.M), (
                f"step {title!r} missing:\n{first}"
            )
        assert "'hello from the sandbox', exit 0" in first
        assert "tick 1 @" in first
        assert "tick 3 @" in first
        assert "'written before suspend' (still there)" in first
        assert "INFO agent_sandbox.runtime.server: serving /workspace on 127." in first  # the resumed pod's
        assert f"agent-sandbox dev down --name {name}" in first
        second = _demo(name)
        assert re.search(r"^  controller\s+\d+ ms  reused", second, re.M)
        assert "reused; 2/2 members Ready" in second
        assert "(still there)" in second
    finally:
        subprocess.run([CLI, "dev", "down", "--name", name], capture_output=True, timeout=120, check=False)
