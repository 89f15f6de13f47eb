"""Connection configuration: kubeconfig / in-cluster discovery, TLS context and request authentication.

Owns: turning a kubeconfig (files read and merged by `_kubeconfig_files`, then parsed by lightkube's
`KubeConfig`, which handles contexts and in-cluster service accounts) into what our aiohttp transport needs:
a server URL, an `ssl.SSLContext` (CA + optional client certificate), an `Auth` that yields the
Authorization header, and the cluster's `tls-server-name` and `proxy-url` (which lightkube's model drops, so
they are read from the raw cluster entry). Does not own any I/O beyond reading local files and running exec
credential plugins.

Resolution order (controller-runtime's `GetConfig`): explicit path (`--kubeconfig`, that file alone), then
`$KUBECONFIG` (every existing file of the list, merged as kubectl merges them), then the in-cluster service
account, then `~/.kube/config`.

Failure modes: every configuration problem raises `ConfigError` (a `ValueError`, i.e. a usage error, not a
`KubeError`) with the offending path or field in the message.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import orjson

__all__ = ["Auth", "ClusterConfig", "ConfigError", "load_config"]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ConfigError(ValueError):
    """The client configuration (kubeconfig, in-cluster files, credentials) is unusable."""


class Auth(Protocol):
    """Supplies the Authorization header; may refresh after a 401."""

    async def header(self) -> str | None:
        """Current `Authorization` header value, or None for no header (client-cert auth)."""
        ...

    async def refresh(self) -> bool:
        """Called after a 401; returns True if credentials changed and the request is worth retrying."""
        ...


class NoAuth:
    """No Authorization header (client certificates or an unauthenticated server)."""

    async def header(self) -> str | None:
        return None

    async def refresh(self) -> bool:
        return False


class StaticAuth:
    """A fixed header value (bearer token or basic credentials from the kubeconfig)."""

    def __init__(self, value: str) -> None:
        self._value = value

    async def header(self) -> str | None:
        return self._value

    async def refresh(self) -> bool:
        return False


class TokenFileAuth:
    """A bearer token read from a file and re-read periodically (kubelet rotates projected SA tokens)."""

    # client-go caches the file for one minute; a 401 forces an early re-read.
    REREAD_SECONDS = 60.0

    def __init__(self, path: str) -> None:
        self._path = path
        self._value: str | None = None
        self._read_at = 0.0

    def _read(self) -> str:
        try:
            token = Path(self._path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read token file {self._path}: {exc}") from exc
        self._read_at = time.monotonic()
        return f"Bearer {token}"

    async def header(self) -> str | None:
        if self._value is None or time.monotonic() - self._read_at > self.REREAD_SECONDS:
            self._value = self._read()
        return self._value

    async def refresh(self) -> bool:
        old, self._value = self._value, self._read()
        return old != self._value


class ExecAuth:
    """client.authentication.k8s.io exec credential plugin; cached until expiry, re-run after a 401.

    The plugin may give a client certificate instead of (or with) a token (Teleport, Pinniped): `tls` is then a
    context of the cluster's trust with that certificate, a new one per certificate. The client passes it with
    every request, and aiohttp keys pooled connections by it, so after a renewal new requests open connections
    that present the new certificate (kube-apiserver checks a certificate's validity at every request, also on
    a connection opened while it was valid).
    """

    def __init__(
        self,
        command: str,
        args: list[str],
        env: dict[str, str],
        api_version: str,
        trust: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        self._argv = [command, *args]
        self._env = {**os.environ, **env}
        self._api_version = api_version
        self._trust = trust
        self._value: str | None = None
        #: The plugin's client certificate in a context of the cluster's trust; None: it gave a token only.
        self.tls: ssl.SSLContext | None = None
        self._material: tuple[str, str] | None = None
        self._have = False
        self._expires: float | None = None
        # One lock per event loop: a client cloned for the leader-election thread shares this Auth, and an
        # asyncio.Lock that ever made a waiter wait is bound to that waiter's loop. Keyed strongly (a process
        # has one or two loops; uvloop's loop may not be weak-referenceable).
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    @property
    def _lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        return lock

    async def _run(self) -> None:
        name = self._argv[0]
        env = dict(self._env)
        env["KUBERNETES_EXEC_INFO"] = orjson.dumps(
            {"apiVersion": self._api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
        ).decode()
        proc = await asyncio.create_subprocess_exec(
            *self._argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise ConfigError(f"exec plugin {name} failed ({proc.returncode}): {err.decode()[:500]}")
        try:
            status = orjson.loads(out).get("status") or {}
            token, cert, key = (
                status.get(f) or "" for f in ("token", "clientCertificateData", "clientKeyData")
            )
        except (orjson.JSONDecodeError, AttributeError) as exc:
            raise ConfigError(f"exec plugin {name} did not print an ExecCredential: {exc}") from exc
        if not all(isinstance(v, str) for v in (token, cert, key)):
            raise ConfigError(f"exec plugin {name}: token and certificate fields must be strings")
        if not token and not cert:
            raise ConfigError(f"exec plugin {name} returned neither a token nor a client certificate")
        if bool(cert) != bool(key):
            raise ConfigError(f"exec plugin {name} returned clientCertificateData and clientKeyData not both")
        if cert and (cert, key) != self._material:
            if self._trust is None:
                raise ConfigError(f"exec plugin {name} returned a client certificate for a plain-http server")
            ctx = self._trust()
            _load_pem_pair(ctx, cert, key)
            self.tls, self._material = ctx, (cert, key)
        elif not cert:
            self.tls, self._material = None, None
        self._value = f"Bearer {token}" if token else None
        self._have = True
        self._expires = (
            _parse_rfc3339(status["expirationTimestamp"]) if status.get("expirationTimestamp") else None
        )

    def _stale(self) -> bool:
        return not self._have or (self._expires is not None and time.time() > self._expires - 10)

    async def header(self) -> str | None:
        if self._stale():
            async with self._lock:
                if self._stale():
                    await self._run()
        return self._value

    async def refresh(self) -> bool:
        async with self._lock:
            old = (self._value, self._material)
            await self._run()
            return old != (self._value, self._material)


def _parse_rfc3339(value: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Resolved connection settings for one API server.

    Attributes:
        server: base URL, e.g. "https://127.0.0.1:6443" (no trailing slash).
        ssl: TLS context for https servers (None for plain http).
        auth: Authorization header provider.
        namespace: the context's default namespace ("default" when unset).
        source: where the configuration came from (file paths or "in-cluster"), for logs.
        tls_server_name: the cluster's `tls-server-name`: the name sent as TLS SNI and the one the server
            certificate is verified against, instead of the server URL's host (e.g. an SSH tunnel to
            https://127.0.0.1:PORT whose certificate names "kubernetes"). None: the URL's host.
        proxy_url: the cluster's `proxy-url` (http:// or https://; https servers are reached through an
            HTTP CONNECT tunnel). None: connect directly.
    """

    server: str
    ssl: ssl.SSLContext | None
    auth: Auth
    namespace: str = "default"
    source: str = ""
    tls_server_name: str | None = None
    proxy_url: str | None = None


