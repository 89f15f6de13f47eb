"""Bearer tokens from a kubeconfig's `exec` credential plugin, for both sync and async clients.

How EKS (`aws eks get-token`), GKE (`gke-gcloud-auth-plugin`), AKS (`kubelogin`) and OIDC logins
authenticate. lightkube's plugin support (1.0) refuses `client.authentication.k8s.io/v1` - the GA version,
which current plugins write - and ignores a credential's expiry, so the SDK runs plugins itself, as kubectl
and the `kubernetes` client do: `KUBERNETES_EXEC_INFO` set, non-interactive, the token cached until
`expirationTimestamp` (or until the API server answers 401), one plugin run at a time per kubeconfig user.

A plugin may answer with a client certificate instead of (or with) a token - Teleport's `tsh kube credentials`
and Pinniped do. The certificate lives in its own `SSLContext` (the cluster's trust plus the certificate), and
each new certificate gets a new one: the driver keys the API server's connection pool by it, so requests after
a renewal open connections that present the new certificate, and the old pool is closed - as client-go closes
every connection when a plugin's certificate changes. The driver therefore asks for the credential before it
picks the pool (`credential()`); the auth flow only adds the token.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2

from .exceptions import SandboxError

__all__ = ["EXEC_API_VERSIONS", "ExecCredential", "ExecCredentialAuth"]

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


@dataclass(frozen=True)
class ExecCredential:
    """What one plugin run gave: a bearer header, a client certificate, or both."""

    #: `Bearer <token>`, or None when the plugin gave only a certificate.
    header: str | None
    #: The cluster's trust with the plugin's client certificate loaded; None when it gave only a token.
    tls: ssl.SSLContext | None
    #: Which run of the plugin this is (1, 2, ...): a new certificate, a new connection pool.
    serial: int
    expires: float | None


def _certificate_context(trust: ssl.SSLContext, cert: str, key: str) -> ssl.SSLContext:
    """`trust` with the PEM certificate and key loaded (`ssl` loads them from files only: a private
    directory, removed at once)."""
    with tempfile.TemporaryDirectory(prefix="agent-sandbox-exec-") as directory:  # mode 0700
        paths = (Path(directory, "tls.crt"), Path(directory, "tls.key"))
        for path, pem in zip(paths, (cert, key), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(pem)
        trust.load_cert_chain(*paths)
    return trust


class ExecCredentialAuth(httpx2.Auth):
    """Credentials from an exec plugin (kubeconfig `users[].user.exec`): `Authorization: Bearer <token>` here,
    a client certificate through `credential().tls` (the driver's connection pool)."""

    def __init__(
        self,
        command: str,
        args: list[str],
        env: dict[str, str],
        api_version: str,
        install_hint: str | None = None,
        trust: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        """`trust` makes a fresh context that verifies the API server (the kubeconfig's cluster), into which a
        plugin's client certificate is loaded; without it a certificate is refused."""
        if api_version not in EXEC_API_VERSIONS:
            versions = ", ".join(EXEC_API_VERSIONS)
            raise ValueError(f"exec plugin {command!r}: apiVersion {api_version!r} is not one of {versions}")
        self._argv = [command, *args]
        self._env = env
        self._api_version = api_version
        self._hint = install_hint
        self._trust = trust
        self._lock = threading.Lock()
        self._credential: ExecCredential | None = None
        self._runs = 0

    def fresh(self) -> ExecCredential | None:
        """The credential in hand when it has not (nearly) expired; never runs the plugin."""
        credential = self._credential
        if credential is None or (
            credential.expires is not None and time.time() > credential.expires - _EXPIRY_MARGIN
        ):
            return None
        return credential

    def credential(self) -> ExecCredential:
        """The credential to use, running the plugin (blocking) when there is none or it expired."""
        return self.fresh() or self._current(None)

    def _run_plugin(self) -> ExecCredential:
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
            fields = [status.get(key) or "" for key in ("token", "clientCertificateData", "clientKeyData")]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SandboxError(
                f"kubeconfig exec plugin {name!r} did not print an ExecCredential with a status"
            ) from None
        if not all(isinstance(field, str) for field in fields):
            raise SandboxError(
                f"kubeconfig exec plugin {name!r}: token and certificate fields must be strings"
            )
        token, cert, key = fields
        if not token and not cert and not key:
            raise SandboxError(
                f"kubeconfig exec plugin {name!r} returned neither a token nor a client certificate"
            )
        if bool(cert) != bool(key):
            raise SandboxError(
                f"kubeconfig exec plugin {name!r} returned clientCertificateData without clientKeyData, or the "
                "other way round: both or neither (as client-go requires)"
            )
        self._runs += 1
        return ExecCredential(
            header=f"Bearer {token}" if token else None,
            tls=self._certificate(cert, key) if cert else None,
            serial=self._runs,
            expires=_expiry(status),
        )

    def _certificate(self, cert: str, key: str) -> ssl.SSLContext:
        name = self._argv[0]
        if self._trust is None:
            raise SandboxError(
                f"kubeconfig exec plugin {name!r} returned a client certificate, which a client given a "
                "KubeEndpoint cannot use (load the kubeconfig itself)"
            )
        try:
            return _certificate_context(self._trust(), cert, key)
        except (ssl.SSLError, OSError) as err:
            raise SandboxError(
                f"kubeconfig exec plugin {name!r} returned a client certificate and key that do not load: {err}"
            ) from None

    def _current(self, rejected: ExecCredential | None) -> ExecCredential:
        """The credential to use; the plugin runs when there is none, it expired, or it is `rejected` (a 401)
        and no other request has fetched a new one meanwhile."""
        with self._lock:
            credential = self.fresh()
            if credential is None or credential is rejected:
                credential = self._credential = self._run_plugin()
            return credential

    @staticmethod
    def _authorize(request: httpx2.Request, credential: ExecCredential) -> None:
        if credential.header is not None:
            request.headers["Authorization"] = credential.header

    def sync_auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        credential = self.credential()
        self._authorize(request, credential)
        response = yield request
        if response.status_code == 401:
            # A refused certificate is renewed here too, but this retry still travels on the old pool's
            # connection: the driver's next request opens one with the new certificate.
            self._authorize(request, self._current(credential))
            yield request

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        # The plugin (a subprocess, often a second or more) runs on a thread: the event loop keeps serving.
        credential = self.fresh()
        if credential is None:
            credential = await asyncio.to_thread(self._current, None)
        self._authorize(request, credential)
        response = yield request
        if response.status_code == 401:
            self._authorize(request, await asyncio.to_thread(self._current, credential))
            yield request
