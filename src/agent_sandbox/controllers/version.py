"""The controller's `agent_sandbox_build_info` metric (controllers spec §5.1/§5.8); values from `kube.buildinfo`."""

from __future__ import annotations

from prometheus_client import Gauge

from ..kube.buildinfo import build_info, version_text
from ..kube.metrics import REGISTRY

__all__ = ["build_info", "register_build_info", "version_text"]

_registered = False


def register_build_info() -> None:
    """Register the constant `agent_sandbox_build_info` gauge (value 1) once per process."""
    global _registered
    if _registered:
        return
    info = build_info()
    gauge = Gauge(
        "agent_sandbox_build_info",
        "Build information about the agent-sandbox controller",
        list(info),
        registry=REGISTRY,
    )
    gauge.labels(**info).set(1)
    _registered = True
