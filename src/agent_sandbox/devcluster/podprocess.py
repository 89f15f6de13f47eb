"""A stand-in kubelet for the project's own installed pods (controller, router): run them as host processes.

kwok runs no containers, so an installed controller Deployment gets a Running, Ready pod with a 127.x IP
and nothing behind it. `PodProcesses.sync` starts, for each such pod, the program its image would run (the
image's entry point is one of our console scripts, `PROGRAMS`) with the pod's own arguments and
environment, translated the way a container runtime would place them:

* the pod's network namespace is its 127.x IP: every ``--*-address=:PORT`` (or ``0.0.0.0:PORT``) argument
  binds ``<pod IP>:PORT``, a listener left at its default (which binds every interface) is passed
  explicitly with the pod IP, any other bind address is refused, and the controller's webhook binds the
  pod IP (``AGENT_SANDBOX_WEBHOOK_HOST``);
* the ServiceAccount token volume is a TokenRequest bound to the pod, written into a kubeconfig whose
  server is the loopback API server (in-cluster config would dial the ClusterIP of ``kubernetes.default``,
  which nothing here may reach); the namespace file it would also hold becomes
  ``--leader-election-namespace=<pod namespace>`` (what in-cluster auto-detection yields);
* the pod's ``/tmp`` emptyDir is a per-pod directory (the webhook certificate directory lives there).

A pod that is deleted, or gone, has its process stopped (SIGTERM, as the kubelet does). `ready` runs the
pod's readinessProbe (HTTP GET on the resolved container port) against the process, as the kubelet would.
The environment is the container's as a kubelet builds it (pod_env.py: `envFrom`, Secret and ConfigMap
references read from the API server), and `$(VAR)` in its `args` is expanded with it.
Not reproduced: image contents (the program comes from this checkout's virtualenv), the ConfigMap volume
(``/etc/sandbox-config``), resource limits, securityContext enforcement, restarts after a crash.

`kubectl port-forward` to such a pod reaches its process: a kwok `PortForward` object (kubelet_api.py) forwards
each declared container port to the pod IP.
"""

from __future__ import annotations

import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_sandbox.devcluster import processes
from agent_sandbox.devcluster.cluster import DevCluster
from agent_sandbox.devcluster.install import token_kubeconfig
from agent_sandbox.devcluster.kubelet_api import PORT_FORWARD, port_forward_object
from agent_sandbox.devcluster.pod_env import (
    ContainerConfigError,
    EnvSources,
    container_env,
    expand_command,
    references,
)
from agent_sandbox.devcluster.processes import Started

__all__ = ["PROGRAMS", "PodProcesses", "Program", "pod_argv", "probe_port", "program_for"]

Pod = Mapping[str, Any]

_BIND = re.compile(r"^(--[a-z-]*address=)(?:0\.0\.0\.0)?(:\d+)$")


@dataclass(frozen=True, slots=True)
class Program:
    """What an image runs: its console script, its listeners' flags with their default ports (the defaults
    bind every interface, so each is always passed explicitly with the pod IP), and the in-pod facts it
    would read from the filesystem."""

    script: str
    listeners: tuple[tuple[str, int], ...] = ()
    extra_args: Callable[[Pod, Path], list[str]] = lambda pod, workdir: []
    extra_env: Callable[[Pod], dict[str, str]] = lambda pod: {}


def _controller_args(pod: Pod, workdir: Path) -> list[str]:
    return [
        f"--leader-election-namespace={pod['metadata']['namespace']}",
        f"--webhook-cert-dir={workdir / 'tmp' / 'k8s-webhook-server' / 'serving-certs'}",
    ]


