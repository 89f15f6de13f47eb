"""Router configuration: the Go router's flags, environment variables and YAML file, plus ours.

Owns: the flag table (router spec §1.13, same names and defaults; ours are marked), the precedence
flag > YAML file > environment variable > default, the YAML file rules (flat map of flag names to
scalars; unknown keys and composite values are errors), validation (each error names its flag), and the
typed `RouterConfig` the rest of the router reads. Durations are seconds (float).

Failure modes: every problem raises `ConfigError`; the entry point prints it and exits with status 2
(router spec §1.12: invalid configuration or config file errors).
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..kube._servers import parse_bind_address
from ..kube.flags import ZAP_FLAGS, Flag, FlagError, FlagSet

__all__ = [
    "FLAGS",
    "PROGRAM",
    "ConfigError",
    "RouterConfig",
    "flag_set",
    "load_router_config",
    "read_scoped_secret",
    "validate",
]

PROGRAM = "agent-sandbox-router"

MTLS_MODES = ("off", "optional", "required")
AUTHZ_MODES = ("allow-all", "tokenreview", "scoped-token")
SCOPED_TOKEN_MIN_SECRET = 32


class ConfigError(ValueError):
    """Invalid flags, environment, config file or settings (exit status 2)."""


FLAGS: tuple[Flag, ...] = (
    Flag("http-bind-address", "string", ":8080", "Proxy listener (plain HTTP); empty disables."),
    Flag("https-bind-address", "string", "", "Proxy listener with TLS; empty disables."),
    Flag("metrics-bind-address", "string", ":9090", "Prometheus /metrics listener; empty or 0 disables."),
    Flag("health-probe-bind-address", "string", ":8081", "Probe listener (/healthz, /readyz)."),
    Flag("tls-cert-file", "string", "", "PEM certificate of the HTTPS listener (reloaded on change)."),
    Flag("tls-key-file", "string", "", "PEM private key of the HTTPS listener (reloaded on change)."),
    Flag("tls-client-ca-file", "string", "", "PEM CA bundle that client certificates must chain to."),
    Flag("mtls-mode", "string", "off", "Client certificates: off, optional or required.", MTLS_MODES),
    Flag("cluster-domain", "string", "cluster.local", "Cluster DNS suffix of the DNS upstream form."),
    Flag(
        "proxy-timeout",
        "duration",
        180.0,
        "Longest a proxied request may go with no byte relayed either way (not upgrades); caps X-Sandbox-Timeout.",
    ),
    Flag("response-header-timeout", "duration", 30.0, "Max wait for upstream response headers per attempt."),
    Flag("shutdown-timeout", "duration", 30.0, "Drain time for in-flight requests on SIGTERM/SIGINT."),
    Flag("max-request-body-bytes", "int", 0, "Cap on an inbound request body; 0 = unlimited."),
    Flag("allow-loopback-pod-ip", "bool", False, "Accept loopback addresses in X-Sandbox-Pod-IP."),
    Flag("upstream-max-retries", "int", 3, "Retries of dial-phase failures (attempts = retries + 1)."),
    Flag("upstream-retry-initial-delay", "duration", 0.2, "First retry backoff; doubles per retry."),
    Flag("upstream-retry-max-delay", "duration", 0.8, "Backoff ceiling."),
    Flag("enable-tracing", "bool", False, "OpenTelemetry tracing (auto-on with an OTLP endpoint env)."),
    Flag(
        "enable-otel-metrics",
        "bool",
        False,
        "Accepted for compatibility; pushing metrics over OTLP is not implemented (logs a warning; scrape /metrics).",
    ),
    Flag("authz-mode", "string", "allow-all", "allow-all, tokenreview or scoped-token.", AUTHZ_MODES),
    Flag("authz-tokenreview-ttl", "duration", 30.0, "TokenReview verdict cache TTL."),
    Flag("authz-tokenreview-cache-size", "int", 2048, "TokenReview verdict cache entries."),
    Flag("authz-tokenreview-require-token", "bool", False, "Reject requests without a bearer token."),
    Flag("authz-tokenreview-audiences", "string", "", "Comma-separated TokenReview audiences."),
    Flag("authz-scoped-token-secret-file", "string", "", "HMAC key file of scoped tokens (>= 32 bytes)."),
    Flag("cache-enabled", "bool", False, "Watch sandbox Pods and resolve from the cache."),
    Flag("cache-namespace", "string", "", "Namespace the Pod cache watches (empty = all)."),
    Flag("kubeconfig", "string", "", "Kubeconfig path (else in-cluster, else default loading rules)."),
    Flag("access-log", "bool", True, "One log line per proxied request."),
    Flag("config", "string", "", "YAML config file (flat map of flag names to values)."),
    Flag("version", "bool", False, "Print version information and exit."),
    # Ours (docs/router.md): limits the Go router hard-codes or lacks, WebSocket limits with the legacy
    # Python router's defaults, h2c, worker processes.
    Flag("read-header-timeout", "duration", 10.0, "[ours] Max time to receive a request's headers."),
    Flag("idle-timeout", "duration", 120.0, "[ours] Keep-alive connection idle timeout."),
    Flag("max-request-header-bytes", "int", 1 << 20, "[ours] Cap on request line + headers (431 above)."),
    Flag("max-concurrent-requests", "int", 10000, "[ours] In-flight proxied requests (503 above); 0 = off."),
    Flag("websocket-idle-timeout", "duration", 3600.0, "[ours] Upgraded connection idle limit; 0 = off."),
    Flag("websocket-max-lifetime", "duration", 86400.0, "[ours] Upgraded connection lifetime; 0 = off."),
    Flag("websocket-max-connections-per-client", "int", 64, "[ours] Upgrades per client; 0 = off."),
    Flag("websocket-max-message-bytes", "int", 16 << 20, "[ours] Largest backend WebSocket message."),
    Flag("trusted-proxy-cidrs", "string", "", "[ours] CIDRs whose X-Forwarded-For names the client."),
    Flag("enable-h2c", "bool", False, "[ours] Accept prior-knowledge h2c (gRPC) on the HTTP listener."),
    Flag("workers", "int", 1, "[ours] Proxy worker processes sharing the listeners (SO_REUSEPORT)."),
    Flag(
        "sandbox-lifecycle",
        "bool",
        False,
        "[ours] Resume suspended/hibernated Sandboxes on request and record activity (docs/lifecycle.md).",
    ),
    Flag(
        "sandbox-lifecycle-resume-timeout",
        "duration",
        60.0,
        "[ours] Longest a request is held while its Sandbox resumes (also bounded by the request deadline).",
    ),
    Flag(
        "sandbox-lifecycle-activity-interval",
        "duration",
        60.0,
        "[ours] Least time between two activity writes per Sandbox; 0 = never write activity.",
    ),
    *ZAP_FLAGS,
)

# Flag -> environment variable (router spec §1.13 for the Go names; the legacy Python router's names
# for the WebSocket limits).
_ENV: dict[str, str] = {
    "cluster-domain": "CLUSTER_DOMAIN",
    "proxy-timeout": "PROXY_TIMEOUT_SECONDS",
    "kubeconfig": "KUBECONFIG",
    "config": "SANDBOX_ROUTER_CONFIG",
    "websocket-idle-timeout": "WEBSOCKET_IDLE_TIMEOUT_SECONDS",
    "websocket-max-lifetime": "WEBSOCKET_MAX_LIFETIME_SECONDS",
    "websocket-max-connections-per-client": "WEBSOCKET_MAX_CONNECTIONS_PER_CLIENT",
    "websocket-max-message-bytes": "WEBSOCKET_MAX_MESSAGE_BYTES",
    "trusted-proxy-cidrs": "TRUSTED_PROXY_CIDRS",
}
# Environment variables holding plain numbers of seconds where the flag takes a Go duration.
_ENV_SECONDS = {"proxy-timeout", "websocket-idle-timeout", "websocket-max-lifetime"}
_OTEL_TRACES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_OTEL_METRICS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
_NOT_IN_FILE = {"config", "version"}


def flag_set() -> FlagSet:
    return FlagSet(PROGRAM, FLAGS)


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """Every setting of the router; attribute = flag name with '-' -> '_'. Durations in seconds."""

    http_bind_address: str = ":8080"
    https_bind_address: str = ""
    metrics_bind_address: str = ":9090"
    health_probe_bind_address: str = ":8081"
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    mtls_mode: str = "off"
    cluster_domain: str = "cluster.local"
    proxy_timeout: float = 180.0
    response_header_timeout: float = 30.0
    shutdown_timeout: float = 30.0
    max_request_body_bytes: int = 0
    allow_loopback_pod_ip: bool = False
    upstream_max_retries: int = 3
    upstream_retry_initial_delay: float = 0.2
    upstream_retry_max_delay: float = 0.8
    enable_tracing: bool = False
    enable_otel_metrics: bool = False
    authz_mode: str = "allow-all"
    authz_tokenreview_ttl: float = 30.0
    authz_tokenreview_cache_size: int = 2048
    authz_tokenreview_require_token: bool = False
    authz_tokenreview_audiences: tuple[str, ...] = ()
    authz_scoped_token_secret_file: str = ""
    cache_enabled: bool = False
    cache_namespace: str = ""
    kubeconfig: str = ""
    access_log: bool = True
    config: str = ""
    version: bool = False
    read_header_timeout: float = 10.0
    idle_timeout: float = 120.0
    max_request_header_bytes: int = 1 << 20
    max_concurrent_requests: int = 10000
    websocket_idle_timeout: float = 3600.0
    websocket_max_lifetime: float = 86400.0
    websocket_max_connections_per_client: int = 64
    websocket_max_message_bytes: int = 16 << 20
    trusted_proxy_cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    enable_h2c: bool = False
    workers: int = 1
    sandbox_lifecycle: bool = False
    sandbox_lifecycle_resume_timeout: float = 60.0
    sandbox_lifecycle_activity_interval: float = 60.0
    zap_devel: bool = False
    zap_encoder: str = ""
    zap_log_level: str = ""
    zap_stacktrace_level: str = ""
    zap_time_encoding: str = ""

    @property
    def needs_kube(self) -> bool:
        """A Kubernetes client is needed (router spec §1.12: only for the cache or tokenreview)."""
        return self.cache_enabled or self.authz_mode == "tokenreview"


def _attr(name: str) -> str:
    return name.replace("-", "_")


def _env_value(flag: Flag, variable: str, text: str) -> Any:
    if flag.name in _ENV_SECONDS:
        try:
            seconds = float(text)
        except ValueError:
            raise ConfigError(f"{variable}={text!r}: want a number of seconds") from None
        if math.isnan(seconds) or math.isinf(seconds):
            raise ConfigError(f"{variable}={text!r}: want a finite number of seconds")
        return seconds
    try:
        return flag.parse(text)
    except ValueError as exc:
        raise ConfigError(f"{variable}={text!r}: {exc}") from None


def _read_config_file(path: str, flags: Mapping[str, Flag]) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: invalid YAML: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path}: want a flat map of flag names to values")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        flag = flags.get(str(key))
        if flag is None or key in _NOT_IN_FILE:
            raise ConfigError(f"config file {path}: unknown key {key!r}")
        if isinstance(value, dict | list) or value is None:
            raise ConfigError(f"config file {path}: key {key!r}: want a scalar value")
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, float) and value.is_integer():
            text = str(int(value))
        else:
            text = str(value)
        try:
            values[flag.name] = flag.parse(text)
        except ValueError as exc:
            raise ConfigError(f"config file {path}: key {key!r}: invalid value {text!r}: {exc}") from None
    return values


def _parse_cidrs(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    out = []
    for part in text.split(","):
        if part.strip():
            try:
                out.append(ipaddress.ip_network(part.strip(), strict=False))
            except ValueError:
                raise ConfigError(f"--trusted-proxy-cidrs: invalid CIDR {part.strip()!r}") from None
    return tuple(out)


def load_router_config(
    args: Sequence[str], environ: Mapping[str, str] | None = None
) -> tuple[RouterConfig, list[str]]:
    """Build the configuration from the command line, the config file and the environment.

    Returns:
        (configuration, positional arguments).

    Raises:
        HelpRequested: -h/--help.
        ConfigError: a malformed command line, environment value or config file, or an invalid setting.
    """
    env = os.environ if environ is None else environ
    fs = flag_set()
    try:
        values, explicit, rest = fs.parse(args)
    except FlagError as exc:
        raise ConfigError(str(exc)) from None
    merged: dict[str, Any] = {name: f.default for name, f in fs.flags.items()}
    for name, variable in _ENV.items():
        if env.get(variable):
            merged[name] = _env_value(fs.flags[name], variable, env[variable])
    config_path = values["config"] if "config" in explicit else merged["config"]
    from_file = _read_config_file(config_path, fs.flags) if config_path else {}
    merged.update(from_file)
    for name in explicit:
        merged[name] = values[name]
    merged["config"] = config_path
    # Tracing / OTLP metrics default on when an exporter endpoint is configured and nobody said otherwise.
    for name, variables in (("enable-tracing", _OTEL_TRACES), ("enable-otel-metrics", _OTEL_METRICS)):
        if name not in explicit and name not in from_file and any(env.get(v) for v in variables):
            merged[name] = True
    kwargs = {_attr(name): value for name, value in merged.items()}
    kwargs["authz_tokenreview_audiences"] = tuple(
        a.strip() for a in str(merged["authz-tokenreview-audiences"]).split(",") if a.strip()
    )
    kwargs["trusted_proxy_cidrs"] = _parse_cidrs(str(merged["trusted-proxy-cidrs"]))
    config = RouterConfig(**kwargs)
    validate(config)
    return config, rest


def _bind_ok(address: str) -> bool:
    try:
        parse_bind_address(address)
    except ValueError:
        return False
    return True


def validate(config: RouterConfig) -> None:
    """Check settings that are valid alone but not together, or out of range.

    Raises:
        ConfigError: the first problem, naming its flag.
    """
    problems: list[str] = []
    for name in (
        "http_bind_address",
        "https_bind_address",
        "metrics_bind_address",
        "health_probe_bind_address",
    ):
        if not _bind_ok(getattr(config, name)):
            problems.append(f"--{name.replace('_', '-')}: invalid address {getattr(config, name)!r}")
    if not config.http_bind_address and not config.https_bind_address:
        problems.append("at least one of --http-bind-address and --https-bind-address is required")
    if config.https_bind_address and not (config.tls_cert_file and config.tls_key_file):
        problems.append("--https-bind-address requires --tls-cert-file and --tls-key-file")
    if config.mtls_mode != "off" and not (config.https_bind_address and config.tls_client_ca_file):
        problems.append(
            f"--mtls-mode={config.mtls_mode} requires --https-bind-address and --tls-client-ca-file"
        )
    if not config.cluster_domain:
        problems.append("--cluster-domain must not be empty")
    positive = ("proxy_timeout", "response_header_timeout", "read_header_timeout", "idle_timeout")
    for name in positive:
        if not getattr(config, name) > 0:
            problems.append(f"--{name.replace('_', '-')} must be > 0")
    non_negative: tuple[str, ...] = (
        "shutdown_timeout",
        "max_request_body_bytes",
        "upstream_max_retries",
        "upstream_retry_initial_delay",
        "upstream_retry_max_delay",
        "max_concurrent_requests",
        "websocket_idle_timeout",
        "websocket_max_lifetime",
        "websocket_max_connections_per_client",
        "sandbox_lifecycle_activity_interval",
    )
    for name in non_negative:
        if getattr(config, name) < 0:
            problems.append(f"--{name.replace('_', '-')} must be >= 0")
    if config.upstream_retry_initial_delay > config.upstream_retry_max_delay:
        problems.append("--upstream-retry-initial-delay must not exceed --upstream-retry-max-delay")
    if config.max_request_header_bytes < 1024:
        problems.append("--max-request-header-bytes must be >= 1024")
    if config.websocket_max_message_bytes <= 0:
        problems.append("--websocket-max-message-bytes must be > 0")
    if config.workers < 1:
        problems.append("--workers must be >= 1")
    if config.sandbox_lifecycle and not config.cache_enabled:
        problems.append("--sandbox-lifecycle requires --cache-enabled")
    if not config.sandbox_lifecycle_resume_timeout > 0:
        problems.append("--sandbox-lifecycle-resume-timeout must be > 0")
    if config.authz_tokenreview_ttl <= 0:
        problems.append("--authz-tokenreview-ttl must be > 0")
    if config.authz_tokenreview_cache_size <= 0:
        problems.append("--authz-tokenreview-cache-size must be > 0")
    if config.authz_mode == "scoped-token":
        problems.extend(_scoped_secret_problems(config.authz_scoped_token_secret_file))
    if problems:
        raise ConfigError("; ".join(problems))


def _scoped_secret_problems(path: str) -> list[str]:
    if not path:
        return ["--authz-mode=scoped-token requires --authz-scoped-token-secret-file"]
    try:
        secret = read_scoped_secret(path)
    except OSError as exc:
        return [f"--authz-scoped-token-secret-file: {exc.strerror or exc}"]
    if len(secret) < SCOPED_TOKEN_MIN_SECRET:
        return [f"--authz-scoped-token-secret-file: secret must be at least {SCOPED_TOKEN_MIN_SECRET} bytes"]
    return []


def read_scoped_secret(path: str) -> bytes:
    """The scoped-token HMAC key: the file's bytes with surrounding whitespace trimmed."""
    return Path(path).read_bytes().strip()
