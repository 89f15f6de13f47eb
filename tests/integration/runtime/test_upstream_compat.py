"""Wire compatibility with the published upstream SDK `k8s-agent-sandbox==1.0.8` (its own virtualenv).

- Our `process.v1` descriptor is byte-identical to the one generated into the wheel.
- The wheel's generated gRPC stubs drive our ProcessService.
- The SDK itself, pointed straight at a runtime through a real Sandbox object whose `status.podIPs` is
  127.0.0.1 (`SandboxInClusterConnectionConfig` / `SandboxdInClusterConnectionConfig`), runs commands and
  files on both protocols. Here the runtime runs alone; tests/integration/devcluster/test_runner_sdk.py does
  the same through the dev cluster's runner.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from agent_sandbox.api.processv1 import process_pb2
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import install_crds
from agent_sandbox.runtime import RuntimeServer
from tests.upstream_sdk import ensure_upstream_sdk, published_descriptor, run_script, site_packages

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def sdk_python() -> Path:
    return ensure_upstream_sdk()


def _fields(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, tuple[object, ...]]:
    rows: dict[str, tuple[object, ...]] = {}

    def walk(prefix: str, msg: descriptor_pb2.DescriptorProto) -> None:
        for f in msg.field:
            rows[f"{prefix}{msg.name}.{f.name}"] = (
                f.number,
                f.type,
                f.label,
                f.type_name,
                f.json_name,
                f.oneof_index if f.HasField("oneof_index") else None,
                f.proto3_optional,
            )
        for nested in msg.nested_type:
            walk(f"{prefix}{msg.name}.", nested)

    for msg in fd.message_type:
        walk("", msg)
    for enum in fd.enum_type:
        for v in enum.value:
            rows[f"{enum.name}.{v.name}"] = (v.number,)
    for svc in fd.service:
        for m in svc.method:
            rows[f"{svc.name}/{m.name}"] = (
                m.input_type,
                m.output_type,
                m.server_streaming,
                m.client_streaming,
            )
    return rows


def test_descriptor_matches_the_published_wheel(sdk_python: Path) -> None:
    theirs = descriptor_pb2.FileDescriptorProto.FromString(published_descriptor(sdk_python))
    ours = descriptor_pb2.FileDescriptorProto.FromString(process_pb2.DESCRIPTOR.serialized_pb)
    assert (
        (ours.name, ours.package)
        == (theirs.name, theirs.package)
        == ("process/v1/process.proto", "process.v1")
    )
    assert _fields(ours) == _fields(theirs)  # every message, field, number, type, name, enum value, method
    assert ours == theirs
    assert process_pb2.DESCRIPTOR.serialized_pb == published_descriptor(sdk_python)


_STUBS_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import grpc
from process.v1 import process_pb2 as pb, process_pb2_grpc as pbg
stub = pbg.ProcessServiceStub(grpc.insecure_channel(sys.argv[2]))
out = {}
r = stub.Execute(pb.ExecuteRequest(config=pb.ProcessConfig(command=["/bin/sh", "-c", "echo $V; exit 2"], env_vars={"V": "x"})), timeout=30)
out["execute"] = [r.exit_code, r.stdout.decode(), r.stderr.decode()]
events = []
for ev in stub.Start(pb.StartRequest(config=pb.ProcessConfig(command=["/bin/sh", "-c", "stty size"]), pty=pb.PTY(cols=80, rows=24)), timeout=30):
    kind = ev.WhichOneof("event")
    events.append([kind, ev.stdout.decode() if kind == "stdout" else ev.exit.exit_code if kind == "exit" else ev.init.process_id])
out["start"] = events
try:
    stub.SendSignal(pb.SendSignalRequest(process_id=12345, signal=pb.SIGNAL_SIGTERM), timeout=30)
except grpc.RpcError as err:
    out["signal"] = err.code().name
print(json.dumps(out))
"""


async def test_published_stubs_drive_our_process_service(sdk_python: Path, runtime: RuntimeServer) -> None:
    proto_dir = site_packages(sdk_python) / "k8s_agent_sandbox" / "_proto"
    out = json.loads(
        await run_script(sdk_python, _STUBS_SCRIPT, str(proto_dir), f"127.0.0.1:{runtime.ports['grpc']}")
    )
    assert out["execute"] == [2, "x\n", ""]
    kinds = [e[0] for e in out["start"]]
    assert kinds[0] == "init"
    assert kinds[-1] == "exit"
    assert out["start"][-1][1] == 0
    assert "24 80" in "".join(str(e[1]) for e in out["start"] if e[0] == "stdout")
    assert out["signal"] == "NOT_FOUND"


