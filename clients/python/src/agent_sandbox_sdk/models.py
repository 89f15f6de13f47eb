"""Public data models: results, file entries, connection configurations (spec §3.5, §3.6).

Same class names, fields and defaults as upstream `k8s_agent_sandbox.models` 1.0.8, so code that builds
them keeps working after changing the import. Additions are marked "ours".
"""

from __future__ import annotations

import re
import warnings
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import httpx2
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .constants import RESERVED_HEADER_PREFIX

__all__ = [
    "AdditionalPodMetadata",
    "CommandEvent",
    "ExecutionResult",
    "FileEntry",
    "LegacyExecuteRequest",
    "SandboxClaimEnvVar",
    "SandboxConnectionConfig",
    "SandboxDirectConnectionConfig",
    "SandboxGatewayConnectionConfig",
    "SandboxInClusterConnectionConfig",
    "SandboxInfo",
    "SandboxLocalTunnelConnectionConfig",
    "SandboxTracerConfig",
    "SandboxdDirectConnectionConfig",
    "SandboxdInClusterConnectionConfig",
    "SandboxdPodTunnelConnectionConfig",
    "WarmPoolInfo",
]

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_OLD_IN_CLUSTER_MODES = {"service-dns": "in-cluster-service", "pod-ip": "in-cluster-pod-ip"}