def load_config(path: str | os.PathLike[str] | None = None, *, context: str | None = None) -> ClusterConfig:
    """Resolve the client configuration.

    Args:
        path: kubeconfig path; None means `$KUBECONFIG`, then in-cluster, then `~/.kube/config`.
        context: kubeconfig context name; None means the current context.

    Raises:
        ConfigError: no usable configuration was found or it is invalid.
    """
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.core.exceptions import ConfigError as LightkubeConfigError

    from ._kubeconfig_files import existing_files, merge_files, named_entry

    merged: dict[str, Any] | None = None
    files: list[Path] = []
    try:
        if path is not None:
            files = [Path(path).expanduser()]
            if not files[0].is_file():
                raise ConfigError(f"kubeconfig {path} not found")
        elif not (files := existing_files(env := os.environ.get("KUBECONFIG", ""))):
            # As kubectl and the SDK: a set `$KUBECONFIG` replaces ~/.kube/config. Until December 6 one naming
            # only missing files fell back to ~/.kube/config (maybe another cluster: `agent-sandbox lifecycle`
            # acted there while the SDK's commands refused).
            listed = [entry for entry in env.split(os.pathsep) if entry]
            if (SERVICE_ACCOUNT_DIR / "token").exists() and os.environ.get("KUBERNETES_SERVICE_HOST"):
                kc, source = KubeConfig.from_service_account(SERVICE_ACCOUNT_DIR), "in-cluster"
            elif env:  # only separators (":") is set too: kubectl reads no file at all then
                what = f"{os.pathsep.join(listed)}: no such file" if listed else f"{env!r} names no file"
                raise ConfigError(
                    f"KUBECONFIG {what} (KUBECONFIG is set, so ~/.kube/config is not read, as kubectl: unset it "
                    "or make it name a kubeconfig)"
                )
            elif (default := Path("~/.kube/config").expanduser()).is_file():
                files = [default]
            else:
                raise ConfigError(
                    "no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG, or run in-cluster"
                )
        if files:
            merged = merge_files(files)
            # Every file reference is absolute by now; fname only serves lightkube's own path handling.
            kc, source = KubeConfig.from_dict(merged, fname=files[0]), os.pathsep.join(map(str, files))
        single = kc.get(context_name=context)
    except ConfigError:
        raise
    except LightkubeConfigError as exc:
        raise ConfigError(str(exc)) from exc
    except (OSError, KeyError, TypeError, ValueError) as exc:  # ValueError: msgspec's validation errors
        raise ConfigError(f"invalid kubeconfig {os.pathsep.join(map(str, files))}: {exc}") from exc
    if single is None:
        raise ConfigError("kubeconfig has no usable context")
    cluster = named_entry(merged, "clusters", single.context.cluster) if merged is not None else {}
    return _from_single(single, source, cluster)


