"""Start-up configuration errors: one line naming what is wrong, exit 1, and no traceback.

A wrong `--webhook-port` used to reach the listener (99999 wrapped to 34463 on all interfaces, -1 failed
with a traceback); a bad bind address, a port in use or a webhook that cannot listen printed a full
traceback under "problem running manager" beside the one-line message. Unexpected errors keep theirs.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest
import yaml

from agent_sandbox.controllers.context import ControllerContext, Setup
from agent_sandbox.controllers.main import main, run
from agent_sandbox.controllers.options import Options, parse_options, validate
from agent_sandbox.controllers.webhook import CertificateError, WebhookError
from agent_sandbox.kube import Manager

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value", ["99999", "65536", "0", "-1"])
def test_webhook_port_outside_1_65535_is_fatal(value: str) -> None:
    errors, _ = validate(parse_options([f"--webhook-port={value}", "--leader-elect=false"])[0])
    assert errors == ["--webhook-port must be within 1-65535"]


@pytest.mark.parametrize("value", ["1", "9443", "65535"])
def test_webhook_port_within_range_is_accepted(value: str) -> None:
    assert validate(parse_options([f"--webhook-port={value}", "--leader-elect=false"])[0])[0] == []


@pytest.mark.parametrize("flag", ["metrics-bind-address", "health-probe-bind-address"])
@pytest.mark.parametrize("value", ["garbage", ":99999", "127.0.0.1:", "host:port"])
def test_malformed_bind_addresses_are_fatal(flag: str, value: str) -> None:
    errors, _ = validate(parse_options([f"--{flag}={value}", "--leader-elect=false"])[0])
    assert len(errors) == 1
    assert errors[0].startswith(f"--{flag} must be")
    assert repr(value) in errors[0]


@pytest.mark.parametrize("value", ["", "0", ":8080", "127.0.0.1:0", "[::1]:8081", "localhost:9000"])
def test_wellformed_bind_addresses_are_accepted(value: str) -> None:
    opts, _ = parse_options([f"--metrics-bind-address={value}", "--leader-elect=false"])
    assert validate(opts)[0] == []


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize("value", ["99999", "-1"])
def test_main_exits_1_naming_the_webhook_port(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([f"--webhook-port={value}", "--leader-elect=false"]) == 1
    err = capsys.readouterr().err
    assert "invalid flag: --webhook-port must be within 1-65535" in err
    assert "Traceback" not in err


@pytest.mark.usefixtures("restore_logging")
def test_main_exits_1_naming_a_garbage_metrics_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--metrics-bind-address=garbage", "--leader-elect=false"]) == 1
    err = capsys.readouterr().err
    assert "invalid flag: --metrics-bind-address must be" in err
    assert "Traceback" not in err


# ------------------------------------------------------------------ errors while the manager starts


def _kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig for an API server nobody runs: these start-ups fail before any API call."""
    path = tmp_path / "kubeconfig"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


class _Failing:
    """A runnable on every replica (as the webhook) that fails at start with `error`."""

    need_leader_election = False

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def start(self) -> None:
        raise self.error


def _options(tmp_path: Path, metrics: str = "127.0.0.1:0") -> Options:
    return Options(
        kubeconfig=str(_kubeconfig(tmp_path)),
        metrics_bind_address=metrics,
        health_probe_bind_address="127.0.0.1:0",
        leader_elect=False,
        enable_webhook=False,
    )


async def _run_failing(tmp_path: Path, error: BaseException | None, metrics: str = "127.0.0.1:0") -> int:
    def add(mgr: Manager, _: ControllerContext) -> None:
        if error is not None:
            mgr.add(_Failing(error))

    stop = asyncio.Event()
    return await asyncio.wait_for(
        run(_options(tmp_path, metrics), setups=[Setup("failing", add)], stop=stop), 30
    )


