"""A tiny synchronous REST helper for bootstrapping the dev cluster (nodes, readiness probes).

Owns: the few admin calls `dev up` makes before any controller runs. It is deliberately not the project's
API client (`agent_sandbox.kube`): devcluster sits below everything and must work before the rest does.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class AdminRest:
    """Admin-authenticated JSON calls against one kube-apiserver."""

    server: str
    ca: Path
    cert: Path
    key: Path

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.load_cert_chain(str(self.cert), str(self.key))
        return ctx

    def request(self, method: str, path: str, body: Any = None, *, timeout: float = 10.0) -> tuple[int, Any]:
        """Send one request; return (status, decoded JSON or text); status 0 when nothing answered."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, context=self._context(), timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        except (urllib.error.URLError, OSError) as err:
            # Not listening yet, reset, timed out: status 0 lets callers poll without try/except.
            return 0, str(err)
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def get_bytes(self, path: str, *, timeout: float = 10.0) -> bytes:
        """GET `path` and return the body as is (e.g. a pprof profile).

        Raises:
            OSError: not answered, or answered with an HTTP error (`urllib.error.HTTPError`).
        """
        with urllib.request.urlopen(self.server + path, context=self._context(), timeout=timeout) as resp:
            body: bytes = resp.read()
            return body


def probe_http(url: str, *, timeout: float = 2.0, ctx: ssl.SSLContext | None = None) -> bool:
    """True when `url` answers 200 (any TLS certificate accepted for health endpoints)."""
    if ctx is None and url.startswith("https"):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False