class ExecutionResult(BaseModel):
    """The outcome of one command."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = -1
    #: True when the runtime killed the command for exceeding its time limit.
    timed_out: bool = False


class CommandEvent(BaseModel):
    """One event of a streamed command (ours): an output chunk, or the final exit.

    `type` is `stdout`/`stderr` (with `data`) or `exit` (with `exit_code`, `timed_out`).
    """

    model_config = ConfigDict(frozen=True)

    type: Literal["stdout", "stderr", "exit"]
    data: bytes = b""
    exit_code: int | None = None
    timed_out: bool = False

    @property
    def text(self) -> str:
        """`data` decoded as UTF-8 (invalid bytes replaced)."""
        return self.data.decode("utf-8", errors="replace")


class SandboxInfo(BaseModel):
    """One claimed sandbox as `list_sandboxes` reports it (ours): the claim joined with its Sandbox."""

    claim_name: str
    namespace: str
    warm_pool: str | None = None
    sandbox_id: str | None = None
    ready: bool = False
    reason: str | None = None
    message: str | None = None
    pod_ip: str | None = None
    suspended: bool | None = False
    """True also when hibernated (the Sandbox archived: the claim's `Ready=False/SandboxHibernated`). None:
    unknown - the caller may not read Sandboxes (a role granting claims only)."""
    created: datetime | None = None


class WarmPoolInfo(BaseModel):
    """One SandboxWarmPool's state (ours): desired members, ready members, template, and why members are
    not Ready.

    `reason` and `message`: what keeps members from being Ready, the most common among them (a member's
    `PodScheduled` condition when False, else its `Ready` condition; `TemplateNotFound` when the template does
    not exist); None when every member is Ready, or when the caller may not read Sandboxes."""

    name: str
    namespace: str
    template: str | None = None
    replicas: int = 0
    ready_replicas: int = 0
    current_replicas: int = 0
    reason: str | None = None
    message: str | None = None


class LegacyExecuteRequest(BaseModel):
    """Body of the legacy runtime's `POST /execute` (`timeout_seconds` omitted when None)."""

    command: str
    timeout_seconds: float | None = None


class FileEntry(BaseModel):
    """A file or directory in the sandbox, the same shape for both runtimes (`modified` is tz-aware)."""

    name: str
    size: int
    type: Literal["file", "directory"]
    modified: datetime
    mode: str | None = None

    @classmethod
    def from_legacy(cls, entry: dict[str, Any]) -> FileEntry:
        """From a legacy `/list` entry (`mod_time`: float seconds since the epoch; `mode` where the runtime is
        this project's, absent from upstream's)."""
        mode = entry.get("mode")
        return cls(
            name=entry["name"],
            size=entry["size"],
            type=entry["type"],
            modified=datetime.fromtimestamp(float(entry.get("mod_time", 0)), tz=UTC),
            mode=mode if isinstance(mode, str) else None,
        )

    @classmethod
    def from_sandboxd(cls, entry: dict[str, Any]) -> FileEntry:
        """From a sandboxd directory listing entry (`modified_at`: RFC 3339, `Z` accepted)."""
        return cls(
            name=entry["name"],
            size=entry["size"],
            type=entry["type"],
            modified=datetime.fromisoformat(str(entry["modified_at"]).replace("Z", "+00:00")),
            mode=entry.get("mode"),
        )


class SandboxClaimEnvVar(BaseModel):
    """One `spec.env[]` entry of a SandboxClaim."""

    name: str
    value: str
    container_name: str | None = Field(default=None, serialization_alias="containerName")

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _ENV_NAME.match(v):
            raise ValueError(
                f"invalid environment variable name {v!r}: use letters, digits, '_', '-' or '.', "
                "not starting with a digit"
            )
        if v in (".", "..") or v.startswith(".."):
            raise ValueError(
                f"invalid environment variable name {v!r}: must not be '.', '..' or start with '..'"
            )
        return v


class AdditionalPodMetadata(BaseModel):
    """`spec.additionalPodMetadata` of a claim (empty sections are omitted on the wire)."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class SandboxTracerConfig(BaseModel):
    """OpenTelemetry settings (accepted for compatibility; see docs/sdk/python.md)."""

    enable_tracing: bool = False
    trace_service_name: str = "sandbox-client"


#: A TCP port: 1-65535.
Port = Annotated[int, Field(ge=1, le=65535)]


#: `Bearer <scoped token>` as routers in `scoped-token` mode verify it: `v1.<payload>.<signature>` (base64url).
_SCOPED_TOKEN = re.compile(r"\s*bearer\s+v1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\s*\Z", re.IGNORECASE)


class _RouterConfig(BaseModel):
    """Fields shared by the configs that reach the sandbox through a router URL."""

    api_url: str
    #: Sent on every request; `X-Sandbox-*` names are reserved for the SDK. Hidden from repr.
    extra_headers: dict[str, str] = Field(default_factory=dict, repr=False)
    #: (certificate path, key path) for mTLS to the router; needs an https:// api_url.
    client_cert: tuple[str, str] | None = None
    #: CA bundle that verifies the router; needs an https:// api_url.
    ca_cert: str | None = None
    #: Send `X-Sandbox-Pod-IP` (the router dials the pod without a lookup). None: yes, unless
    #: `extra_headers` carries a scoped token (`Authorization: Bearer v1.<payload>.<signature>`): a router
    #: in `scoped-token` mode refuses requests naming a pod IP (403), and resolves the sandbox by name.
    pod_ip_routing: bool | None = None

    @property
    def routes_by_pod_ip(self) -> bool:
        """Whether requests carry `X-Sandbox-Pod-IP` (see `pod_ip_routing`)."""
        if self.pod_ip_routing is not None:
            return self.pod_ip_routing
        return not any(
            name.lower() == "authorization" and _SCOPED_TOKEN.match(value)
            for name, value in self.extra_headers.items()
        )

    @field_validator("extra_headers")
    @classmethod
    def _check_headers(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if name.lower().startswith(RESERVED_HEADER_PREFIX):
                raise ValueError(f"header {name!r} is reserved: the SDK sets X-Sandbox-* headers itself")
        return v

    @field_validator("api_url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        if not v.lower().startswith(("http://", "https://")):
            raise ValueError(f"api_url must start with http:// or https://, got {v!r}")
        try:  # the transport's own parser (and the stdlib's, for the gRPC target), so requests can be sent
            host = httpx2.URL(v).host
            urlsplit(v).port  # noqa: B018 - raises for a port out of range
        except (httpx2.InvalidURL, ValueError) as err:
            raise ValueError(f"api_url {v!r} is not a valid URL: {err}") from None
        if not host:
            raise ValueError(f"api_url {v!r} has no host")
        return v

    @model_validator(mode="after")
    def _tls_needs_https(self) -> _RouterConfig:
        if (self.client_cert or self.ca_cert) and not self.api_url.lower().startswith("https://"):
            raise ValueError("client_cert and ca_cert require an https:// api_url")
        return self


class SandboxDirectConnectionConfig(_RouterConfig):
    """The router (legacy runtime behind it) at a known URL, e.g. `http://127.0.0.1:8080`."""

    server_port: Port = 8888


class SandboxdDirectConnectionConfig(_RouterConfig):
    """Ours: the router at a known URL with the sandboxd runtime behind it.

    REST calls go through the router with `X-Sandbox-Port: rest_port`; gRPC calls go through the router's
    h2c pass-through (router `--enable-h2c`) with the routing headers as metadata and
    `x-sandbox-port: grpc_port`.
    """

    rest_port: Port = 8080
    grpc_port: Port = 9090

    @model_validator(mode="after")
    def _distinct_ports(self) -> SandboxdDirectConnectionConfig:
        if self.rest_port == self.grpc_port:
            raise ValueError("REST and gRPC ports must be different")
        return self


class SandboxGatewayConnectionConfig(BaseModel):
    """The router behind a Gateway API `Gateway`: the URL is read from its `status.addresses`."""

    gateway_name: str
    gateway_namespace: str = "default"
    gateway_ready_timeout: int = 180
    server_port: Port = 8888


class SandboxLocalTunnelConnectionConfig(BaseModel):
    """`kubectl port-forward svc/sandbox-router-svc` to a free local port (upstream's default)."""

    port_forward_ready_timeout: int = 30
    server_port: Port = 8888
    router_namespace: str = "agent-sandbox-system"

    @field_validator("router_namespace")
    @classmethod
    def _check_namespace(cls, v: str) -> str:
        if not _DNS_LABEL.match(v):
            raise ValueError(f"invalid Kubernetes namespace name {v!r}")
        return v


class SandboxInClusterConnectionConfig(BaseModel):
    """Straight to the pod (legacy runtime): `http://<pod IP>:<port>`, else the Service DNS name."""

    server_port: Port = 8888


class SandboxdPodTunnelConnectionConfig(BaseModel):
    """sandboxd through `kubectl port-forward pod/<pod>` (REST and gRPC ports)."""

    rest_port: Port = 8080
    grpc_port: Port = 9090
    port_forward_ready_timeout: int = 30


class SandboxdInClusterConnectionConfig(BaseModel):
    """sandboxd straight at the pod IP (`in-cluster-pod-ip`) or Service FQDN (`in-cluster-service`)."""

    mode: Literal["in-cluster-service", "in-cluster-pod-ip"]
    rest_port: Port = 8080
    grpc_port: Port = 9090

    @field_validator("mode", mode="before")
    @classmethod
    def _old_mode_names(cls, v: object) -> object:
        if isinstance(v, str) and v in _OLD_IN_CLUSTER_MODES:
            new = _OLD_IN_CLUSTER_MODES[v]
            warnings.warn(
                f"SandboxdInClusterConnectionConfig mode {v!r} is deprecated; use {new!r}",
                DeprecationWarning,
                stacklevel=3,
            )
            return new
        return v

    @model_validator(mode="after")
    def _distinct_ports(self) -> SandboxdInClusterConnectionConfig:
        if self.rest_port == self.grpc_port:
            raise ValueError("REST and gRPC ports must be different")
        return self


SandboxConnectionConfig = (
    SandboxDirectConnectionConfig
    | SandboxdDirectConnectionConfig
    | SandboxGatewayConnectionConfig
    | SandboxLocalTunnelConnectionConfig
    | SandboxInClusterConnectionConfig
    | SandboxdPodTunnelConnectionConfig
    | SandboxdInClusterConnectionConfig
)
