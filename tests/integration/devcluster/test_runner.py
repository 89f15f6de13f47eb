"""The dev cluster's local runner on the real control plane (with the real controller): sandboxes execute.

Every request goes to the pod IP kwok assigned (127.x), on the runtime's default ports, as a client inside
the cluster would.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import orjson
import pytest
import yaml
import yarl
from grpc import aio

from agent_sandbox.api import processv1 as pb
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import POD, SANDBOX, ApiClient, NotFound, Object
from tests.helpers import eventually
from tests.integration.devcluster.runtime_helpers import create_runtime_pool, runtime_pod_spec
from tests.integration.runtime.helpers import ProcessClient

pytestmark = pytest.mark.integration


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


def sandbox(name: str, pod_spec: dict[str, Any] | None = None, **spec: Any) -> Object:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": pod_spec or runtime_pod_spec()}, **spec},
    }


def _ready(obj: Object | None) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in ((obj or {}).get("status") or {}).get("conditions") or ()
    )


async def _get(kube: ApiClient, kind: Any, name: str, ns: str) -> Object | None:
    try:
        return await kube.get(kind, name, namespace=ns)
    except NotFound:
        return None


async def ready_sandbox_ip(kube: ApiClient, ns: str, name: str, within: float = 60) -> str:
    async def probe() -> str | None:
        sb = await _get(kube, SANDBOX, name, ns)
        ips = ((sb or {}).get("status") or {}).get("podIPs") or []
        return str(ips[0]) if _ready(sb) and ips else None

    return await eventually(probe, f"Sandbox {name} Ready with a pod IP", within=within)


async def execute(http: aiohttp.ClientSession, ip: str, command: str) -> dict[str, Any]:
    async with http.post(f"http://{ip}:8888/execute", data=orjson.dumps({"command": command})) as resp:
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body


async def test_sandbox_with_the_runtime_image_executes_on_both_protocols(
    kube: ApiClient, namespace: str, controller: Started, cluster: DevCluster, http: aiohttp.ClientSession
) -> None:
    spec = runtime_pod_spec(
        env=[{"name": "SANDBOX_GREETING", "value": "hello"}, {"name": "API_TOKEN", "value": "x"}]
    )
    await kube.create(SANDBOX, sandbox("sb", spec), namespace=namespace)
    ip = await ready_sandbox_ip(kube, namespace, "sb")
    assert ip.startswith("127.")
    assert await execute(http, ip, "echo hi") == {
        "stdout": "hi\n",
        "stderr": "",
        "exit_code": 0,
        "timed_out": False,
        "truncated": False,
    }
    assert (await execute(http, ip, "sh -c 'echo $SANDBOX_GREETING'"))["stdout"] == "hello\n"
    async with http.get(f"http://{ip}:8080/v1/metadata") as resp:
        assert await resp.json() == {"env": {"SANDBOX_GREETING": "hello"}}

    async with aio.insecure_channel(f"{ip}:9090") as channel:
        client = ProcessClient(channel)
        resp = await client.execute("/bin/sh", "-c", "echo hi")
        assert (resp.exit_code, resp.stdout) == (0, b"hi\n")
        call = client.start("/bin/sh", "-c", "echo one; echo two >&2; exit 3")
        events = [e async for e in client.events(call)]
        assert [e.WhichOneof("event") for e in (events[0], events[-1])] == ["init", "exit"]
        assert events[-1].exit.exit_code == 3
        assert b"".join(e.stdout for e in events) == b"one\n"
        assert b"".join(e.stderr for e in events) == b"two\n"
        # a PTY, resized while the shell runs
        call = client.start("/bin/sh", pty=(80, 24))
        it = client.events(call)
        pid = (await anext(it)).init.process_id
        await client.resize_call(pb.ResizeTTYRequest(process_id=pid, cols=132, rows=43), timeout=10)
        await client.write_stdin_call(
            pb.WriteStdinRequest(process_id=pid, input=b"stty size; exit 0\n"), timeout=10
        )
        out = b"".join([e.stdout async for e in it])
        assert b"43 132" in out

    mine = [r for r in cluster.runtimes() if r["namespace"] == namespace]
    assert [(r["ip"], r["state"], r["ready"], r["claim"]) for r in mine] == [(ip, "ready", True, None)]


async def test_the_environment_is_built_as_a_kubelet_builds_it(
    kube: ApiClient, namespace: str, controller: Started, http: aiohttp.ClientSession
) -> None:
    """An empty value (stored by the API server without `value`) is set, `$(A)` expanded, a label `fieldRef`
    resolved (devcluster/pod_env.py); until December 7 the runner dropped, kept literally and dropped them."""
    spec = runtime_pod_spec(
        env=[
            {"name": "A", "value": "alpha"},
            {"name": "B", "value": "$(A)-beta-$$(A)"},
            {"name": "E", "value": ""},
            {"name": "LBL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['x']"}}},
        ]
    )
    await kube.create(SANDBOX, sandbox("envexp", spec), namespace=namespace)
    ip = await ready_sandbox_ip(kube, namespace, "envexp")
    out = await execute(http, ip, "sh -c 'echo \"A=$A B=$B E=${E+set:$E} LBL=${LBL+set:$LBL}\"'")
    assert out["stdout"] == "A=alpha B=alpha-beta-$(A) E=set: LBL=set:\n", out


async def test_files_through_both_apis(
    kube: ApiClient, namespace: str, controller: Started, http: aiohttp.ClientSession
) -> None:
    await kube.create(SANDBOX, sandbox("files"), namespace=namespace)
    ip = await ready_sandbox_ip(kube, namespace, "files")
    # legacy: upload, download, list, exists, delete (extension)
    form = aiohttp.FormData(quote_fields=False)
    form.add_field("file", b"legacy bytes", filename="dir/a.txt")
    async with http.post(f"http://{ip}:8888/upload", data=form) as resp:
        assert resp.status == 200
    async with http.get(yarl.URL(f"http://{ip}:8888/download/dir%2Fa.txt", encoded=True)) as resp:
        assert await resp.read() == b"legacy bytes"
    async with http.get(f"http://{ip}:8888/list/dir") as resp:
        assert [e["name"] for e in await resp.json()] == ["a.txt"]
    async with http.get(yarl.URL(f"http://{ip}:8888/exists/dir%2Fa.txt", encoded=True)) as resp:
        assert (await resp.json())["exists"] is True
    # sandboxd REST sees the same workspace
    async with http.get(yarl.URL(f"http://{ip}:8080/v1/files/dir%2Fa.txt", encoded=True)) as resp:
        assert await resp.read() == b"legacy bytes"
    async with http.put(
        yarl.URL(f"http://{ip}:8080/v1/files/dir%2Fb.txt", encoded=True), data=b"rest bytes"
    ) as resp:
        assert resp.status == 204
    async with http.get(f"http://{ip}:8080/v1/files/dir") as resp:
        assert [e["name"] for e in (await resp.json())["entries"]] == ["a.txt", "b.txt"]
    async with http.head(f"http://{ip}:8080/v1/files/dir/b.txt") as resp:
        assert resp.status == 200
    async with http.delete(f"http://{ip}:8080/v1/files/dir/b.txt") as resp:
        assert resp.status == 204
    async with http.delete(f"http://{ip}:8888/files/dir?recursive=true") as resp:
        assert resp.status == 200
    async with http.head(f"http://{ip}:8080/v1/files/dir") as resp:
        assert resp.status == 404


async def test_pvc_workspace_survives_suspend_and_resume(
    kube: ApiClient, namespace: str, controller: Started, cluster: DevCluster, http: aiohttp.ClientSession
) -> None:
    vct = [
        {
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }
    ]
    spec = runtime_pod_spec(volumeMounts=[{"name": "data", "mountPath": "/workspace"}])
    await kube.create(SANDBOX, sandbox("keep", spec, volumeClaimTemplates=vct), namespace=namespace)
    ip = await ready_sandbox_ip(kube, namespace, "keep")
    first_pod = {(r["pod"], r["uid"]) for r in cluster.runtimes() if r["namespace"] == namespace}
    async with http.put(f"http://{ip}:8080/v1/files/notes/keep.txt", data=b"survives") as resp:
        assert resp.status == 204
    # the file lives in the PV's directory, not in a per-pod one
    volume = cluster.volume_path(namespace, "data-keep")
    assert volume is not None
    assert (volume / "notes" / "keep.txt").read_bytes() == b"survives"
    # sandboxd clients may spell paths with the root as the container sees it
    async with http.get(
        yarl.URL(f"http://{ip}:8080/v1/files/%2Fworkspace%2Fnotes%2Fkeep.txt", encoded=True)
    ) as resp:
        assert await resp.read() == b"survives"

    await kube.patch(SANDBOX, "keep", {"spec": {"operatingMode": "Suspended"}}, namespace=namespace)

    async def no_runtime() -> bool:
        return not any(r["namespace"] == namespace for r in cluster.runtimes())

    await eventually(no_runtime, "the suspended sandbox's runtime gone", within=60)
    await kube.patch(SANDBOX, "keep", {"spec": {"operatingMode": "Running"}}, namespace=namespace)
    ip = await ready_sandbox_ip(kube, namespace, "keep")
    second_pod = {(r["pod"], r["uid"]) for r in cluster.runtimes() if r["namespace"] == namespace}
    assert second_pod
    assert second_pod.isdisjoint(first_pod)  # a new pod and a new runtime
    async with http.get(f"http://{ip}:8080/v1/files/notes/keep.txt") as resp:
        assert await resp.read() == b"survives"
    assert (await execute(http, ip, "cat notes/keep.txt"))["stdout"] == "survives"


async def test_the_warmpool_quickstart_pvc_at_app_keeps_files_over_suspend_and_resume(
    kube: ApiClient, namespace: str, controller: Started, cluster: DevCluster, http: aiohttp.ClientSession
) -> None:
    """The quickstart's template (upstream's `sandbox-runtime` image, its `workspace` PVC at `/app`): the
    runner served that image from our runtime's `/workspace`, so the PVC was never the workspace and a file
    written through the runtime was gone after suspend/resume. Upstream's image serves `/app`."""
    example = Path(__file__).resolve().parents[3] / "examples" / "warmpool-quickstart"
    template = yaml.safe_load((example / "sandboxtemplate.yaml").read_text())["spec"]
    qs = sandbox("qs", template["podTemplate"]["spec"], volumeClaimTemplates=template["volumeClaimTemplates"])
    await kube.create(SANDBOX, qs, namespace=namespace)
    ip = await ready_sandbox_ip(kube, namespace, "qs")
    form = aiohttp.FormData()
    form.add_field("file", b"kept", filename="notes.txt")
    async with http.post(f"http://{ip}:8888/upload", data=form) as resp:
        assert resp.status == 200
    volume = cluster.volume_path(namespace, "workspace-qs")
    assert volume is not None
    assert (volume / "notes.txt").read_bytes() == b"kept"  # on the PV, not in a per-pod directory

    await kube.patch(SANDBOX, "qs", {"spec": {"operatingMode": "Suspended"}}, namespace=namespace)

    async def no_runtime() -> bool:
        return not any(r["namespace"] == namespace for r in cluster.runtimes())

    await eventually(no_runtime, "the suspended sandbox's runtime gone", within=60)
    await kube.patch(SANDBOX, "qs", {"spec": {"operatingMode": "Running"}}, namespace=namespace)
    ip = await ready_sandbox_ip(kube, namespace, "qs")
    async with http.get(f"http://{ip}:8888/download/notes.txt") as resp:
        assert resp.status == 200
        assert await resp.read() == b"kept"


