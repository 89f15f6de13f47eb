"""`AGENT_SANDBOX_CONTROLLER_SRC` runs the dev cluster's controller from another checkout (same-harness A/B)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent_sandbox.devcluster import controller


def _cluster(tmp_path: Path) -> Any:
    ports = {"controller_metrics": 1, "controller_health": 2, "controller_webhook": 3}
    return SimpleNamespace(state=SimpleNamespace(started=[], extra_ports=ports), directory=tmp_path)


def test_another_source_runs_the_module_with_the_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controller, "controller_kubeconfig", lambda cluster: tmp_path / "kubeconfig")
    monkeypatch.setenv(controller.CONTROLLER_SRC_ENV, "/elsewhere/src")
    argv = controller.controller_argv(_cluster(tmp_path))
    # The console script would import this checkout's package; `-m` with PYTHONPATH imports the other one.
    assert argv[:3] == [sys.executable, "-m", "agent_sandbox.controllers.main"]
    assert controller.other_source() == "/elsewhere/src"


def test_without_it_nothing_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller, "controller_kubeconfig", lambda cluster: tmp_path / "kubeconfig")
    monkeypatch.delenv(controller.CONTROLLER_SRC_ENV, raising=False)
    assert controller.other_source() is None
    argv = controller.controller_argv(_cluster(tmp_path))
    script = Path(sys.executable).with_name(controller.CONTROLLER)
    expected = [str(script)] if script.exists() else [sys.executable, "-m", "agent_sandbox.controllers.main"]
    assert argv[: len(expected)] == expected
