"""The Python SDK lives in clients/python as its own distribution (`agent-sandbox-sdk`): it imports
nothing of the main project, and its copies of the wire names agree with `agent_sandbox.api`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from agent_sandbox.api import constants as api
from agent_sandbox_sdk import constants as sdk

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
SDK_SRC = ROOT / "clients" / "python" / "src" / "agent_sandbox_sdk"


def test_the_sdk_imports_nothing_of_the_main_project() -> None:
    offenders = []
    for path in sorted(SDK_SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            offenders += [
                f"{path.relative_to(SDK_SRC)}: {n}" for n in names if n.split(".")[0] == "agent_sandbox"
            ]
    assert not offenders


def test_no_second_sdk_package_inside_the_main_project() -> None:
    # One import name for users (docs/design/sdk-package.md): agent_sandbox.sdk was removed, not re-exported.
    assert not (ROOT / "src" / "agent_sandbox" / "sdk").exists()


def test_wire_names_agree_with_the_api_package() -> None:
    assert sdk.SANDBOX_API_GROUP == api.GROUP
    assert sdk.CLAIM_API_GROUP == api.EXTENSIONS_GROUP
    assert f"{sdk.SANDBOX_API_GROUP}/{sdk.SANDBOX_API_VERSION}" == api.SANDBOX_API_VERSION
    assert f"{sdk.CLAIM_API_GROUP}/{sdk.CLAIM_API_VERSION}" == api.EXTENSIONS_API_VERSION
    assert sdk.SANDBOX_NAME_HASH_LABEL == api.LABEL_SANDBOX_NAME_HASH
    assert sdk.WARM_POOL_SANDBOX_LABEL == api.LABEL_WARM_POOL_SANDBOX
    assert sdk.LAUNCH_TYPE_LABEL == api.LABEL_LAUNCH_TYPE
    assert sdk.CREATED_BY_LABEL == api.LABEL_CREATED_BY
    assert sdk.CREATED_BY_VALUE == api.CREATED_BY_PYTHON_CLIENT
    assert sdk.POD_NAME_ANNOTATION == api.ANNOTATION_POD_NAME
    assert sdk.CLIENT_REQUEST_TIME_ANNOTATION == api.ANNOTATION_CLIENT_FIRST_REQUESTED_AT
    assert sdk.REASON_TEMPLATE_NOT_FOUND == api.REASON_TEMPLATE_NOT_FOUND
    assert sdk.REASON_WARM_POOL_NOT_FOUND == api.REASON_WARM_POOL_NOT_FOUND
    assert sdk.REASON_SANDBOX_SUSPENDED == api.REASON_SANDBOX_SUSPENDED
    # The SDK follows the published 1.0.8 client (8 terminal reasons), a superset of the snapshot's 5.
    assert api.TERMINAL_CLAIM_REASONS <= sdk.TERMINAL_CLAIM_READY_REASONS