async def test_warm_pool_of_50_runs_commands_concurrently_and_a_crashed_runtime_comes_back(
    kube: ApiClient, namespace: str, controller: Started, cluster: DevCluster, http: aiohttp.ClientSession
) -> None:
    await create_runtime_pool(kube, namespace, replicas=50)

    async def ready_ips() -> list[str] | None:
        members = [m for m in await kube.list(SANDBOX, namespace=namespace) if _ready(m)]
        ips = [m["status"]["podIPs"][0] for m in members if (m.get("status") or {}).get("podIPs")]
        return ips if len(ips) >= 50 else None

    ips = await eventually(ready_ips, "50 Ready warm-pool sandboxes", within=180)
    started = time.monotonic()
    results = await asyncio.gather(*(execute(http, ip, f"sh -c 'sleep 0.5; echo {ip}'") for ip in ips))
    assert [r["stdout"] for r in results] == [f"{ip}\n" for ip in ips]
    assert time.monotonic() - started < 30  # concurrently: 50 x 0.5 s would be 25 s serially

    # kill one runtime: its pod turns NotReady, counts a restart, and answers again
    victim = next(r for r in cluster.runtimes() if r["namespace"] == namespace and r["ip"] == ips[0])
    cluster.crash_runtime(namespace, victim["pod"])

    async def pod_ready_state() -> tuple[str | None, int]:
        pod = await kube.get(POD, victim["pod"], namespace=namespace)
        ready = next((c["status"] for c in pod["status"]["conditions"] if c["type"] == "Ready"), None)
        return ready, pod["status"]["containerStatuses"][0].get("restartCount", 0)

    async def not_ready() -> bool:
        return (await pod_ready_state())[0] == "False"

    async def ready_again() -> bool:
        return (await pod_ready_state()) == ("True", 1)

    await eventually(not_ready, "crashed runtime's pod NotReady", within=10, interval=0.05)
    await eventually(ready_again, "crashed runtime's pod Ready again with restartCount 1", within=30)
    assert (await execute(http, ips[0], "echo back"))["stdout"] == "back\n"


