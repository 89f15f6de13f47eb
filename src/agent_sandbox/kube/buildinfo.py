"""Build information shared by the Go-compatible binaries (`--version` text, `*_build_info` labels).

Go's ldflags-stamped values map to: git version = package version, git commit / build date from the
`AGENT_SANDBOX_GIT_COMMIT` / `AGENT_SANDBOX_BUILD_DATE` environment (stamped by images) else "unknown",
"go version" = the Python runtime, compiler = the Python implementation, platform = os/arch.
"""

from __future__ import annotations

import os
import platform
import sys

from .. import __version__

__all__ = ["build_info", "version_text"]

_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def build_info() -> dict[str, str]:
    """The label set of the `*_build_info` gauges (controller and router)."""
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
