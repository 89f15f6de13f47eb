"""agent-sandbox Python SDK: claim sandboxes from warm pools, run commands, move files.

A drop-in for upstream's `k8s-agent-sandbox` 1.0.8 (same classes, methods, keywords and exceptions;
migrating is an import change) on one HTTP stack that serves sync and async from one core:

    from agent_sandbox_sdk import SandboxClient

    with SandboxClient() as client:
        sandbox = client.create_sandbox("python-pool")
        print(sandbox.commands.run("python -c 'print(1)'").stdout)

Reference: docs/sdk/python.md.
"""

from __future__ import annotations

from ._steps import HttpResponse
from .async_sandbox import AsyncCommandExecutor, AsyncCommandStream, AsyncFilesystem, AsyncSandbox
from .async_sandbox_client import AsyncSandboxClient
from .exceptions import (
    SandboxClaimFailedError,
    SandboxClientClosedError,
    SandboxConnectionError,
    SandboxDeletedError,
    SandboxError,
    SandboxMetadataError,
    SandboxModeChangedError,
    SandboxNoServiceError,
    SandboxNotFoundError,
    SandboxNotReadyError,
    SandboxPortForwardError,
    SandboxRequestError,
    SandboxRequestTimeoutError,
    SandboxServiceUnavailableError,
    SandboxTemplateNotFoundError,
    SandboxTimeoutError,
    SandboxWarmPoolNotFoundError,
    SnapshotNotFoundError,
)
from .metrics import get_metrics, print_metrics
from .models import (
    CommandEvent,
    ExecutionResult,
    FileEntry,
    SandboxdDirectConnectionConfig,
    SandboxdInClusterConnectionConfig,
    SandboxDirectConnectionConfig,
    SandboxdPodTunnelConnectionConfig,
    SandboxGatewayConnectionConfig,
    SandboxInClusterConnectionConfig,
    SandboxInfo,
    SandboxLocalTunnelConnectionConfig,
    SandboxTracerConfig,
    WarmPoolInfo,
)
from .sandbox import CommandExecutor, CommandStream, Filesystem, Sandbox
from .sandbox_client import SandboxClient

__version__ = "0.1.0"

__all__ = [
    "AsyncCommandExecutor",
    "AsyncCommandStream",
    "AsyncFilesystem",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "CommandEvent",
    "CommandExecutor",
    "CommandStream",
    "ExecutionResult",
    "FileEntry",
    "Filesystem",
    "HttpResponse",
    "Sandbox",
    "SandboxClaimFailedError",
    "SandboxClient",
    "SandboxClientClosedError",
    "SandboxConnectionError",
    "SandboxDeletedError",
    "SandboxDirectConnectionConfig",
    "SandboxError",
    "SandboxGatewayConnectionConfig",
    "SandboxInClusterConnectionConfig",
    "SandboxInfo",
    "SandboxLocalTunnelConnectionConfig",
    "SandboxMetadataError",
    "SandboxModeChangedError",
    "SandboxNoServiceError",
    "SandboxNotFoundError",
    "SandboxNotReadyError",
    "SandboxPortForwardError",
    "SandboxRequestError",
    "SandboxRequestTimeoutError",
    "SandboxServiceUnavailableError",
    "SandboxTemplateNotFoundError",
    "SandboxTimeoutError",
    "SandboxTracerConfig",
    "SandboxWarmPoolNotFoundError",
    "SandboxdDirectConnectionConfig",
    "SandboxdInClusterConnectionConfig",
    "SandboxdPodTunnelConnectionConfig",
    "SnapshotNotFoundError",
    "WarmPoolInfo",
    "get_metrics",
    "print_metrics",
]
