"""The CLI tests use the SDK tests' controller and router fixtures (one process each per module)."""

from __future__ import annotations

from tests.integration.sdk.conftest import controller, router

__all__ = ["controller", "router"]
