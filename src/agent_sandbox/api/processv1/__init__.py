"""The sandboxd process API `process.v1` (KEP-539.2): protobuf messages and the service's method paths.

Messages are generated from `process.proto` by `hack/gen_process_proto.py`; the embedded descriptor is
byte-identical to the one in upstream's published stubs (`k8s_agent_sandbox/_proto/process/v1`), so both
can live in one process. Only messages are here (no grpcio import): the runtime registers handlers and
clients build calls from `METHODS`, each with the message types below.
"""

from __future__ import annotations

from .process_pb2 import (
    PTY,
    SIGNAL_SIGINT,
    SIGNAL_SIGKILL,
    SIGNAL_SIGTERM,
    SIGNAL_UNSPECIFIED,
    ExecuteRequest,
    ExecuteResponse,
    ExitEvent,
    InitEvent,
    ProcessConfig,
    ResizeTTYRequest,
    ResizeTTYResponse,
    SendSignalRequest,
    SendSignalResponse,
    Signal,
    StartRequest,
    StartResponse,
    WriteStdinRequest,
    WriteStdinResponse,
)

SERVICE = "process.v1.ProcessService"

# method name -> (full path, request type, response type, server streaming)
METHODS: dict[str, tuple[str, type, type, bool]] = {
    "Start": (f"/{SERVICE}/Start", StartRequest, StartResponse, True),
    "Execute": (f"/{SERVICE}/Execute", ExecuteRequest, ExecuteResponse, False),
    "WriteStdin": (f"/{SERVICE}/WriteStdin", WriteStdinRequest, WriteStdinResponse, False),
    "SendSignal": (f"/{SERVICE}/SendSignal", SendSignalRequest, SendSignalResponse, False),
    "ResizeTTY": (f"/{SERVICE}/ResizeTTY", ResizeTTYRequest, ResizeTTYResponse, False),
}

__all__ = [
    "METHODS",
    "PTY",
    "SERVICE",
    "SIGNAL_SIGINT",
    "SIGNAL_SIGKILL",
    "SIGNAL_SIGTERM",
    "SIGNAL_UNSPECIFIED",
    "ExecuteRequest",
    "ExecuteResponse",
    "ExitEvent",
    "InitEvent",
    "ProcessConfig",
    "ResizeTTYRequest",
    "ResizeTTYResponse",
    "SendSignalRequest",
    "SendSignalResponse",
    "Signal",
    "StartRequest",
    "StartResponse",
    "WriteStdinRequest",
    "WriteStdinResponse",
]