def _from_single(single: Any, source: str, raw_cluster: Mapping[str, Any]) -> ClusterConfig:
    cluster, user = single.cluster, single.user
    server = str(cluster.server).rstrip("/")
    ctx: ssl.SSLContext | None = None
    trust: Callable[[], ssl.SSLContext] | None = None
    if server.startswith("https://"):

        def trust() -> ssl.SSLContext:
            """The cluster's trust, built now and again for each exec plugin certificate (its CA file may
            have changed or gone since)."""
            try:
                return _ssl_context(cluster, user, single.abs_file)
            except ConfigError as exc:
                # Name the kubeconfig too: the message alone names a field or file, not where it is set.
                raise ConfigError(f"kubeconfig {source}: {exc}") from exc

        ctx = trust()

    name = single.context.cluster
    return ClusterConfig(
        server=server,
        ssl=ctx,
        auth=_auth(user, single.abs_file, trust),
        namespace=single.namespace,
        source=source,
        tls_server_name=_optional_str(raw_cluster, "tls-server-name", name),
        proxy_url=_proxy_url(raw_cluster, name),
    )


def _optional_str(raw_cluster: Mapping[str, Any], field: str, name: str) -> str | None:
    value = raw_cluster.get(field)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"cluster {name!r}: {field} must be a string")
    return value


def _proxy_url(raw_cluster: Mapping[str, Any], name: str) -> str | None:
    value = _optional_str(raw_cluster, "proxy-url", name)
    if value is None:
        return None
    # kubectl also speaks socks5; aiohttp only tunnels through HTTP proxies, and silently connecting
    # directly instead would bypass what the kubeconfig asks for. The scheme alone is named: the URL
    # may carry credentials.
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise ConfigError(
            f"cluster {name!r}: proxy-url scheme {parts.scheme or '(none)'!r} is not supported: "
            "the controller supports only http:// and https:// proxies"
        )
    if not parts.hostname:
        raise ConfigError(f"cluster {name!r}: proxy-url has no host")
    return value


