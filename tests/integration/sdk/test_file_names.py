"""Unusual file names through the SDK's file API, against the runtimes the local runner serves, via the router.

| case | legacy | sandboxd |
|---|---|---|
| `a/../b` | normalized to `b` first (upstream 1.0.8's order), not refused | same |
| `exists` of a name with a control character | the runtime's answer, a bool | same |
| `write(name with LF, allow_unsafe_paths=True)` | `ValueError`, nothing written (was `new%0Aline.txt`) | written as given |
"""

from __future__ import annotations

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import SandboxClient, SandboxdDirectConnectionConfig, SandboxDirectConnectionConfig

from .conftest import RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def pool(cluster: DevCluster, namespace: str, controller: Started) -> str:
    apply_pool(cluster, namespace, replicas=2, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    return namespace


def connect(cluster: DevCluster, router: str, runtime: str) -> SandboxClient:
    """A client through the router to the legacy runtime's HTTP API or sandboxd's REST."""
    if runtime == "legacy":
        return SandboxClient(SandboxDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig)
    return SandboxClient(SandboxdDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig)


@pytest.mark.parametrize("runtime", ["legacy", "sandboxd"])
def test_a_dot_dot_inside_the_path_is_normalized_away(
    cluster: DevCluster, pool: str, router: str, runtime: str
) -> None:
    with connect(cluster, router, runtime) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        files = sandbox.files
        assert files is not None
        files.write("n/a/../b.txt", b"normalized")
        assert files.read("n/x/../b.txt") == b"normalized"
        assert [e.name for e in files.list("n")] == ["b.txt"]
        with pytest.raises(ValueError, match="escapes the sandbox root"):
            files.write("n/../../x.txt", b"")
        sandbox.terminate()


@pytest.mark.parametrize("runtime", ["legacy", "sandboxd"])
def test_line_breaks_in_a_written_name_and_exists_of_it(
    cluster: DevCluster, pool: str, router: str, runtime: str
) -> None:
    with connect(cluster, router, runtime) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        files, commands = sandbox.files, sandbox.commands
        assert files is not None
        assert commands is not None
        name = "nl/new\nline.txt"
        if runtime == "legacy":
            with pytest.raises(ValueError, match="line break"):
                files.write(name, b"x", allow_unsafe_paths=True)
            assert not files.exists("nl")  # nothing written, `new%0Aline.txt` included
            # through `sh -c`: the legacy runtime splits a command into argv, no shell
            result = commands.run("sh -c 'mkdir nl && printf x > \"nl/new\nline.txt\"'")
            assert result.exit_code == 0, result.stderr
        else:
            files.write(name, b"x", allow_unsafe_paths=True)
        assert files.read(name, allow_unsafe_paths=True) == b"x"
        assert [e.name for e in files.list("nl")] == ["new\nline.txt"]
        assert files.exists(name) is True
        assert files.exists("nl/other\tname") is False
        sandbox.terminate()