def _sandbox_with_pod_ip(cluster: DevCluster, namespace: str, name: str) -> None:
    """A real Sandbox object whose status says the pod is at 127.0.0.1 (no controller runs here)."""
    admin = cluster.admin()
    base = f"/apis/agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxes"
    body = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "runtime", "image": "runtime"}]}}},
    }
    status, resp = admin.request("POST", base, body)
    assert status == 201, resp
    status, resp = admin.request("PATCH", f"{base}/{name}/status", {"status": {"podIPs": ["127.0.0.1"]}})
    assert status == 200, resp


_LEGACY_SCRIPT = r"""
import json, sys
from k8s_agent_sandbox.sandbox import Sandbox
from k8s_agent_sandbox.models import SandboxInClusterConnectionConfig
ns, name, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
sb = Sandbox(claim_name=name, sandbox_id=name, namespace=ns, connection_config=SandboxInClusterConnectionConfig(server_port=port))
out = {}
r = sb.commands.run("echo hello")
out["run"] = [r.stdout, r.stderr, r.exit_code]
r = sb.commands.run("sleep 30", command_timeout=1)
out["timeout"] = [r.exit_code, r.timed_out]
sb.files.write("dir/hello.txt", "hi")
out["read"] = sb.files.read("dir/hello.txt").decode()
out["exists"] = [sb.files.exists("dir/hello.txt"), sb.files.exists("nope")]
out["list"] = sorted((e.name, e.type) for e in sb.files.list("dir"))
out["root"] = sorted(e.name for e in sb.files.list("."))
odd = ["back\\slash.txt", "a b.txt", "\u00fc.txt", "semi;colon.txt", "q?x#.txt", "pct%20.txt"]
for n in odd:
    sb.files.write("odd/" + n, n)
out["odd_read"] = [sb.files.read("odd/" + n).decode() for n in odd]
out["odd_list"] = sorted(e.name for e in sb.files.list("odd"))
out["odd"] = odd
print(json.dumps(out))
"""

_SANDBOXD_SCRIPT = r"""
import json, sys
from k8s_agent_sandbox.sandbox import Sandbox
from k8s_agent_sandbox.models import SandboxdInClusterConnectionConfig
ns, name, rest, grpc_port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cfg = SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip", rest_port=rest, grpc_port=grpc_port)
sb = Sandbox(claim_name=name, sandbox_id=name, namespace=ns, connection_config=cfg)
out = {}
r = sb.commands.run("echo hello; echo $E >&2", env={"E": "env-ok"}, cwd=".")
out["run"] = [r.stdout, r.stderr, r.exit_code]
r = sb.commands.run("sleep 30", command_timeout=1)
out["timeout"] = [r.exit_code, r.timed_out]
sb.files.write("dir/hello.txt", b"hi")
out["read"] = sb.files.read("dir/hello.txt").decode()
out["exists"] = [sb.files.exists("dir/hello.txt"), sb.files.exists("nope")]
out["list"] = sorted((e.name, e.type, e.mode) for e in sb.files.list("dir"))
sb.files.delete("dir", recursive=True)
out["after_delete"] = sb.files.exists("dir")
print(json.dumps(out))
"""


async def test_sdk_legacy_runtime_in_cluster_mode(
    sdk_python: Path, runtime: RuntimeServer, cluster: DevCluster, namespace: str
) -> None:
    install_crds(cluster)
    _sandbox_with_pod_ip(cluster, namespace, "legacy-direct")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    out = json.loads(
        await run_script(
            sdk_python, _LEGACY_SCRIPT, namespace, "legacy-direct", str(runtime.ports["legacy"]), env=env
        )
    )
    assert out["run"] == ["hello\n", "", 0]
    assert out["timeout"] == [1, True]
    assert out["read"] == "hi"
    assert out["exists"] == [True, False]
    assert out["list"] == [["hello.txt", "file"]]
    assert out["root"] == ["dir"]
    assert Path(runtime.root, "dir", "hello.txt").read_text() == "hi"
    # Names as requests (urllib3 2) writes them: a `\` is sent as it is, and upstream's runtime
    # (python-multipart) keeps it; aiohttp's quoted-pair unescaping stored `back\slash.txt` as `backslash.txt`.
    assert out["odd_list"] == sorted(out["odd"])
    assert out["odd_read"] == out["odd"]


async def test_sdk_sandboxd_in_cluster_mode(
    sdk_python: Path, runtime: RuntimeServer, cluster: DevCluster, namespace: str
) -> None:
    install_crds(cluster)
    _sandbox_with_pod_ip(cluster, namespace, "sandboxd-direct")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    args = (namespace, "sandboxd-direct", str(runtime.ports["rest"]), str(runtime.ports["grpc"]))
    out = json.loads(await run_script(sdk_python, _SANDBOXD_SCRIPT, *args, env=env))
    assert out["run"] == ["hello\n", "env-ok\n", 0]
    assert out["timeout"] == [124, True]
    assert out["read"] == "hi"
    assert out["exists"] == [True, False]
    assert out["list"] == [["hello.txt", "file", "0644"]]
    assert out["after_delete"] is False