async def test_other_pods_are_left_to_kwok(kube: ApiClient, namespace: str, cluster: DevCluster) -> None:
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    opted_out = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "opted-out", "annotations": {"devcluster.agents.x-k8s.io/runtime": "false"}},
        "spec": runtime_pod_spec(),
    }
    for pod in (plain, opted_out):
        await kube.create(POD, pod, namespace=namespace)
    for name in ("plain", "opted-out"):
        await eventually(lambda n=name: _pod_ready(kube, namespace, n), f"{name} Ready by kwok alone")  # type: ignore[misc]
    assert not [r for r in cluster.runtimes() if r["namespace"] == namespace]


async def _pod_ready(kube: ApiClient, ns: str, name: str) -> bool:
    return _ready(await _get(kube, POD, name, ns))


async def test_deleting_a_pod_stops_its_commands_and_removes_its_workspace(
    kube: ApiClient, namespace: str, cluster: DevCluster, http: aiohttp.ClientSession
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "opted-in", "annotations": {"devcluster.agents.x-k8s.io/runtime": "true"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    created = await kube.create(POD, pod, namespace=namespace)
    await eventually(lambda: _pod_ready(kube, namespace, "opted-in"), "opted-in pod Ready via the runner")
    rt = next(r for r in cluster.runtimes() if r["namespace"] == namespace)
    assert rt["uid"] == created["metadata"]["uid"]
    workspace = Path(rt["workspace"])
    assert workspace.is_dir()
    assert workspace.is_relative_to(cluster.workspaces)
    body = orjson.dumps({"command": "sh -c 'echo up; sleep 300'"})
    async with http.post(f"http://{rt['ip']}:8888/execute/stream", data=body) as resp:
        lines = resp.content.__aiter__()
        await anext(lines)
        assert orjson.loads(await anext(lines))["data"] == "up\n"
        await kube.delete(POD, "opted-in", namespace=namespace)
        rest = [orjson.loads(line) async for line in lines]
    assert rest[-1]["type"] == "exit"
    assert rest[-1]["exit_code"] < 0  # the command was signalled when its pod terminated

    async def gone() -> bool:
        return not workspace.exists() and not [r for r in cluster.runtimes() if r["namespace"] == namespace]

    await eventually(gone, "runtime and per-pod workspace removed with the pod", within=30)
    with pytest.raises(aiohttp.ClientConnectionError):
        async with http.get(f"http://{rt['ip']}:8888/"):
            pass

    # the same name again: a new pod (new UID) gets a new runtime and a fresh workspace
    again = await kube.create(POD, pod, namespace=namespace)
    await eventually(lambda: _pod_ready(kube, namespace, "opted-in"), "recreated pod Ready via the runner")
    rt2 = next(r for r in cluster.runtimes() if r["namespace"] == namespace)
    assert rt2["uid"] == again["metadata"]["uid"] != rt["uid"]
    assert os.listdir(rt2["workspace"]) == []


async def test_a_bad_cwd_or_escape_is_refused_through_the_pod_ip(
    kube: ApiClient, namespace: str, controller: Started, http: aiohttp.ClientSession
) -> None:
    await kube.create(SANDBOX, sandbox("safe"), namespace=namespace)
    ip = await ready_sandbox_ip(kube, namespace, "safe")
    async with http.get(
        yarl.URL(f"http://{ip}:8888/download/..%2F..%2F..%2Fkubeconfig", encoded=True)
    ) as resp:
        assert resp.status == 403
    async with aio.insecure_channel(f"{ip}:9090") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ProcessClient(channel).execute("pwd", cwd="../../..")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_the_python_runtime_example_runs_as_its_readme_says(
    kube: ApiClient, namespace: str, controller: Started, cluster: DevCluster, http: aiohttp.ClientSession
) -> None:
    """examples/python-runtime-sandbox uses upstream's example image name `sandbox-runtime:latest`; the
    runner did not know it, so the Pod was Ready with nothing listening and the README's curls failed."""
    example = (
        Path(__file__).resolve().parents[3] / "examples" / "python-runtime-sandbox" / "sandbox-python.yaml"
    )
    cluster.kubectl("apply", "-n", namespace, "-f", str(example), check=True)
    ip = await ready_sandbox_ip(kube, namespace, "sandbox-python-example")
    assert (await execute(http, ip, "echo hi"))["stdout"] == "hi\n"