#: Image name (last path element, no tag) -> the program it runs.
PROGRAMS: dict[str, Program] = {
    "agent-sandbox-controller": Program(
        "agent-sandbox-controller",
        listeners=(("--metrics-bind-address", 8080), ("--health-probe-bind-address", 8081)),
        extra_args=_controller_args,
        extra_env=lambda pod: {"AGENT_SANDBOX_WEBHOOK_HOST": pod["status"]["podIP"]},
    ),
    "sandbox-router": Program(
        "agent-sandbox-router",
        listeners=(
            ("--http-bind-address", 8080),
            ("--metrics-bind-address", 9090),
            ("--health-probe-bind-address", 8081),
        ),
        # Pod IPs are 127.x here (each pod's "network namespace" is a loopback address), so the router's
        # refusal of loopback targets (an SSRF guard on a real cluster) would refuse every sandbox.
        extra_args=lambda pod, workdir: ["--allow-loopback-pod-ip"],
    ),
}


def program_for(image: str) -> Program | None:
    """The program an image runs (``ko://.../agent-sandbox-controller``, ``reg/x/sandbox-router:v1``)."""
    name = image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    return PROGRAMS.get(name)


def pod_argv(
    pod: Pod,
    program: Program,
    *,
    kubeconfig: Path,
    workdir: Path,
    bin_dir: Path,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The host command line for the pod's first container (pure); `$(VAR)` in its args expanded with `env`,
    the container's environment (`container_env`), as a kubelet expands them.

    Raises:
        ValueError: a listener would bind outside 127.0.0.0/8 (an explicit non-loopback address).
    """
    ip = pod["status"]["podIP"]
    container = pod["spec"]["containers"][0]
    _, expanded = expand_command(container, env or {})
    args = [_BIND.sub(lambda m: f"{m.group(1)}{ip}{m.group(2)}", a) for a in expanded]
    given = {a.split("=", 1)[0] for a in args}
    defaults = [f"{flag}={ip}:{port}" for flag, port in program.listeners if flag not in given]
    extra = [a for a in program.extra_args(pod, workdir) if a.split("=", 1)[0] not in given]
    for arg in (*args, *defaults):
        flag, _, value = arg.partition("=")
        if flag.endswith("-address") and value and value != "0":
            host = value.rpartition(":")[0].strip("[]")
            if not host.startswith("127."):
                raise ValueError(f"{arg}: the dev cluster only binds 127.0.0.0/8 (pod IP {ip})")
    return [str(bin_dir / program.script), *args, *defaults, *extra, f"--kubeconfig={kubeconfig}"]


def probe_port(pod: Pod, port: int | str) -> int | None:
    """A probe's port as a number (a name is looked up in the container ports)."""
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    for container in pod["spec"]["containers"]:
        for p in container.get("ports") or ():
            if p.get("name") == port:
                return int(p["containerPort"])
    return None


def _running(pod: Pod) -> bool:
    return (
        (pod.get("status") or {}).get("phase") == "Running"
        and bool(pod["status"].get("podIP"))
        and not pod["metadata"].get("deletionTimestamp")
    )


@dataclass
class PodProcesses:
    """The processes of one cluster's installed pods, keyed by pod UID."""

    cluster: DevCluster
    bin_dir: Path = field(default_factory=lambda: Path(sys.executable).parent)
    started: dict[str, Started] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)

    def _list(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        query = ",".join(f"{k}={v}" for k, v in selector.items())
        status, body = self.cluster.admin().request(
            "GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={urllib.parse.quote(query)}"
        )
        if status != 200:
            raise RuntimeError(f"listing pods {query} in {namespace}: HTTP {status}: {body}")
        items: list[dict[str, Any]] = body["items"]
        return items

    def sync(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        """Start processes for new Running pods, stop those whose pods are deleting or gone; returns the pods."""
        pods = self._list(namespace, selector)
        live = {p["metadata"]["uid"]: p for p in pods if _running(p)}
        for uid, pod in list(self.pods.items()):
            meta = pod["metadata"]
            labels = meta.get("labels") or {}
            selected = meta["namespace"] == namespace and all(labels.get(k) == v for k, v in selector.items())
            if selected and uid not in live:
                self.stop(uid)
        for uid, pod in live.items():
            if uid not in self.started:
                self._start(pod)
        return pods

    def _start(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        image = pod["spec"]["containers"][0]["image"]
        program = program_for(image)
        if program is None:
            raise ValueError(f"pod {meta['namespace']}/{meta['name']}: no program known for image {image!r}")
        workdir = self.cluster.directory / "pods" / f"{meta['namespace']}_{meta['name']}"
        (workdir / "tmp").mkdir(parents=True, exist_ok=True)
        kubeconfig = token_kubeconfig(
            self.cluster,
            meta["namespace"],
            pod["spec"].get("serviceAccountName") or "default",
            workdir / "kubeconfig",
            pod=pod,
        )
        try:  # as a kubelet builds it (pod_env.py)
            env = container_env(pod, pod["spec"]["containers"][0], self._env_sources(pod))
        except ContainerConfigError as err:  # the kubelet's CreateContainerConfigError: not started
            raise ValueError(f"pod {meta['namespace']}/{meta['name']}: {err}") from err
        argv = pod_argv(pod, program, kubeconfig=kubeconfig, workdir=workdir, bin_dir=self.bin_dir, env=env)
        env.update(program.extra_env(pod))
        self.started[meta["uid"]] = self.cluster.add_process(
            f"pod-{meta['namespace']}-{meta['name']}", argv, env=env
        )
        self.pods[meta["uid"]] = pod
        self._forward_ports(pod)

    def _env_sources(self, pod: Pod) -> EnvSources:
        """The ConfigMaps, Secrets and node allocatable the pod's container reads (None: not found)."""
        refs = references(pod["spec"]["containers"][0])
        namespace = pod["metadata"]["namespace"]

        def get(path: str) -> dict[str, Any] | None:
            status, body = self.cluster.admin().request("GET", path)
            if status == 404:
                return None
            if status != 200:
                raise RuntimeError(f"GET {path}: HTTP {status}: {body}")
            obj: dict[str, Any] = body
            return obj

        def named(resource: str, names: frozenset[str]) -> dict[str, Any]:
            quote = urllib.parse.quote
            return {n: get(f"/api/v1/namespaces/{namespace}/{resource}/{quote(n, safe='')}") for n in names}

        node_name = pod["spec"].get("nodeName")
        node = (
            get(f"/api/v1/nodes/{urllib.parse.quote(node_name, safe='')}")
            if refs.node and node_name
            else None
        )
        return EnvSources(
            config_maps=named("configmaps", refs.config_maps),
            secrets=named("secrets", refs.secrets),
            allocatable=((node or {}).get("status") or {}).get("allocatable") or {},
        )

    def _forward_ports(self, pod: dict[str, Any]) -> None:
        """`kubectl port-forward` to the pod (e.g. `svc/sandbox-router-svc`, upstream SDK's default tunnel)
        reaches its process: kwok forwards each declared container port to that port on the pod IP."""
        meta = pod["metadata"]
        ports = [p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports") or ()]
        if not ports:
            return
        obj = port_forward_object(pod, pod["status"]["podIP"], ports)
        status, body = self.cluster.admin().request("POST", PORT_FORWARD.path(meta["namespace"]), obj)
        if status not in (201, 409):  # 409: this pod's, from an earlier sync
            raise RuntimeError(f"PortForward for pod {meta['name']}: HTTP {status}: {body}")

    def stop(self, uid: str) -> None:
        """Stop the process of pod `uid` (SIGTERM, then SIGKILL after the bound)."""
        started = self.started.pop(uid)
        self.pods.pop(uid, None)
        processes.stop(started)

    def stop_all(self) -> None:
        for uid in list(self.started):
            self.stop(uid)

    def alive(self, uid: str) -> bool:
        started = self.started.get(uid)
        return started is not None and processes.is_ours(started.pid, started.exe)

    def ready(self, uid: str) -> bool:
        """The pod's readinessProbe (HTTP GET) answered 200 by its process."""
        pod = self.pods[uid]
        probe = (pod["spec"]["containers"][0].get("readinessProbe") or {}).get("httpGet")
        if probe is None:
            return self.alive(uid)
        port = probe_port(pod, probe["port"])
        url = (
            f"{probe.get('scheme', 'HTTP').lower()}://{pod['status']['podIP']}:{port}{probe.get('path', '/')}"
        )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def log(self, uid: str) -> Path:
        return self.started[uid].log
