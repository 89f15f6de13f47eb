"""A tiny synchronous REST helper for bootstrapping the dev cluster (nodes, readiness probes).

Owns: the few admin calls `dev up` makes before any controller runs. It is deliberately not the project's
API client (`agent_sandbox.kube`): devcluster sits below everything and must work before the rest does.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


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

    def wait_crds_established(self, names: Iterable[str], *, timeout: float = 60.0) -> None:
        """Poll until every CRD in `names` is Established.

        Polled rather than `kubectl wait`: a CRD created a moment ago has no status yet, and kubectl wait fails
        at once on it ("accessor error") instead of waiting.

        Raises:
            TimeoutError: naming the CRDs still not Established after `timeout` seconds.
        """
        pending, deadline = set(names), time.monotonic() + timeout
        while pending:
            for name in sorted(pending):
                status, live = self.request("GET", f"{CRDS}/{name}")
                conditions = (
                    ((live or {}).get("status") or {}).get("conditions") or [] if status == 200 else []
                )
                if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                    pending.discard(name)
            if pending and time.monotonic() > deadline:
                raise TimeoutError(
                    f"CRDs not Established after {timeout:.0f} s: {', '.join(sorted(pending))}"
                )
            if pending:
                time.sleep(0.1)

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
