"""Router configuration (router spec §1.13): defaults, precedence, YAML rules, validation, exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_sandbox.router import ConfigError, RouterConfig, load_router_config, main
from agent_sandbox.router._config import FLAGS

pytestmark = pytest.mark.unit


def load(*args: str, env: dict[str, str] | None = None) -> RouterConfig:
    return load_router_config(list(args), env or {})[0]


def test_defaults_are_upstreams() -> None:
    cfg = load()
    assert cfg.http_bind_address == ":8080"
    assert cfg.https_bind_address == ""
    assert cfg.metrics_bind_address == ":9090"
    assert cfg.health_probe_bind_address == ":8081"
    assert cfg.cluster_domain == "cluster.local"
    assert cfg.proxy_timeout == 180.0
    assert cfg.response_header_timeout == 30.0
    assert cfg.shutdown_timeout == 30.0
    assert cfg.upstream_max_retries == 3
    assert (cfg.upstream_retry_initial_delay, cfg.upstream_retry_max_delay) == (0.2, 0.8)
    assert cfg.authz_mode == "allow-all"
    assert cfg.authz_tokenreview_ttl == 30.0
    assert cfg.authz_tokenreview_cache_size == 2048
    assert cfg.mtls_mode == "off"
    assert not cfg.cache_enabled
    assert cfg.access_log
    assert not cfg.needs_kube


def test_every_go_flag_exists() -> None:
    names = {f.name for f in FLAGS}
    go_flags = {
        "http-bind-address", "https-bind-address", "metrics-bind-address", "health-probe-bind-address",
        "tls-cert-file", "tls-key-file", "tls-client-ca-file", "mtls-mode", "cluster-domain", "proxy-timeout",
        "response-header-timeout", "shutdown-timeout", "max-request-body-bytes", "allow-loopback-pod-ip",
        "upstream-max-retries", "upstream-retry-initial-delay", "upstream-retry-max-delay", "enable-tracing",
        "enable-otel-metrics", "authz-mode", "authz-tokenreview-ttl", "authz-tokenreview-cache-size",
        "authz-tokenreview-require-token", "authz-tokenreview-audiences", "authz-scoped-token-secret-file",
        "cache-enabled", "cache-namespace", "kubeconfig", "access-log", "config", "version",
        "zap-log-level", "zap-encoder", "zap-devel", "zap-stacktrace-level", "zap-time-encoding",
    }  # fmt: skip
    assert go_flags <= names


def test_go_syntax() -> None:
    cfg = load("-proxy-timeout=1m30s", "--cache-enabled", "--upstream-max-retries", "5", "-access-log=false")
    assert cfg.proxy_timeout == 90.0
    assert cfg.cache_enabled
    assert cfg.upstream_max_retries == 5
    assert not cfg.access_log
    assert cfg.needs_kube


def test_env_variables() -> None:
    cfg = load(env={"PROXY_TIMEOUT_SECONDS": "42", "CLUSTER_DOMAIN": "corp.local", "KUBECONFIG": "/k"})
    assert (cfg.proxy_timeout, cfg.cluster_domain, cfg.kubeconfig) == (42.0, "corp.local", "/k")


def test_precedence_flag_over_file_over_env(tmp_path: Path) -> None:
    f = tmp_path / "router.yaml"
    f.write_text(
        'proxy-timeout: "60s"\ncluster-domain: file.local\nupstream-max-retries: 7\ncache-enabled: true\n'
    )
    env = {"PROXY_TIMEOUT_SECONDS": "42", "CLUSTER_DOMAIN": "env.local", "SANDBOX_ROUTER_CONFIG": str(f)}
    cfg = load("--cluster-domain=flag.local", env=env)
    assert cfg.cluster_domain == "flag.local"  # flag beats file and env
    assert cfg.proxy_timeout == 60.0  # file beats env
    assert cfg.upstream_max_retries == 7
    assert cfg.cache_enabled
    assert cfg.config == str(f)


def test_config_flag_beats_env_path(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("upstream-max-retries: 1\n")
    b.write_text("upstream-max-retries: 2\n")
    assert load(f"--config={b}", env={"SANDBOX_ROUTER_CONFIG": str(a)}).upstream_max_retries == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope: 1\n", "unknown key 'nope'"),
        ("proxy-timeout: [1, 2]\n", "want a scalar"),
        ("proxy-timeout: {a: 1}\n", "want a scalar"),
        ("proxy-timeout: 180\n", "invalid value '180'"),  # durations need a unit, as in Go
        ("upstream-max-retries: 1.5\n", "invalid value"),
        ("- a\n- b\n", "flat map"),
        ("a: [\n", "invalid YAML"),
        ("config: other.yaml\n", "unknown key 'config'"),
    ],
)
def test_bad_config_files(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load(f"--config={f}")


def test_whole_number_float_becomes_integer(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("upstream-max-retries: 4.0\n")
    assert load(f"--config={f}").upstream_max_retries == 4


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match="config file /nonexistent"):
        load("--config=/nonexistent/router.yaml")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--http-bind-address="], "at least one of --http-bind-address"),
        (["--https-bind-address=:8443"], "requires --tls-cert-file"),
        (["--mtls-mode=required"], "requires --https-bind-address and --tls-client-ca-file"),
        (["--mtls-mode=sometimes"], "must be one of off, optional, required"),
        (["--cluster-domain="], "--cluster-domain must not be empty"),
        (["--proxy-timeout=0s"], "--proxy-timeout must be > 0"),
        (["--response-header-timeout=-1s"], "--response-header-timeout must be > 0"),
        (["--shutdown-timeout=-1s"], "--shutdown-timeout must be >= 0"),
        (["--upstream-max-retries=-1"], "--upstream-max-retries must be >= 0"),
        (["--authz-mode=magic"], "must be one of allow-all"),
        (["--authz-mode=scoped-token"], "requires --authz-scoped-token-secret-file"),
        (["--authz-tokenreview-ttl=0s"], "--authz-tokenreview-ttl must be > 0"),
        (["--authz-tokenreview-cache-size=0"], "cache-size must be > 0"),
        (["--metrics-bind-address=nope"], "invalid address 'nope'"),
        (["--trusted-proxy-cidrs=10.0.0.0/33"], "invalid CIDR"),
        (["--no-such-flag"], "flag provided but not defined: -no-such-flag"),
        (["--proxy-timeout=soon"], "invalid value"),
    ],
)
def test_invalid_settings(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(*args)


def test_invalid_env_value() -> None:
    with pytest.raises(ConfigError, match="PROXY_TIMEOUT_SECONDS='soon'"):
        load(env={"PROXY_TIMEOUT_SECONDS": "soon"})


def test_scoped_token_secret_length(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("  too-short  \n")
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        load("--authz-mode=scoped-token", f"--authz-scoped-token-secret-file={short}")
    good = tmp_path / "good"
    good.write_text("k" * 32 + "\n")
    assert (
        load("--authz-mode=scoped-token", f"--authz-scoped-token-secret-file={good}").authz_mode
        == "scoped-token"
    )


def test_tracing_auto_on_from_otlp_env() -> None:
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}
    assert load(env=env).enable_tracing
    assert not load(env=env).enable_otel_metrics
    assert not load("--enable-tracing=false", env=env).enable_tracing


def test_audiences_and_cidrs_are_lists() -> None:
    cfg = load("--authz-tokenreview-audiences=a, b,,c", "--trusted-proxy-cidrs=10.0.0.0/8,fd00::/8")
    assert cfg.authz_tokenreview_audiences == ("a", "b", "c")
    assert [str(n) for n in cfg.trusted_proxy_cidrs] == ["10.0.0.0/8", "fd00::/8"]


def test_main_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--proxy-timeout=0s"]) == 2
    assert "invalid configuration: --proxy-timeout must be > 0" in capsys.readouterr().err
    assert main(["--bogus"]) == 2
    assert main(["--version"]) == 0
    assert "agent-sandbox-router" in capsys.readouterr().out
    assert main(["-h"]) == 0
    assert "-http-bind-address" in capsys.readouterr().err
