"""Commands and files through the SDK against real runtimes: sandboxes from a warm pool whose pods the dev
cluster's local runner serves (`agent-sandbox-runtime` bound to each pod's 127.x IP), in every connection
mode that can work on this machine, sync and async.

| mode | config | path |
|---|---|---|
| legacy, pod IP | `SandboxInClusterConnectionConfig` | `http://<pod IP>:8888` |
| sandboxd, pod IP | `SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip")` | REST `<pod IP>:8080`, gRPC `<pod IP>:9090` |
| sandboxd, pod tunnel | `SandboxdPodTunnelConnectionConfig()` | `kubectl port-forward pod/<pod>` -> API server `pods/portforward` -> kwok (the dev cluster's kubelet) -> the pod IP |

Router modes are in test_router.py. Modes that cannot work here (and why) are listed in docs/sdk/python.md.
"""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path

import pytest
import yaml

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClient,
    SandboxConnectionError,
    SandboxdInClusterConnectionConfig,
    SandboxdPodTunnelConnectionConfig,
    SandboxError,
    SandboxInClusterConnectionConfig,
    SandboxRequestError,
)
from agent_sandbox_sdk.models import SandboxConnectionConfig

from .conftest import RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


MODES: dict[str, SandboxConnectionConfig] = {
    "legacy-pod-ip": SandboxInClusterConnectionConfig(),
    "sandboxd-pod-ip": SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip"),
    "sandboxd-pod-tunnel": SandboxdPodTunnelConnectionConfig(),
}


