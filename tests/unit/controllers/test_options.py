"""Controller flags (operations spec §7.2): Go syntax, names, defaults, and every §7.3 start-up check."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.controllers.main import main
from agent_sandbox.controllers.options import (
    FLAGS,
    Options,
    parse_options,
    read_allowed_label_domains,
    validate,
)
from agent_sandbox.kube.flags import FlagError, HelpRequested, format_duration, parse_duration

pytestmark = pytest.mark.unit

# operations spec §7.2 (flag -> default, durations in seconds), plus the framework flags.
SPEC_DEFAULTS = {
    "version": False,
    "extensions": False,
    "leader-elect": True,
    "leader-election-namespace": "",
    "metrics-bind-address": ":8080",
    "health-probe-bind-address": ":8081",
    "cluster-domain": "cluster.local",
    "enable-webhook": True,
    "webhook-port": 9443,
    "webhook-cert-dir": "/tmp/k8s-webhook-server/serving-certs",
    "webhook-cert-name": "tls.crt",
    "webhook-key-name": "tls.key",
    "webhook-service-name": "agent-sandbox-webhook-service",
    "webhook-namespace": "agent-sandbox-system",
    "manage-webhook-certs": True,
    "enable-tracing": False,
    "enable-pprof": False,
    "enable-pprof-debug": False,
    "pprof-block-profile-rate": 1000000,
    "pprof-mutex-profile-fraction": 10,
    "kube-api-qps": -1,
    "kube-api-burst": 10,
    "api-connections": 1,
    "separate-watch-connection": False,
    "sandbox-concurrent-workers": 100,
    "sandbox-claim-concurrent-workers": 50,
    "sandbox-warm-pool-concurrent-workers": 1,
    "sandbox-template-concurrent-workers": 1,
    "sandbox-warm-pool-max-batch-size": 300,
    "sandbox-warm-pool-replenish-delay": 0,
    "sandbox-warm-pool-max-refill-rate": 0,
    "sandbox-warm-pool-readiness-grace-period": 300,
    "sandbox-warm-pool-unschedulable-recheck-interval": 60,
    "enable-warm-pool-eviction": True,
    "cache-label-selectors": False,
    "disable-claim-events": False,
    "disable-claim-observability-annotations": False,
    "sandbox-write-behind-window": 0,
    "kubeconfig": "",
    "zap-devel": False,
    "zap-encoder": "",
    "zap-log-level": "",
    "zap-stacktrace-level": "",
    "zap-time-encoding": "",
}


# Flags of ours beyond upstream's set, with their defaults (docs/design/claim-priority.md, docs/lifecycle.md).
OUR_DEFAULTS: dict[str, Any] = {
    "sandbox-claim-priority-hold": 15,
    "sandbox-lifecycle": False,
    "sandbox-lifecycle-concurrent-workers": 10,
    "sandbox-lifecycle-runtime-port": 8080,
}


def test_every_spec_flag_exists_with_its_default() -> None:
    assert {f.name for f in FLAGS} == set(SPEC_DEFAULTS) | set(OUR_DEFAULTS)
    opts, rest = parse_options([])
    assert rest == []
    for name, default in {**SPEC_DEFAULTS, **OUR_DEFAULTS}.items():
        assert getattr(opts, name.replace("-", "_")) == default, name
    assert validate(opts)[0] == []


def test_defaults_match_the_dataclass_defaults() -> None:
    parsed, _ = parse_options([])
    parsed.explicitly_set = frozenset()
    assert parsed == Options()


@pytest.mark.parametrize(
    "argv",
    [
        ["--sandbox-concurrent-workers=7"],
        ["--sandbox-concurrent-workers", "7"],
        ["-sandbox-concurrent-workers=7"],
        ["-sandbox-concurrent-workers", "7"],
        ["--sandbox-concurrent-workers=0x7"],
    ],
)
def test_go_flag_syntax_forms(argv: list[str]) -> None:
    opts, _ = parse_options(argv)
    assert opts.sandbox_concurrent_workers == 7
    assert "sandbox-concurrent-workers" in opts.explicitly_set


def test_booleans_take_no_separate_value() -> None:
    opts, rest = parse_options(["--leader-elect=false", "-extensions", "--enable-webhook=0", "--zap-devel=T"])
    assert (opts.leader_elect, opts.extensions, opts.enable_webhook, opts.zap_devel) == (
        False,
        True,
        False,
        True,
    )
    opts, rest = parse_options(["--extensions", "false", "--leader-elect=false"])
    assert opts.extensions is True
    assert rest == ["false", "--leader-elect=false"]  # Go stops at the first non-flag
    assert opts.leader_elect is True


def test_double_dash_terminates() -> None:
    opts, rest = parse_options(["--extensions", "--", "--leader-elect=false"])
    assert opts.extensions
    assert rest == ["--leader-elect=false"]


def test_durations_floats_and_strings() -> None:
    opts, _ = parse_options(
        [
            "--sandbox-warm-pool-readiness-grace-period=1m30s",
            "--sandbox-warm-pool-replenish-delay=250ms",
            "--sandbox-write-behind-window=1h",
            "--kube-api-qps=2.5e2",
            "--sandbox-warm-pool-max-refill-rate=NaN",
            "--metrics-bind-address=127.0.0.1:0",
            "--zap-encoder=console",
        ]
    )
    assert opts.sandbox_warm_pool_readiness_grace_period == 90
    assert opts.sandbox_warm_pool_replenish_delay == pytest.approx(0.25)
    assert opts.sandbox_write_behind_window == 3600
    assert opts.kube_api_qps == 250
    assert math.isnan(opts.sandbox_warm_pool_max_refill_rate)
    assert opts.metrics_bind_address == "127.0.0.1:0"
    assert opts.zap_encoder == "console"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0),
        ("5m", 300),
        ("1h2m3.5s", 3723.5),
        ("-250ms", -0.25),
        ("1.5h", 5400),
        ("100us", 1e-4),
        ("2ns", 2e-9),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["5", "5x", "", "m", "1h-2m", "."])
def test_parse_duration_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(bad)


def test_format_duration_like_go() -> None:
    assert [format_duration(s) for s in (0, 300, 60, 90, 3600, 0.25)] == [
        "0s",
        "5m0s",
        "1m0s",
        "1m30s",
        "1h0m0s",
        "250ms",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-such-flag"], "flag provided but not defined: -no-such-flag"),
        (["--kube-api-qps=fast"], 'invalid value "fast" for flag -kube-api-qps: parse error'),
        (["--sandbox-concurrent-workers=1.5"], 'invalid value "1.5" for flag -sandbox-concurrent-workers'),
        (["--leader-elect=maybe"], 'invalid value "maybe" for flag -leader-elect'),
        (["--sandbox-warm-pool-readiness-grace-period=5"], "-sandbox-warm-pool-readiness-grace-period"),
        (["--zap-encoder=xml"], "must be one of json, console"),
        (["--zap-log-level=verbose"], "-zap-log-level"),
        (["--zap-log-level=0"], "-zap-log-level"),
        (["--zap-time-encoding=unix"], "-zap-time-encoding"),
        (["--cluster-domain"], "flag needs an argument: -cluster-domain"),
        (["---x"], "bad flag syntax: ---x"),
    ],
)
def test_parse_errors_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_options(argv)


def test_help() -> None:
    with pytest.raises(HelpRequested):
        parse_options(["-h"])


def test_zap_level_accepts_names_and_positive_integers() -> None:
    for level in ("debug", "info", "error", "panic", "3"):
        assert parse_options([f"--zap-log-level={level}"])[0].zap_log_level == level


# operations spec §7.3, one row per fatal condition.
@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("webhook-cert-name", " "),
        ("webhook-key-name", ""),
        ("sandbox-warm-pool-readiness-grace-period", "0"),
        ("sandbox-warm-pool-readiness-grace-period", "-1s"),
        ("sandbox-warm-pool-unschedulable-recheck-interval", "0"),
        ("sandbox-concurrent-workers", "0"),
        ("sandbox-claim-concurrent-workers", "-1"),
        ("sandbox-warm-pool-concurrent-workers", "0"),
        ("sandbox-warm-pool-max-batch-size", "0"),
        ("sandbox-warm-pool-max-refill-rate", "NaN"),
        ("sandbox-warm-pool-max-refill-rate", "+Inf"),
        ("sandbox-warm-pool-max-refill-rate", "-0.5"),
        ("sandbox-write-behind-window", "-1ms"),
        ("sandbox-claim-priority-hold", "-1s"),
        ("kube-api-burst", "0"),
        ("kube-api-qps", "NaN"),
        ("kube-api-qps", "+Inf"),
        ("api-connections", "0"),
    ],
)
def test_fatal_validations(flag: str, value: str) -> None:
    opts, _ = parse_options([f"--{flag}={value}"])
    errors, _ = validate(opts)
    assert len(errors) == 1
    assert f"--{flag}" in errors[0]


def test_template_workers_are_not_validated() -> None:
    assert validate(parse_options(["--sandbox-template-concurrent-workers=0"])[0])[0] == []


def test_boundary_values_are_accepted() -> None:
    opts, _ = parse_options(
        [
            "--sandbox-write-behind-window=0",
            "--sandbox-claim-priority-hold=0",
            "--sandbox-warm-pool-max-refill-rate=0",
            "--api-connections=1",
            "--kube-api-burst=1",
            "--kube-api-qps=0",
            "--kube-api-qps=-Inf",  # as any value <= 0: no client-side limit
            "--sandbox-warm-pool-readiness-grace-period=1ns",
        ]
    )
    assert validate(opts)[0] == []


def test_warnings() -> None:
    def warnings(*argv: str) -> list[str]:
        errors, warns = validate(parse_options(list(argv))[0])
        assert errors == []
        return warns

    assert any(
        "> 1000" in w for w in warnings("--sandbox-concurrent-workers=1000", "--leader-election-namespace=x")
    )
    assert any("--kube-api-burst" in w for w in warnings("--kube-api-qps=5", "--leader-election-namespace=x"))
    assert not any(
        "--kube-api-burst" in w for w in warnings("--kube-api-qps=-1", "--leader-election-namespace=x")
    )
    assert any("auto-detecting" in w for w in warnings())
    assert warnings("--leader-election-namespace=x") == []
    assert any(
        "conversion strategy None" in w for w in warnings("--enable-webhook=false", "--leader-elect=false")
    )
    assert any(
        "--manage-webhook-certs has no effect" in w
        for w in warnings("--enable-webhook=false", "--manage-webhook-certs=true", "--leader-elect=false")
    )
    assert any("ignored" in w for w in warnings("--webhook-cert-name=x.crt", "--leader-elect=false"))
    assert warnings("--webhook-cert-name=x.crt", "--manage-webhook-certs=false", "--leader-elect=false") == []


def test_negative_pprof_rates_are_clamped() -> None:
    opts, _ = parse_options(["--pprof-block-profile-rate=-5", "--pprof-mutex-profile-fraction=-1"])
    assert (opts.pprof_block_profile_rate, opts.pprof_mutex_profile_fraction) == (0, 0)
    assert parse_options(["--enable-pprof-debug"])[0].pprof_enabled


def test_allowed_label_domains_file(tmp_path: Path) -> None:
    path = tmp_path / "allowed-label-domains"
    assert read_allowed_label_domains(path) == []
    path.write_text(" Example.COM,foo.io\r\nbar.dev\n\n, ,\n")
    assert read_allowed_label_domains(path) == ["example.com", "foo.io", "bar.dev"]
    path.unlink()
    path.mkdir()
    with pytest.raises(IsADirectoryError):
        read_allowed_label_domains(path)


@pytest.mark.usefixtures("restore_logging")
def test_main_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert "agent-sandbox-controller" in capsys.readouterr().out
    assert main(["-help"]) == 0
    assert main(["--bogus"]) == 2
    assert "flag provided but not defined: -bogus" in capsys.readouterr().err
    assert main(["--kube-api-burst=0", "--leader-elect=false"]) == 1
    assert "--kube-api-burst must be > 0" in capsys.readouterr().err
