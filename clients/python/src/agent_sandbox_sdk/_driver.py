"""The two drivers that execute flows (`_steps.py`): `SyncDriver` (blocking) and `AsyncDriver` (asyncio).

Owns: the httpx2 clients (one for the Kubernetes API with its auth/TLS, one per TLS setting for sandbox
traffic, each pooling connections across every sandbox of the client), the gRPC channels (one per
target), the translation of transport exceptions into the SDK's tree, and closing whatever a flow opened.

Connection pools are sized for many sandboxes per client: 100 concurrent handles on one `AsyncDriver`
share one pool of up to `max_connections` sockets without any thread pool (gRPC's asyncio API included).

Each driver has its module (`_sync_driver.py`, `_async_driver.py`), on what both share (`_driver_base.py`);
the rest of the SDK takes them from here.
"""

from __future__ import annotations

from ._async_driver import AsyncDriver
from ._sync_driver import SyncDriver

__all__ = ["AsyncDriver", "SyncDriver"]
