"""The CLI tests use the SDK tests' controller fixture (one controller process per module)."""

from __future__ import annotations

from tests.integration.sdk.conftest import controller

__all__ = ["controller"]
