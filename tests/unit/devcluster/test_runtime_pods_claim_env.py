"""Which runtime pods get the claim env projection (devcluster/runtime_pods.py `projects_claim_env`)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_sandbox.api.lifecycle import CLAIM_ENV_FIELD_PATH, DEFAULT_CLAIM_ENV_FILE
from agent_sandbox.devcluster.runtime_pods import runtime_pod

pytestmark = pytest.mark.unit

IMAGE = "ghcr.io/x/agent-sandbox-runtime:dev"


def _pod(
    volume: dict[str, Any], mount_path: str = "/var/run/agent-sandbox", args: list[str] | None = None
) -> Any:
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "containers": [
                {
                    "name": "runtime",
                    "image": IMAGE,
                    "args": args or [],
                    "volumeMounts": [{"name": "claim-env", "mountPath": mount_path}],
                }
            ],
            "volumes": [{"name": "claim-env", **volume}],
        },
    }


_ITEM = {"path": "claim-env", "fieldRef": {"fieldPath": CLAIM_ENV_FIELD_PATH}}


def test_downward_api_volume_at_the_default_path() -> None:
    assert runtime_pod(_pod({"downwardAPI": {"items": [_ITEM]}}), base_env={}).claim_env


def test_projected_volume_counts_too() -> None:
    volume = {"projected": {"sources": [{"downwardAPI": {"items": [_ITEM]}}]}}
    assert runtime_pod(_pod(volume), base_env={}).claim_env


def test_other_fields_or_paths_do_not() -> None:
    other = {"path": "claim-env", "fieldRef": {"fieldPath": "metadata.annotations['x']"}}
    assert not runtime_pod(_pod({"downwardAPI": {"items": [other]}}), base_env={}).claim_env
    assert not runtime_pod(
        _pod({"downwardAPI": {"items": [_ITEM]}}, mount_path="/etc/x"), base_env={}
    ).claim_env


def test_the_runtime_flag_moves_the_file() -> None:
    pod = _pod(
        {"downwardAPI": {"items": [_ITEM]}}, mount_path="/etc/x", args=["--claim-env-file=/etc/x/claim-env"]
    )
    assert runtime_pod(pod, base_env={}).claim_env
    assert DEFAULT_CLAIM_ENV_FILE == "/var/run/agent-sandbox/claim-env"
