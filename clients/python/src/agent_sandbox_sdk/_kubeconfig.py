"""Where the Kubernetes API is and how to authenticate: kubeconfig / in-cluster -> `KubeEndpoint`.

lightkube parses kubeconfigs (contexts, relative paths, inline data, service accounts) and supplies
`httpx2.Auth` objects (static and file tokens) that work for both sync and async clients; exec credential
plugins run through the SDK's own `_execauth` (lightkube's refuses `client.authentication.k8s.io/v1`);
the SDK builds its own httpx2 clients from the result (docs/design/sdk-http-stack.md).

Resolution order, as the main project's controller (controller-runtime's `GetConfig`): an explicit
`kubeconfig` path or `api_client`, then `$KUBECONFIG`, then the in-cluster service account, then
`~/.kube/config` - only when `$KUBECONFIG` is unset or empty, as kubectl (a `$KUBECONFIG` whose files are all
missing is an error naming them, outside a pod). Upstream's SDK tries in-cluster before `$KUBECONFIG`; we let an explicit `$KUBECONFIG`
win (a deliberate difference, docs/sdk/python.md).

`api_client` may be a kubeconfig path, a lightkube `KubeConfig`/`SingleConfig`, a `KubeEndpoint`, or a
`kubernetes` / `kubernetes_asyncio` `ApiClient` (read by duck typing through its `.configuration`), so code
that passed upstream an `ApiClient` keeps working without the `kubernetes` package being ours.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import ssl
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import yaml
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.core.exceptions import ConfigError

from ._apiclient import ConfigurationAuth, configuration_header
from ._execauth import ExecCredentialAuth
from .exceptions import SandboxError

__all__ = ["KubeEndpoint", "load_kube_endpoint"]

log = logging.getLogger("agent_sandbox_sdk")

_SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class KubeEndpoint:
    """A Kubernetes API server: URL, TLS verification, authentication, the context's namespace."""

    base_url: str
    verify: ssl.SSLContext | bool
    auth: httpx2.Auth | None = None
    namespace: str = "default"
    source: str = ""
    #: The cluster's `tls-server-name`: the name sent in SNI and checked against the server's certificate
    #: instead of the URL's host (an SSH tunnel to 127.0.0.1 in front of a certificate for `kubernetes`).
    tls_server_name: str | None = None
    #: The cluster's `proxy-url`: every API request goes through it, whatever `HTTPS_PROXY` says (kubectl).
    proxy_url: str | None = None
    #: The kubeconfig context chosen, when read from files: a kubectl the SDK starts (tunnel modes) is told
    #: it, so that it reaches the same cluster as the SDK and not the files' current-context.
    context: str | None = None

    def kubectl_flags(self) -> list[str]:
        """The flags that make kubectl use this cluster and user: `--kubeconfig` (one file; a `$KUBECONFIG`
        list is read by kubectl from the same environment) and `--context`."""
        flags = ["--kubeconfig", self.source] if os.path.isfile(self.source) else []
        return flags + (["--context", self.context] if self.context else [])


def _user_auth(config: SingleConfig, source: str) -> httpx2.Auth | None:
    user = config.user
    if user is not None and user.exec is not None and user.token is None and user.token_file is None:
        plugin = user.exec
        command = plugin.command
        # As kubectl: a command with a path separator that is not absolute is relative to the kubeconfig (files
        # read here are made absolute by `_absolute_paths`; this covers a KubeConfig or SingleConfig passed in).
        if os.sep in command and not os.path.isabs(command):
            command = os.fspath(config.abs_file(command))
        try:
            return ExecCredentialAuth(
                command,
                list(plugin.args or []),
                {var.name: var.value for var in plugin.env or []},
                plugin.apiVersion,
                plugin.installHint,
                # a certificate the plugin gives goes into a context trusting this cluster as the kubeconfig says
                trust=lambda: client_adapter.verify_cluster(config.cluster, user, config.abs_file),
            )
        except ValueError as err:
            raise ValueError(f"kubeconfig {source}: {err}") from None
    if user is not None and user.auth_provider and user.token is None and user.token_file is None:
        return _auth_provider(user.auth_provider, source)
    return client_adapter.user_auth(user)


def _auth_provider(provider: dict[str, Any], source: str) -> httpx2.Auth:
    """A legacy `auth-provider`: `oidc` with its id-token, as kubectl keeps it; no other (lightkube has none)."""
    name = provider.get("name")
    token = (provider.get("config") or {}).get("id-token")
    if name == "oidc" and isinstance(token, str) and token:
        return OidcIdTokenAuth(token, source)
    raise ValueError(
        f"kubeconfig {source}: auth-provider {name!r} is not supported (Kubernetes clients dropped the gcp and "
        "azure providers; use an exec credential plugin: gke-gcloud-auth-plugin, kubelogin, kubectl oidc-login)"
    )