@pytest.fixture(autouse=True)
def kubectl_on_path(cluster: DevCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tunnel mode runs `kubectl port-forward`, found on PATH as upstream's SDK finds it: the cluster's own."""
    monkeypatch.setenv("PATH", f"{cluster.binaries.path('kubectl').parent}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def pool(cluster: DevCluster, namespace: str, controller: Started) -> str:
    apply_pool(cluster, namespace, replicas=2, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    return namespace


@pytest.mark.parametrize("mode", sorted(MODES))
def test_commands_and_files_sync(cluster: DevCluster, pool: str, mode: str, tmp_path: Path) -> None:
    sandboxd = mode.startswith("sandboxd")
    with SandboxClient(MODES[mode], kubeconfig=cluster.kubeconfig) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        commands, files = sandbox.commands, sandbox.files
        assert commands is not None
        assert files is not None

        result = commands.run("echo hello")
        assert (result.stdout, result.stderr, result.exit_code, result.timed_out) == ("hello\n", "", 0, False)
        assert commands.run("ls /definitely-missing").exit_code != 0
        assert commands.run("printenv GREETING", env={"GREETING": "hi"}).stdout == "hi\n"
        files.write("sub/marker", b"")
        assert commands.run("pwd", cwd="sub").stdout.strip().endswith("/sub")
        slow = commands.run("sleep 5", timeout=30, command_timeout=1)
        assert slow.timed_out
        assert slow.exit_code != 0

        files.write("dir/hello.txt", "hi")
        assert files.read("dir/hello.txt") == b"hi"
        for odd in ('say "hi".txt', "back\\slash.txt", "per%22cent.txt", "é #?.txt"):
            files.write(f"names/{odd}", odd)  # a `"` was stored as %22 on the legacy runtime
            assert files.read(f"names/{odd}") == odd.encode()
        assert sorted(e.name for e in files.list("names")) == sorted(
            ('say "hi".txt', "back\\slash.txt", "per%22cent.txt", "é #?.txt")
        )
        deep = "/".join(["é" * 120] * 14) + "/f.txt"  # 3,379 bytes (PATH_MAX is 4096), ~10 KiB in a URL
        files.write(deep, "deep")  # the runtime refused request lines past 8190 bytes: 400, text/plain
        assert files.read(deep) == b"deep"
        assert files.exists(deep)
        assert [e.name for e in files.list(deep.rsplit("/", 1)[0])] == ["f.txt"]
        assert files.exists("dir/hello.txt")
        assert not files.exists("dir/nope.txt")
        big = bytes(range(256)) * 8192  # 2 MiB, streamed from a file object
        files.write("dir/big.bin", io.BytesIO(big))
        assert files.read_to("dir/big.bin", tmp_path / "big.bin") == len(big)
        files.write("dir/big-bytes.bin", big[::-1])  # in memory, over STREAM_ABOVE: streamed with its length
        assert files.read("dir/big-bytes.bin") == big[::-1]
        assert (tmp_path / "big.bin").read_bytes() == big
        with pytest.raises(Exception, match="max_bytes"):
            files.read_to("dir/big.bin", tmp_path / "cut.bin", max_bytes=1000)
        assert not (tmp_path / "cut.bin").exists()
        entries = {e.name: e for e in files.list("dir")}
        assert entries["hello.txt"].size == 2
        assert entries["hello.txt"].type == "file"
        assert entries["big.bin"].modified.tzinfo is not None
        assert entries["hello.txt"].mode == "0644"  # this project's legacy runtime lists modes too
        files.write("dir/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)  # sandboxd: as written; legacy: chmod
        assert {e.name: e.mode for e in files.list("dir")}["run.sh"] == "0755"
        assert commands.run("./dir/run.sh").stdout == "ran\n"
        with pytest.raises(ValueError, match="mode must be permission bits"):
            files.write("dir/x", "x", mode=0o4755)
        assert "dir" in {e.name for e in files.list(".")}
        with pytest.raises(
            SandboxError, match="is a file, not a directory" if sandboxd else "not a directory"
        ):
            files.list(
                "dir/hello.txt"
            )  # sandboxd: its bytes at the listing's URL, read as a malformed listing
        if sandboxd:  # the legacy runtime has separate URLs: a directory's /download is a 404
            with pytest.raises(SandboxError, match="is a directory, not a file"):
                files.read("dir")  # sandboxd: the listing's JSON was returned as the "file"
            with pytest.raises(SandboxError, match="is a directory, not a file"):
                files.read_to("dir", tmp_path / "dir.out")
            assert not (tmp_path / "dir.out").exists()
        files.delete("dir/hello.txt")
        assert not files.exists("dir/hello.txt")
        with pytest.raises(SandboxRequestError) as info:
            files.delete("dir")  # not empty
        assert info.value.status_code == 409
        files.delete("dir", recursive=True)
        assert not files.exists("dir")
        with pytest.raises(SandboxRequestError) as missing:
            files.read("dir/hello.txt")
        assert missing.value.status_code == 404

        events = list(
            commands.stream("echo out; echo err >&2; exit 3" if sandboxd else "sh -c 'echo out; exit 3'")
        )
        assert events[-1].type == "exit"
        assert events[-1].exit_code == 3
        assert b"".join(e.data for e in events if e.type == "stdout") == b"out\n"
        sandbox.terminate()


def test_sandboxd_stream_with_stdin_pty_and_signals(cluster: DevCluster, pool: str) -> None:
    with SandboxClient(MODES["sandboxd-pod-ip"], kubeconfig=cluster.kubeconfig) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        commands = sandbox.commands
        assert commands is not None
        assert commands.stream("cat", stdin=b"piped\n").result().stdout == "piped\n"
        tty = commands.stream("stty size; test -t 0 && echo tty", pty=(100, 30)).result()
        assert "30 100" in tty.stdout
        assert "tty" in tty.stdout
        with commands.stream("echo ready; sleep 30") as proc:
            events = iter(proc)
            first = next(events)
            assert (first.type, first.data) == ("stdout", b"ready\n")
            assert proc.process_id is not None
            proc.send_signal(15)
            rest = list(events)
        assert rest[-1].type == "exit"
        assert rest[-1].exit_code != 0
        interactive = commands.stream("read line; echo got $line")
        interactive.send_stdin(b"abc\n")  # waits for the process to start
        interactive.close_stdin()
        assert interactive.result().stdout == "got abc\n"
        assert commands.stream("sleep 10", timeout=1).result().timed_out


@pytest.mark.parametrize("mode", sorted(MODES))
def test_commands_and_files_async(cluster: DevCluster, pool: str, mode: str) -> None:
    async def main() -> None:
        async with AsyncSandboxClient(MODES[mode], kubeconfig=cluster.kubeconfig) as client:
            sandbox = await client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
            assert sandbox.commands is not None
            assert sandbox.files is not None
            results = await asyncio.gather(*(sandbox.commands.run(f"echo {i}") for i in range(10)))
            assert [r.stdout for r in results] == [f"{i}\n" for i in range(10)]
            await sandbox.files.write("a.txt", "async")
            assert await sandbox.files.read("a.txt") == b"async"
            big = bytes(range(256)) * 12288  # 3 MiB in memory: streamed from the caller's buffer
            await sandbox.files.write("big.bin", bytearray(big))
            assert await sandbox.files.read("big.bin") == big
            assert await sandbox.files.exists("a.txt")
            events = [e async for e in sandbox.commands.stream("echo streamed")]
            assert events[0].data == b"streamed\n"
            assert events[-1].exit_code == 0
            await sandbox.terminate()
            await sandbox.terminate()

    asyncio.run(main())


def test_closed_connection_refuses_and_a_dead_address_is_a_connection_error(
    cluster: DevCluster, pool: str
) -> None:
    with SandboxClient(
        SandboxInClusterConnectionConfig(server_port=1), kubeconfig=cluster.kubeconfig
    ) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        with pytest.raises(SandboxConnectionError):
            sandbox.commands.run("true")
        sandbox.close_connection()
        assert sandbox.commands is None


def test_a_tunnel_reaches_the_cluster_of_the_context_the_client_was_given(
    cluster: DevCluster, pool: str, tmp_path: Path
) -> None:
    """`SandboxClient(context="...")` (the CLI's `--context`) spoke to that context's cluster, but the kubectl
    port-forward it started used the kubeconfig's current-context: another cluster's pod, or (here) none."""
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    real = doc["contexts"][0]
    doc["clusters"].append({"name": "elsewhere", "cluster": {"server": "https://127.0.0.1:9"}})
    doc["contexts"] = [
        real,
        {"name": "elsewhere", "context": {"cluster": "elsewhere", "user": real["context"]["user"]}},
    ]
    doc["current-context"] = "elsewhere"
    kubeconfig = tmp_path / "two-contexts.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(doc))
    with SandboxClient(MODES["sandboxd-pod-tunnel"], kubeconfig=kubeconfig, context=real["name"]) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        assert sandbox.commands.run("echo through the tunnel").stdout == "through the tunnel\n"
        sandbox.terminate()
