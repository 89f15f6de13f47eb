"""The generated process.v1 module is up to date with process.proto (and the generator is deterministic)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent_sandbox.api import processv1 as pb

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


def test_generated_module_is_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "hack" / "gen_process_proto.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_method_table() -> None:
    assert pb.SERVICE == "process.v1.ProcessService"
    assert {name: (path, streaming) for name, (path, _, _, streaming) in pb.METHODS.items()} == {
        "Start": ("/process.v1.ProcessService/Start", True),
        "Execute": ("/process.v1.ProcessService/Execute", False),
        "WriteStdin": ("/process.v1.ProcessService/WriteStdin", False),
        "SendSignal": ("/process.v1.ProcessService/SendSignal", False),
        "ResizeTTY": ("/process.v1.ProcessService/ResizeTTY", False),
    }
    assert pb.StartResponse(stdout=b"x").WhichOneof("event") == "stdout"
