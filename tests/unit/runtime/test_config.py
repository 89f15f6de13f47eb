"""`agent-sandbox-runtime` flags: sandboxd names and defaults, legacy environment defaults, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_sandbox.runtime.config import RuntimeConfig, parse_args, parse_seconds

pytestmark = pytest.mark.unit


def test_defaults_match_sandboxd() -> None:
    config, ns = parse_args([], environ={})
    assert (config.listen_host, config.legacy_port, config.rest_port, config.grpc_port) == (
        "0.0.0.0",
        8888,
        8080,
        9090,
    )
    assert config.root_dir == Path("/workspace")
    assert config.metadata_env_prefix == "SANDBOX_"
    assert (config.shutdown_timeout, config.http_idle_timeout, config.stream_chunk_size) == (10.0, 60.0, 4096)
    assert config.command_timeout == 300.0
    assert ns.version is False


def test_go_style_spellings() -> None:
    config, _ = parse_args(
        [
            "-listen-host=127.0.0.1",
            "--grpc-port",
            "9999",
            "-shutdown-timeout",
            "2s",
            "--http-idle-timeout=500ms",
        ],
        environ={},
    )
    assert (config.listen_host, config.grpc_port, config.shutdown_timeout, config.http_idle_timeout) == (
        "127.0.0.1",
        9999,
        2.0,
        0.5,
    )


def test_sandboxd_zap_logging_flags_are_accepted() -> None:
    config, _ = parse_args(
        ["--zap-log-level=debug", "--zap-devel", "--zap-encoder", "json", "--grpc-port", "9999"], environ={}
    )
    assert config.grpc_port == 9999


def test_legacy_environment_defaults() -> None:
    config, _ = parse_args([], environ={"SANDBOX_BASE_DIR": "/app", "SANDBOX_EXEC_TIMEOUT_SECONDS": "12.5"})
    assert (config.root_dir, config.command_timeout) == (Path("/app"), 12.5)
    for bad in ("abc", "-1", "0", "inf", "nan"):
        config, _ = parse_args([], environ={"SANDBOX_EXEC_TIMEOUT_SECONDS": bad, "SANDBOX_BASE_DIR": "  "})
        assert (config.root_dir, config.command_timeout) == (Path("/workspace"), 300.0)


@pytest.mark.parametrize(
    "argv",
    [
        ["--grpc-port", "70000"],
        ["--rest-port", "9090"],
        ["--root-dir", ""],
        ["--shutdown-timeout", "10x"],
        ["--max-processes", "0"],
        ["--stream-chunk-size", "-1"],
        ["--no-such-flag"],
    ],
)
def test_invalid_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv, environ={})
    assert exc.value.code == 2
    assert capsys.readouterr().err


def test_parse_seconds() -> None:
    assert [parse_seconds(s) for s in ("10s", "500ms", "2m", "1h", "30", "1.5s")] == [
        10,
        0.5,
        120,
        3600,
        30,
        1.5,
    ]
    with pytest.raises(ValueError, match="invalid duration"):
        parse_seconds("1m30s")


def test_config_validate_rejects_equal_ports() -> None:
    with pytest.raises(ValueError, match="must differ"):
        RuntimeConfig(legacy_port=80, rest_port=80).validate()
