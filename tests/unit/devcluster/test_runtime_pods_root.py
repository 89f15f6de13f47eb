"""The root directory the runner serves a runtime pod from (devcluster/runtime_pods.py `runtime_pod`).

Upstream's legacy runtime images serve `$SANDBOX_BASE_DIR` or `/app` (spec sdk-router-runtime §2.1), and
their manifests (examples/warmpool-quickstart) mount the workspace PVC at `/app`; the runner used our
runtime's `/workspace` for every image, so that PVC was never the workspace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.devcluster.runtime_pods import runtime_pod

pytestmark = pytest.mark.unit


def _pod(image: str, mount: str, *, env: dict[str, str] | None = None, args: list[str] | None = None) -> Any:
    container: dict[str, Any] = {
        "name": "rt",
        "image": image,
        "volumeMounts": [{"name": "workspace", "mountPath": mount}],
    }
    if env is not None:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if args is not None:
        container["args"] = args
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "containers": [container],
            "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace-p"}}],
        },
    }


@pytest.mark.parametrize("image", ["sandbox-runtime:latest", "us-docker.pkg.dev/x/python-runtime-sandbox:v1"])
def test_upstream_legacy_images_serve_app_so_the_pvc_there_is_the_workspace(image: str) -> None:
    rp = runtime_pod(_pod(image, "/app"), base_env={})
    assert rp.config.root_dir == Path("/app")
    assert rp.claim == "workspace-p"
    assert "SANDBOX_BASE_DIR" not in rp.env  # the default is the image's, not an injected variable


@pytest.mark.parametrize("value", ["", "  "])
def test_a_blank_base_dir_is_the_default_as_upstream_reads_it(value: str) -> None:
    rp = runtime_pod(_pod("sandbox-runtime", "/app", env={"SANDBOX_BASE_DIR": value}), base_env={})
    assert rp.config.root_dir == Path("/app")
    assert rp.env["SANDBOX_BASE_DIR"] == value


def test_the_containers_base_dir_and_an_explicit_root_dir_still_win() -> None:
    by_env = runtime_pod(_pod("sandbox-runtime", "/data", env={"SANDBOX_BASE_DIR": "/data"}), base_env={})
    assert (by_env.config.root_dir, by_env.claim) == (Path("/data"), "workspace-p")
    by_flag = runtime_pod(_pod("sandbox-runtime", "/w", args=["--root-dir", "/w"]), base_env={})
    assert (by_flag.config.root_dir, by_flag.claim) == (Path("/w"), "workspace-p")


@pytest.mark.parametrize("image", ["ghcr.io/agent-sandbox/agent-sandbox-runtime:dev", "sandboxd:v0.1"])
def test_our_runtime_and_sandboxd_keep_workspace(image: str) -> None:
    rp = runtime_pod(_pod(image, "/workspace"), base_env={})
    assert rp.config.root_dir == Path("/workspace")
    assert rp.claim == "workspace-p"
    assert runtime_pod(_pod(image, "/app"), base_env={}).claim is None


def test_sandboxd_ignores_sandbox_base_dir_as_its_binary_does() -> None:
    """Upstream's sandboxd (spec sdk-router-runtime §2.2) has only `--root-dir` (default `/workspace`): a
    `SANDBOX_BASE_DIR` in its container is an ordinary variable for the commands, not its root."""
    rp = runtime_pod(_pod("sandboxd:v0.1", "/workspace", env={"SANDBOX_BASE_DIR": "/data"}), base_env={})
    assert (rp.config.root_dir, rp.claim) == (Path("/workspace"), "workspace-p")
    assert rp.env["SANDBOX_BASE_DIR"] == "/data"
    by_flag = runtime_pod(
        _pod("sandboxd", "/w", env={"SANDBOX_BASE_DIR": "/d"}, args=["--root-dir=/w"]), base_env={}
    )
    assert by_flag.config.root_dir == Path("/w")
    # ours reads it (agent-sandbox-runtime --help: default $SANDBOX_BASE_DIR or /workspace)
    ours = runtime_pod(_pod("agent-sandbox-runtime", "/data", env={"SANDBOX_BASE_DIR": "/data"}), base_env={})
    assert (ours.config.root_dir, ours.claim) == (Path("/data"), "workspace-p")
