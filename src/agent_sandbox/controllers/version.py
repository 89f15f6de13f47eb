"""Build information of the controller binary (`--version`, `agent_sandbox_build_info`, spec §5.1/§5.8).

Go's ldflags-stamped values map to: git version = package version, git commit / build date from the
`AGENT_SANDBOX_GIT_COMMIT` / `AGENT_SANDBOX_BUILD_DATE` environment (stamped by images) else "unknown",
"go version" = the Python runtime, compiler = the Python implementation, platform = os/arch.
"""

from __future__ import annotations

import os
import platform
import sys

from prometheus_client import Gauge

from .. import __version__
from ..kube.metrics import REGISTRY

__all__ = ["build_info", "register_build_info", "version_text"]

_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def build_info() -> dict[str, str]:
    """The label set of `agent_sandbox_build_info`."""
    machine = platform.machine().lower()
    return {
        "git_version": f"v{__version__}",
        "git_commit": os.environ.get("AGENT_SANDBOX_GIT_COMMIT", "unknown"),
        "build_date": os.environ.get("AGENT_SANDBOX_BUILD_DATE", "unknown"),
        "go_version": f"python{platform.python_version()}",
        "compiler": sys.implementation.name,
        "platform": f"{platform.system().lower()}/{_ARCH.get(machine, machine)}",
    }


def version_text(program: str) -> str:
    """The `--version` block."""
    info = build_info()
    return "\n".join(
        [
            program,
            f"  Version:    {info['git_version']}",
            f"  Revision:   {info['git_commit']}",
            f"  Build date: {info['build_date']}",
            f"  Runtime:    {info['go_version']}",
            f"  Compiler:   {info['compiler']}",
            f"  Platform:   {info['platform']}",
        ]
    )


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