class OidcIdTokenAuth(httpx2.Auth):
    """The id-token of a kubeconfig's `auth-provider: oidc`, as bearer token. kubectl refreshes it (and writes
    it back to the kubeconfig) when it expires; this SDK does not talk to the identity provider, so a 401 says
    how to get a fresh one."""

    def __init__(self, token: str, source: str) -> None:
        self._header = f"Bearer {token}"
        self._source = source

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        request.headers["Authorization"] = self._header
        response = yield request
        if response.status_code == 401:
            raise SandboxError(
                f"the API server refused the OIDC id-token of kubeconfig {self._source} (401): it has probably "
                "expired - any kubectl command with this kubeconfig refreshes it - or use an exec plugin "
                "(kubectl oidc-login)"
            )


def _from_single(config: SingleConfig, source: str, cluster: dict[str, Any] | None = None) -> KubeEndpoint:
    """`cluster` is the context's cluster as written in the file: lightkube's model drops `tls-server-name`
    and `proxy-url`, so they come from there (a `KubeConfig` passed in has lost them already)."""
    if config.user is None:
        raise ValueError(f"kubeconfig {source}: the context has no user")
    try:
        verify = client_adapter.verify_cluster(config.cluster, config.user, config.abs_file)
        auth = _user_auth(config, source)
    except (ConfigError, OSError, ssl.SSLError) as err:  # missing or unreadable certificate files
        files = [config.cluster.certificate_auth, config.user.client_cert, config.user.client_key]
        named = ", ".join(os.fspath(config.abs_file(f)) for f in files if f)
        where = f" (files: {named})" if named and not getattr(err, "filename", None) else ""
        raise ValueError(f"kubeconfig {source}: {err}{where}") from None
    raw = cluster or {}
    return KubeEndpoint(
        base_url=config.cluster.server.rstrip("/"),
        verify=verify,
        auth=auth,
        namespace=config.namespace or "default",
        source=source,
        tls_server_name=_text_field(raw, "tls-server-name", source),
        proxy_url=_proxy_url(raw, source),
        context=config.context_name if cluster is not None else None,
    )


def _text_field(cluster: dict[str, Any], name: str, source: str) -> str | None:
    value = cluster.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"kubeconfig {source}: cluster {name} must be a string, not {value!r}")
    return value


def _proxy_url(cluster: dict[str, Any], source: str) -> str | None:
    url = _text_field(cluster, "proxy-url", source)
    if url is None:
        return None
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower() if sep else ""
    # named without any user:password it carries: error messages end up in logs
    shown = f"{scheme}://{rest.rpartition('@')[2]}" if sep else url.rpartition("@")[2]
    if scheme not in ("http", "https", "socks5", "socks5h"):
        raise ValueError(
            f"kubeconfig {source}: cluster proxy-url {shown!r}: the scheme must be http, https or socks5 (as kubectl)"
        )
    if scheme.startswith("socks5") and importlib.util.find_spec("socksio") is None:
        raise ValueError(
            f"kubeconfig {source}: cluster proxy-url {shown!r} is a SOCKS proxy, which needs the socksio package: "
            "pip install 'agent-sandbox-sdk[socks]'"
        )
    return url


#: Fields naming files, resolved against the directory of the kubeconfig that holds them (as client-go does).
_FILE_FIELDS = {
    "clusters": ("cluster", ("certificate-authority",)),
    "users": ("user", ("client-certificate", "client-key", "tokenFile")),
}


def _absolute_paths(doc: dict[str, Any], directory: Path) -> None:
    for section, (key, fields) in _FILE_FIELDS.items():
        for entry in doc.get(section) or ():
            body = entry.get(key) if isinstance(entry, dict) else None
            if not isinstance(body, dict):
                continue
            for name in fields:
                value = body.get(name)
                if isinstance(value, str) and value and not os.path.isabs(value):
                    body[name] = str(directory / value)
            plugin = body.get("exec") if section == "users" else None
            if isinstance(plugin, dict):
                command = plugin.get("command")
                if isinstance(command, str) and os.sep in command and not os.path.isabs(command):
                    plugin["command"] = str(directory / command)


def _merged(paths: list[Path]) -> dict[str, Any]:
    """The kubeconfig files of `$KUBECONFIG`, merged as kubectl merges them: the first file to name a
    cluster, user or context (or to set current-context) wins; relative file paths are each file's own."""
    merged: dict[str, Any] = {"clusters": [], "users": [], "contexts": [], "current-context": None}
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ValueError(f"cannot load kubeconfig {path}: {err}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"kubeconfig {path}: not a mapping")
        _absolute_paths(doc, path.parent.resolve())
        if merged["current-context"] is None and doc.get("current-context"):
            merged["current-context"] = doc["current-context"]
        for section in ("clusters", "users", "contexts"):
            names = {entry.get("name") for entry in merged[section]}
            for entry in doc.get(section) or ():
                if isinstance(entry, dict) and entry.get("name") not in names:
                    merged[section].append(entry)
                    names.add(entry.get("name"))
    return merged


def _from_files(paths: list[Path], context: str | None) -> KubeEndpoint:
    source = os.pathsep.join(map(str, paths))
    doc = _merged(paths)
    try:
        single = KubeConfig.from_dict(doc, fname=paths[0]).get(context_name=context)
    except ConfigError as err:
        raise ValueError(f"kubeconfig {source}: {err}") from err
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"cannot load kubeconfig {source}: {err!r}") from None
    if single is None:
        raise ValueError(f"kubeconfig {source}: no context {context or '(current)'}")
    cluster = next(
        (
            entry.get("cluster")
            for entry in doc["clusters"]
            if entry.get("name") == single.context.cluster and isinstance(entry.get("cluster"), dict)
        ),
        None,
    )
    return _from_single(single, source, cluster)


