"""sandboxd's `process.v1.ProcessService`: method paths and message construction (needs the `grpc` extra).

The messages come from `_proto/process/v1/process_pb2.py`, generated from the same `process.proto` the
runtime serves (checked in; a drift test in the main project compares the two descriptors). The SDK calls
methods by path with the message classes' own (de)serializers, so no `_grpc` stub module is needed.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["EXECUTE", "RESIZE_TTY", "SEND_SIGNAL", "START", "WRITE_STDIN", "config", "empty", "messages"]

_SERVICE = "/process.v1.ProcessService/"
START = _SERVICE + "Start"
EXECUTE = _SERVICE + "Execute"
WRITE_STDIN = _SERVICE + "WriteStdin"
SEND_SIGNAL = _SERVICE + "SendSignal"
RESIZE_TTY = _SERVICE + "ResizeTTY"


def messages() -> Any:
    """The generated `process_pb2` module, or an ImportError saying how to install the extra."""
    try:
        return importlib.import_module("agent_sandbox_sdk._proto.process.v1.process_pb2")
    except ImportError as err:
        raise ImportError(
            "the sandboxd runtime needs gRPC: pip install 'agent-sandbox-sdk[grpc]' (grpcio, protobuf)"
        ) from err


def empty() -> Any:
    return importlib.import_module("google.protobuf.empty_pb2").Empty()


def config(command: str, env: Mapping[str, str] | None, cwd: str | None) -> Any:
    """`ProcessConfig` running `command` through `/bin/sh -c` (as upstream's SDK does)."""
    pb = messages()
    cfg = pb.ProcessConfig(command=["/bin/sh", "-c", command], env_vars=dict(env or {}))
    if cwd is not None:
        cfg.cwd = cwd
    return cfg
