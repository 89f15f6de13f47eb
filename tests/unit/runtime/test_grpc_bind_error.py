"""A port grpcio refuses is an OSError naming the address (the runtime's own server, no cluster).

The port is taken between the runtime's own check and grpcio's bind (a race, simulated by skipping the check):
grpcio raises RuntimeError, which the console script and the dev cluster's runner did not expect.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from agent_sandbox.runtime import RuntimeConfig, RuntimeServer
from agent_sandbox.runtime import server as server_module

pytestmark = pytest.mark.unit


async def test_grpcio_refusing_the_port_is_an_oserror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The port taken between the runtime's own check and grpcio's bind (a race, simulated by skipping the
    # check): grpcio raises RuntimeError, which the console script and the dev cluster's runner did not
    # expect; it is an OSError naming the address, and nothing stays bound.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    real_bind = server_module._bind

    def bind_skipping_the_grpc_check(
        host: str, port: int, name: str, *, listen: bool = True
    ) -> socket.socket:
        return real_bind(host, 0 if name == "gRPC" else port, name, listen=listen)

    monkeypatch.setattr(server_module, "_bind", bind_skipping_the_grpc_check)
    config = RuntimeConfig(
        root_dir=tmp_path / "root", listen_host="127.0.0.1", legacy_port=0, rest_port=0, grpc_port=port
    )
    server = RuntimeServer(config)
    try:
        with pytest.raises(OSError, match=f"cannot bind gRPC to 127.0.0.1:{port}"):
            await server.start()
    finally:
        taken.close()
    for listener in ("legacy", "rest"):  # closed again
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", server.ports[listener]), 1).close()
