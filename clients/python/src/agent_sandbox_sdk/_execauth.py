"""Bearer tokens from a kubeconfig's `exec` credential plugin, for both sync and async clients.

How EKS (`aws eks get-token`), GKE (`gke-gcloud-auth-plugin`), AKS (`kubelogin`) and OIDC logins
authenticate. lightkube's plugin support (1.0) refuses `client.authentication.k8s.io/v1` - the GA version,
which current plugins write - and ignores a credential's expiry, so the SDK runs plugins itself, as kubectl
and the `kubernetes` client do: `KUBERNETES_EXEC_INFO` set, non-interactive, the token cached until
`expirationTimestamp` (or until the API server answers 401), one plugin run at a time per kubeconfig user.
A plugin that answers with a client certificate instead of a token is refused with a message that says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import AsyncGenerator, Generator
from datetime import datetime
from typing import Any

import httpx2

from .exceptions import SandboxError

__all__ = ["EXEC_API_VERSIONS", "ExecCredentialAuth"]

EXEC_API_VERSIONS = (
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
    "client.authentication.k8s.io/v1alpha1",
)
#: A token this close to its expiry is fetched again before use (clocks and requests in flight).
_EXPIRY_MARGIN = 10.0
_PLUGIN_TIMEOUT = 60.0


def _expiry(status: dict[str, Any]) -> float | None:
    stamp = status.get("expirationTimestamp")
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None  # an unreadable expiry: used until a 401 says otherwise


class ExecCredentialAuth(httpx2.Auth):
    """`Authorization: Bearer <token>` from an exec plugin (kubeconfig `users[].user.exec`)."""

    def __init__(
        self,
        command: str,
        args: list[str],
        env: dict[str, str],
        api_version: str,
        install_hint: str | None = None,
    ) -> None:
        if api_version not in EXEC_API_VERSIONS:
            versions = ", ".join(EXEC_API_VERSIONS)
            raise ValueError(f"exec plugin {command!r}: apiVersion {api_version!r} is not one of {versions}")
        self._argv = [command, *args]
        self._env = env
        self._api_version = api_version
        self._hint = install_hint
        self._lock = threading.Lock()
        self._header: str | None = None
        self._expires: float | None = None

    def _fresh(self) -> str | None:
        header = self._header
        if header is None or (self._expires is not None and time.time() > self._expires - _EXPIRY_MARGIN):
            return None
        return header

    def _run_plugin(self) -> str:
        name = self._argv[0]
        info = {"apiVersion": self._api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
        env = {**os.environ, **self._env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            proc = subprocess.run(
                self._argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=_PLUGIN_TIMEOUT
            )
        except FileNotFoundError:
            hint = f": {self._hint.strip()}" if self._hint else ""
            raise SandboxError(f"kubeconfig exec plugin {name!r} not found{hint}") from None
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SandboxError(f"kubeconfig exec plugin {name!r} could not run: {err}") from None
        if proc.returncode != 0:
            stderr = proc.stderr.decode(errors="replace").strip()[:500]
            raise SandboxError(f"kubeconfig exec plugin {name!r} failed (exit {proc.returncode}): {stderr}")
        try:
            status = json.loads(proc.stdout)["status"]
            token = status.get("token")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SandboxError(
                f"kubeconfig exec plugin {name!r} did not print an ExecCredential with a status"
            ) from None
        if not isinstance(token, str) or not token:
            what = "a client certificate" if status.get("clientCertificateData") else "no token"
            raise SandboxError(
                f"kubeconfig exec plugin {name!r} returned {what}: this SDK takes bearer tokens from exec "
                "plugins (put client-certificate-data in the kubeconfig for certificate authentication)"
            )
        self._expires = _expiry(status)
        return f"Bearer {token}"

    def _current(self, rejected: str | None) -> str:
        """The header to send; the plugin runs when there is none, it expired, or it is `rejected` (a 401) and
        no other request has fetched a new one meanwhile."""
        with self._lock:
            header = self._fresh()
            if header is None or header == rejected:
                header = self._header = self._run_plugin()
            return header

    def sync_auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        header = self._fresh() or self._current(None)
        request.headers["Authorization"] = header
        response = yield request
        if response.status_code == 401:
            request.headers["Authorization"] = self._current(header)
            yield request

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        # The plugin (a subprocess, often a second or more) runs on a thread: the event loop keeps serving.
        header = self._fresh()
        if header is None:
            header = await asyncio.to_thread(self._current, None)
        request.headers["Authorization"] = header
        response = yield request
        if response.status_code == 401:
            request.headers["Authorization"] = await asyncio.to_thread(self._current, header)
            yield request