def _from_file(path: str | os.PathLike[str], context: str | None) -> KubeEndpoint:
    return _from_files([Path(path).expanduser()], context)


def _from_api_client(client: Any) -> KubeEndpoint:
    """A `kubernetes[_asyncio].client.ApiClient` (or its `Configuration`), read by duck typing."""
    cfg = getattr(client, "configuration", client)
    host = getattr(cfg, "host", None)
    if not isinstance(host, str) or not host:
        raise TypeError(
            f"api_client {client!r}: expected a kubeconfig path, KubeConfig or kubernetes ApiClient"
        )
    verify: ssl.SSLContext | bool
    if getattr(cfg, "verify_ssl", True) is False:
        verify = False
    else:
        ca = getattr(cfg, "ssl_ca_cert", None)
        verify = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
        cert, key = getattr(cfg, "cert_file", None), getattr(cfg, "key_file", None)
        if cert:
            verify.load_cert_chain(cert, key)
    # Read at every request, after the Configuration's refresh hook (_apiclient): never a copy that expires.
    auth = (
        ConfigurationAuth(cfg)
        if configuration_header(cfg) or getattr(cfg, "refresh_api_key_hook", None)
        else None
    )
    return KubeEndpoint(
        base_url=host.rstrip("/"),
        verify=verify,
        auth=auth,
        source="api_client",
        # load_kube_config copies both from the kubeconfig's cluster, as kubectl reads them
        tls_server_name=getattr(cfg, "tls_server_name", None) or None,
        proxy_url=getattr(cfg, "proxy", None) or None,
    )


def load_kube_endpoint(
    api_client: object | None = None,
    *,
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
) -> KubeEndpoint:
    """Resolve the Kubernetes API endpoint (order in the module docstring); `ValueError` if none is usable."""
    if isinstance(api_client, KubeEndpoint):
        return api_client
    if isinstance(api_client, SingleConfig):
        return _from_single(api_client, "SingleConfig")
    if isinstance(api_client, KubeConfig):
        single = api_client.get(context_name=context)
        if single is None:
            raise ValueError(f"KubeConfig has no context {context or '(current)'}")
        return _from_single(single, "KubeConfig")
    if isinstance(api_client, str | os.PathLike):
        return _from_file(api_client, context)
    if api_client is not None:
        return _from_api_client(api_client)
    if kubeconfig is not None:
        return _from_file(kubeconfig, context)
    # As kubectl: every file of the list that exists, merged (one may hold current-context, another the
    # contexts); until December 5 only the first was read.
    listed = [
        Path(entry).expanduser() for entry in os.environ.get("KUBECONFIG", "").split(os.pathsep) if entry
    ]
    existing = [path for path in listed if path.exists()]
    if existing:
        return _from_files(existing, context)
    # As kubectl (client-go's loading rules): a set `$KUBECONFIG` replaces ~/.kube/config, and its missing
    # files are skipped - all of them missing is `Config not found: FILE` and the in-cluster configuration,
    # else an error. Until December 6 this read ~/.kube/config (maybe another cluster), or said "no
    # Kubernetes configuration ... set KUBECONFIG" without naming the file KUBECONFIG names.
    unlisted = None
    if listed:
        names = ", ".join(map(str, listed))
        unlisted = (
            f"KUBECONFIG file {names}: no such file"
            if len(listed) == 1
            else f"KUBECONFIG files {names}: none exists"
        )
    elif env := os.environ.get("KUBECONFIG", ""):
        # Only separators (":"): set, so kubectl reads no file at all - not ~/.kube/config.
        unlisted = f"KUBECONFIG {env!r} names no file"
    if os.environ.get("KUBERNETES_SERVICE_HOST") and (_SERVICE_ACCOUNT / "token").exists():
        if unlisted:
            log.warning("%s; using the in-cluster service account", unlisted)
        single = KubeConfig.from_service_account(_SERVICE_ACCOUNT).get()
        assert single is not None
        return _from_single(single, "in-cluster service account")
    if unlisted:
        raise ValueError(
            f"{unlisted} (KUBECONFIG is set, so ~/.kube/config is not read, as kubectl: unset it or make it "
            "name a kubeconfig)"
        )
    default = Path("~/.kube/config").expanduser()
    if default.exists():
        return _from_file(default, context)
    raise ValueError(
        "no Kubernetes configuration: pass kubeconfig=/api_client= (the CLI: --kubeconfig), set KUBECONFIG, "
        "run in a pod, or create ~/.kube/config"
    )
