"""The SDK's checked-in `process.v1` messages are the runtime's: same serialized descriptor, generated
from `src/agent_sandbox/api/processv1/process.proto` (regenerate there with hack/gen_process_proto.py, then
copy `process_pb2.py`/`.pyi` to clients/python/src/agent_sandbox_sdk/_proto/process/v1/)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
RUNTIME = ROOT / "src" / "agent_sandbox" / "api" / "processv1"
SDK = ROOT / "clients" / "python" / "src" / "agent_sandbox_sdk" / "_proto" / "process" / "v1"


def _descriptor(path: Path) -> bytes:
    match = re.search(r"AddSerializedFile\((b'.*?')\)\n", path.read_text())
    assert match, f"no serialized descriptor in {path}"
    value = ast.literal_eval(match.group(1))
    assert isinstance(value, bytes)
    return value


def test_sdk_messages_match_the_runtime_proto() -> None:
    assert _descriptor(SDK / "process_pb2.py") == _descriptor(RUNTIME / "process_pb2.py")
    assert (SDK / "process_pb2.pyi").read_text() == (RUNTIME / "process_pb2.pyi").read_text()


def test_both_modules_load_in_one_process() -> None:
    from agent_sandbox.api.processv1 import process_pb2 as runtime_pb
    from agent_sandbox_sdk._proto.process.v1 import process_pb2 as sdk_pb

    assert sdk_pb.ExecuteRequest.DESCRIPTOR.full_name == runtime_pb.ExecuteRequest.DESCRIPTOR.full_name
