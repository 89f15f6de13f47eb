"""The CLI tests use the SDK tests' router fixture (one process per module)."""

from __future__ import annotations

from tests.integration.sdk.conftest import router

__all__ = ["router"]
