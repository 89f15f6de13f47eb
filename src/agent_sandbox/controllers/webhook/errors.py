"""The webhook's start-up failure, raised by each step of the start (certificate, pair, listener)."""

from __future__ import annotations

__all__ = ["WebhookError"]


class WebhookError(RuntimeError):
    """The webhook server could not start."""
