"""Port picks: below the ephemeral range, and never the same port twice while a picker may not have bound it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agent_sandbox.devcluster.allocation import allocation_lock, free_port


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENT_SANDBOX_CACHE", str(tmp_path))
    return tmp_path


def test_picks_made_without_binding_are_not_handed_out_again(
    own_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two pickers that each get a port and bind it later (a test starting a router process) must not get the
    same one; it happened when only cluster-recorded ports were avoided (a router's metrics listener failed
    with "address already in use")."""
    # Few candidates, so a repeat would be likely if picks were not remembered.
    monkeypatch.setattr("agent_sandbox.devcluster.allocation._listen_ports", lambda: range(20000, 20008))
    picks = []
    for _ in range(8):
        with allocation_lock():
            picks.append(free_port(set()))  # a fresh `taken`, as each process starts with
    assert sorted(picks) == list(range(20000, 20008))
    recorded = json.loads((own_cache / "clusters" / ".recent-ports").read_text())
    assert sorted(int(p) for p in recorded) == sorted(picks)
    assert all(isinstance(t, float) for t in recorded.values())


def test_old_picks_are_forgotten(own_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent_sandbox.devcluster.allocation._listen_ports", lambda: range(20000, 20002))
    (own_cache / "clusters").mkdir()
    old, fresh = time.time() - 3600, time.time()
    (own_cache / "clusters" / ".recent-ports").write_text(json.dumps({"20000": old, "20001": fresh}))
    with allocation_lock():
        assert free_port(set()) == 20000
    (own_cache / "clusters" / ".recent-ports").write_text("not json")  # a damaged record is not fatal
    with allocation_lock():
        assert free_port({20001}) == 20000