def _problem(caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    [record] = [r for r in caplog.records if r.getMessage().startswith("problem running manager")]
    return record


@pytest.mark.parametrize(
    "error",
    [
        WebhookError("cannot listen on *:9443: [Errno 98] address already in use"),
        CertificateError("Secret agent-sandbox-webhook-certs is incomplete or not base64: 'ca.crt'"),
        OSError(98, "error while attempting to bind on address ('127.0.0.1', 8080): address already in use"),
        TimeoutError("timed out waiting for caches to sync: sandboxarchives.agents.x-k8s.io"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_known_start_up_errors_are_one_line(
    error: BaseException, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        assert await _run_failing(tmp_path, error) == 1
    record = _problem(caplog)
    assert str(error) in record.getMessage()
    assert record.exc_info is None


async def test_metrics_port_in_use_is_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.INFO):
            assert await _run_failing(tmp_path, None, metrics=f"127.0.0.1:{port}") == 1
    record = _problem(caplog)
    assert str(port) in record.getMessage()
    assert record.exc_info is None


async def _run_failing_together(tmp_path: Path, *errors: BaseException) -> int:
    """Runnables that fail in the same pass: the manager's task group raises them as one group."""

    def add(mgr: Manager, _: ControllerContext) -> None:
        for error in errors:
            mgr.add(_Failing(error))

    return await asyncio.wait_for(
        run(_options(tmp_path), setups=[Setup("failing", add)], stop=asyncio.Event()), 30
    )


async def test_several_start_up_errors_at_once_are_one_line_naming_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two listeners failing in the same pass (a second instance on the same ports) came as "unhandled errors
    in a TaskGroup (2 sub-exceptions)" with a traceback, the ports named only inside it."""
    errors = [
        OSError(98, "error while attempting to bind on address ('127.0.0.1', 8080): address already in use"),
        WebhookError("cannot listen on *:9443: [Errno 98] address already in use"),
    ]
    with caplog.at_level(logging.INFO):
        assert await _run_failing_together(tmp_path, *errors) == 1
    record = _problem(caplog)
    assert record.exc_info is None
    assert "TaskGroup" not in record.getMessage()
    for error in errors:
        assert str(error) in record.getMessage()


async def test_metrics_and_health_ports_both_in_use_are_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The real listeners: one or both fail first (a race), the log line names the port(s) either way."""
    with socket.socket() as metrics, socket.socket() as health:
        for taken in (metrics, health):
            taken.bind(("127.0.0.1", 0))
            taken.listen()
        ports = [metrics.getsockname()[1], health.getsockname()[1]]
        opts = _options(tmp_path, metrics=f"127.0.0.1:{ports[0]}")
        opts.health_probe_bind_address = f"127.0.0.1:{ports[1]}"
        with caplog.at_level(logging.INFO):
            code = await asyncio.wait_for(run(opts, setups=[], stop=asyncio.Event()), 30)
    assert code == 1
    record = _problem(caplog)
    assert record.exc_info is None
    assert "TaskGroup" not in record.getMessage()
    assert any(str(port) in record.getMessage() for port in ports)


async def test_several_failures_with_a_bug_among_them_keep_the_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        assert (
            await _run_failing_together(tmp_path, OSError(98, "address already in use"), KeyError("spec"))
            == 1
        )
    assert _problem(caplog).exc_info is not None


async def test_unexpected_start_up_errors_keep_the_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        assert await _run_failing(tmp_path, KeyError("spec")) == 1
    record = _problem(caplog)
    assert record.exc_info is not None


async def test_webhook_port_in_use_is_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real webhook runnable (certificates from files, so no API call) on a port another socket holds."""
    import datetime as dt

    from agent_sandbox.controllers import webhook
    from agent_sandbox.controllers.webhook import generate_bundle
    from agent_sandbox.controllers.webhook.runnable import WEBHOOK_HOST_ENV

    bundle = generate_bundle(
        service="s", namespace="n", cluster_domain="cluster.local", now=dt.datetime.now(dt.UTC)
    )
    (tmp_path / "tls.crt").write_bytes(bundle.cert_pem)
    (tmp_path / "tls.key").write_bytes(bundle.key_pem)
    monkeypatch.setenv(WEBHOOK_HOST_ENV, "127.0.0.1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        opts = _options(tmp_path)
        opts.enable_webhook, opts.manage_webhook_certs = True, False
        opts.webhook_port, opts.webhook_cert_dir = port, str(tmp_path)
        with caplog.at_level(logging.INFO):
            code = await asyncio.wait_for(
                run(opts, setups=[Setup("webhook", webhook.setup)], stop=asyncio.Event()), 30
            )
    assert code == 1
    record = _problem(caplog)
    assert f"WebhookError: cannot listen on 127.0.0.1:{port}" in record.getMessage()
    assert record.exc_info is None


def test_no_module_defines_anything_after_its_main_guard() -> None:
    """Under `python -m` (how the dev cluster starts the controller without a console script) the code below a
    module's `if __name__ == "__main__":` runs only after `main()` returned: the controller's one-line start-up
    error used a helper defined there and ended in a NameError instead (a group of listener failures)."""
    import ast

    import agent_sandbox

    late: list[str] = []
    for path in sorted(Path(agent_sandbox.__file__).parent.rglob("*.py")):
        body = ast.parse(path.read_text()).body
        guards = [
            n
            for n, node in enumerate(body)
            if isinstance(node, ast.If)
            and "__main__" in ast.unparse(node.test)
            and "__name__" in ast.unparse(node.test)
        ]
        if guards and guards[-1] != len(body) - 1:
            late.append(f"{path}: {ast.unparse(body[guards[-1] + 1])[:60]}")
    assert late == []