def _ssl_context(cluster: Any, user: Any, abs_file: Any) -> ssl.SSLContext:
    if cluster.certificate_auth_data:
        try:
            ctx = ssl.create_default_context(cadata=base64.b64decode(cluster.certificate_auth_data).decode())
        except (ValueError, OSError) as exc:  # binascii.Error and UnicodeDecodeError; ssl.SSLError: not PEM
            raise ConfigError(f"invalid certificate-authority-data: {_data_reason(exc)}") from exc
    elif cluster.certificate_auth:
        cafile = str(abs_file(cluster.certificate_auth))
        try:
            ctx = ssl.create_default_context(cafile=cafile)
        except OSError as exc:  # ssl.SSLError too; ssl's FileNotFoundError names no file
            raise ConfigError(f"cannot load certificate-authority {cafile}: {_reason(exc)}") from exc
    else:
        ctx = ssl.create_default_context()
    if cluster.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if user is not None and (user.client_cert or user.client_cert_data):
        _load_client_cert(ctx, user, abs_file)
    return ctx


def _load_client_cert(ctx: ssl.SSLContext, user: Any, abs_file: Any) -> None:
    # ssl can only load a cert chain from files; inline data goes through short-lived private temp files.
    with tempfile.TemporaryDirectory(prefix="kube-cert-") as tmp:
        cert_path = _material(
            user.client_cert_data, user.client_cert, abs_file, Path(tmp) / "c.pem", "client-certificate-data"
        )
        key_path = _material(
            user.client_key_data, user.client_key, abs_file, Path(tmp) / "k.pem", "client-key-data"
        )
        try:
            ctx.load_cert_chain(cert_path, key_path)
        except (OSError, ssl.SSLError) as exc:
            # Only the kubeconfig's own files are named: inline data went through temp files.
            named = [str(abs_file(f)) for f in (user.client_cert, user.client_key) if f]
            files = f" (files: {', '.join(named)})" if named else ""
            raise ConfigError(f"cannot load client certificate{files}: {_reason(exc)}") from exc


def _reason(exc: OSError) -> str:
    """`[Errno 2] No such file or directory` for a missing file, ssl's own text for a bad one."""
    if isinstance(exc, ssl.SSLError) or exc.errno is None:
        return str(exc)
    return f"[Errno {exc.errno}] {exc.strerror}"


def _load_pem_pair(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    """Load PEM text (an exec plugin's answer) through short-lived private temp files."""
    with tempfile.TemporaryDirectory(prefix="kube-cert-") as tmp:
        paths = (Path(tmp) / "c.pem", Path(tmp) / "k.pem")
        for path, pem in zip(paths, (cert, key), strict=True):
            path.touch(0o600)
            path.write_text(pem)
        try:
            ctx.load_cert_chain(*paths)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the exec plugin's client certificate: {exc}") from exc


def _data_reason(exc: ValueError | OSError) -> str:
    """Why inline base64 PEM data was refused, never quoting it (a key's bytes must not reach a log)."""
    if isinstance(exc, UnicodeDecodeError):
        return "not PEM text once base64-decoded"
    if isinstance(exc, ValueError):
        return f"not valid base64 ({exc})"
    return _reason(exc)


def _material(data: str | None, file: str | None, abs_file: Any, target: Path, field: str) -> str:
    if data:
        try:
            decoded = base64.b64decode(data)
        except ValueError as exc:  # binascii.Error
            raise ConfigError(f"invalid {field}: {_data_reason(exc)}") from exc
        target.write_bytes(decoded)
        target.chmod(0o600)
        return str(target)
    if file:
        return str(abs_file(file))
    raise ConfigError("client certificate given without its key (or key without certificate)")


def _auth(user: Any, abs_file: Any, trust: Callable[[], ssl.SSLContext] | None) -> Auth:
    if user is None:
        return NoAuth()
    if user.token_file:
        return TokenFileAuth(str(abs_file(user.token_file)))
    if user.token:
        return StaticAuth(f"Bearer {user.token.strip()}")
    if user.exec:
        # A relative command with a separator was made absolute against its kubeconfig's directory when
        # the files were read (`_kubeconfig_files`), as client-go does; a bare name is looked up on PATH.
        env = {nv.name: nv.value for nv in (user.exec.env or [])}
        return ExecAuth(user.exec.command, list(user.exec.args or []), env, user.exec.apiVersion, trust)
    if user.username and user.password:
        raw = base64.b64encode(f"{user.username}:{user.password}".encode()).decode()
        return StaticAuth(f"Basic {raw}")
    if user.auth_provider:
        raise ConfigError("kubeconfig auth-provider plugins are not supported; use an exec plugin")
    return NoAuth()
