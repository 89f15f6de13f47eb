"""TLS for the HTTPS proxy listener: server context, mTLS modes, certificate hot reload (router spec §1.11).

Owns: building the server `SSLContext` (TLS >= 1.2; client certificates off / optional / required
against `--tls-client-ca-file`), and reloading the certificate and key when their files change, without
a restart. The files are polled once a second by `stat()` of the resolved paths, which also catches
Kubernetes atomic-writer `..data` symlink swaps. A new pair is first loaded into a throwaway context; only
if that succeeds is it loaded into the live one (new handshakes use it, open connections keep theirs),
so a half-written or mismatched pair never replaces a working one. Each attempt counts in
`sandbox_router_cert_reloads_total{outcome}`.

ALPN offers `http/1.1` only: the router speaks HTTP/1.1 on its listeners (upstream also offers h2).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable

from ..api.errortext import describe_error

__all__ = ["ReloadingTLS", "build_context"]

log = logging.getLogger("agent_sandbox.router.tls")

POLL_INTERVAL = 1.0


def build_context(
    cert_file: str, key_file: str, *, client_ca_file: str = "", mtls_mode: str = "off"
) -> ssl.SSLContext:
    """A server context with the given pair. Raises OSError / ssl.SSLError on unreadable or bad files."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    ctx.set_alpn_protocols(["http/1.1"])
    if mtls_mode != "off":
        ctx.load_verify_locations(cafile=client_ca_file)
        # "required" too: a certificate presented is verified in the handshake either way, and one missing
        # is refused by the connection with a 400 JSON answer (`ClientConnection`). Python's TLS transports
        # drop a failed handshake without sending its alert, so a client without a certificate saw only
        # "empty reply from server" / "server disconnected" (until December 6).
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def _fingerprint(*paths: str) -> tuple[tuple[int, int, int], ...]:
    out = []
    for path in paths:
        try:
            st = os.stat(path)  # follows symlinks: a `..data` swap changes the target's inode
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((0, 0, 0))
    return tuple(out)


class ReloadingTLS:
    """The live server context plus the watcher that reloads its certificate."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        client_ca_file: str = "",
        mtls_mode: str = "off",
        on_reload: Callable[[bool], None] | None = None,
    ) -> None:
        """Load the initial pair (raises OSError / ssl.SSLError: the router does not start)."""
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = build_context(cert_file, key_file, client_ca_file=client_ca_file, mtls_mode=mtls_mode)
        self._on_reload = on_reload
        self._seen = _fingerprint(cert_file, key_file)

    def check(self) -> bool | None:
        """Reload if the files changed; True/False for a reload attempt's outcome, None if unchanged."""
        now = _fingerprint(self.cert_file, self.key_file)
        if now == self._seen:
            return None
        self._seen = now
        try:
            trial = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            trial.load_cert_chain(self.cert_file, self.key_file)
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            log.error(
                "TLS certificate reload failed; keeping the previous one",
                extra={"error": describe_error(exc)},
            )
            ok = False
        else:
            log.info("TLS certificate reloaded", extra={"cert": self.cert_file})
            ok = True
        if self._on_reload is not None:
            self._on_reload(ok)
        return ok

    async def watch(self) -> None:
        """Poll for changes until cancelled."""
        while True:
            await asyncio.sleep(POLL_INTERVAL)
            self.check()
