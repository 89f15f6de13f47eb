"""The dev cluster's local runner: makes runtime pods really execute (docs/devcluster.md "Local runner").

kwok pods run nothing. For each runtime pod (`runtime_pods.is_runtime_pod`) that kwok has started (Running,
with a 127.x pod IP, held not Ready by the `pod-start-held` stage), this one process serves an
`agent_sandbox.runtime.RuntimeServer` bound to the pod IP, with the pod's PVC directory (or a per-pod
directory) as workspace, then sets the pod Ready once the runtime answers its health check. When the pod
terminates the runtime is drained (SIGTERM to its commands, SIGKILL after the grace); a per-pod workspace is
removed with the pod; a recreated pod (new UID) gets a new runtime. A simulated crash
(`POST /runtimes/<ns>/<pod>/crash` on the control port, `DevCluster.crash_runtime`) makes the pod NotReady,
counts a restart, and brings the runtime back after a short back-off, as a kubelet restarting a container.

All pods share one event loop; an idle runtime pod costs about 50 KB (two aiohttp apps, one grpc.aio server,
three listening sockets), so 1,000 of them fit where 1,000 Python processes would not. Commands are real
child processes, each confined to its pod's workspace by path rules only: there is no isolation.

Stop (`dev down`, SIGTERM or Ctrl-C): every runtime drains (`_STOP_GRACE`), then the process exits. A
second signal meanwhile exits at once, as the runtime's own process does: every command of every runtime is
SIGKILLed first, so none outlives the runner.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from agent_sandbox.devcluster.kubelet_api import (
    LOGS,
    PORT_FORWARD,
    ContainerLog,
    RoutingHandler,
    logs_object,
    port_forward_object,
)
from agent_sandbox.devcluster.pod_env import ContainerConfigError, EnvSources, references
from agent_sandbox.devcluster.pod_runtime import PodRuntime, logging_to, project_claim_env, runtime_ports
from agent_sandbox.devcluster.pod_status import config_error_patch, now, ready_condition, ready_patch
from agent_sandbox.devcluster.provisioner import PV, volume_host_path
from agent_sandbox.devcluster.runtime_pods import is_runtime_pod, runtime_container, runtime_pod
from agent_sandbox.interrupts import handle_stop_signals
from agent_sandbox.kube import (
    CONFIG_MAP,
    NODE,
    POD,
    PVC,
    SECRET,
    ApiClient,
    EventBroadcaster,
    HandlerFuncs,
    Informer,
    NotFound,
    Object,
    PatchType,
    ResourceKind,
)
from agent_sandbox.runtime import RuntimeServer
from agent_sandbox.runtime.main import LOG_FORMAT

__all__ = ["Runner", "main"]

log = logging.getLogger("agent_sandbox.devcluster.runner")

_RESTART_BACKOFF = 1.0  # seconds before a crashed runtime comes back
_RETRY = 2.0  # seconds before retrying a runtime that could not start (port taken, volume unbound)
_HEALTH_TIMEOUT = 5.0
_MAX_GRACE = 10.0
_STOP_GRACE = 3.0
"""Drain of every runtime when the runner stops: the runtime SIGKILLs commands still running 2 s after their
SIGTERM; the third second lets their requests be answered (with 1 s they were reset, the kill and the
listeners' deadline coming at once)."""
_CONCURRENCY = 32  # reconciles at once (bursts of hundreds of pods)


class Runner:
    """Serve every runtime pod of one cluster; `await run()` until cancelled."""

    def __init__(
        self,
        client: ApiClient,
        directory: Path,
        *,
        base_env: Mapping[str, str],
        pod_logs: Path | None = None,
    ) -> None:
        self.client = client
        self.directory = directory  # per-pod workspaces live in <directory>/<namespace>/<pod>-<uid>
        self.pod_logs = pod_logs  # container logs live in <pod_logs>/<namespace>_<pod>_<uid>/<container>/
        self.base_env = dict(base_env)
        self.pods = Informer(client, POD)
        self.runtimes: dict[str, PodRuntime] = {}
        self._dirty: set[str] = set()
        self._active: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._limit = asyncio.Semaphore(_CONCURRENCY)
        self._http: aiohttp.ClientSession | None = None
        # Every runtime started and not yet stopped, also one a terminating pod is still draining (its
        # PodRuntime no longer holds it): `kill_children` must reach all of their commands.
        self._servers: set[RuntimeServer] = set()
        # Pods whose container cannot start (CreateContainerConfigError): key -> (pod UID, message reported),
        # so a retry that fails the same way neither patches the pod nor records an Event again.
        self._config_errors: dict[str, tuple[str, str]] = {}
        self._events = EventBroadcaster(client, instance="devcluster-runner")
        self._kubelet = self._events.recorder("kubelet")
        self.pods.add_handler(
            HandlerFuncs(add=self._on_pod, update=lambda _old, new: self._on_pod(new), delete=self._on_pod)
        )

    # -- scheduling ---------------------------------------------------------------------------------------
    def _on_pod(self, pod: Object) -> None:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if key in self.runtimes or is_runtime_pod(pod):
            self.schedule(key)

    def schedule(self, key: str, delay: float = 0.0) -> None:
        """Reconcile `key` soon (coalesced; never two reconciles of one pod at once)."""
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, self.schedule, key)
            return
        self._dirty.add(key)
        if key not in self._active:
            self._active[key] = asyncio.create_task(self._drive(key))

    async def _drive(self, key: str) -> None:
        try:
            while key in self._dirty:
                self._dirty.discard(key)
                async with self._limit:
                    try:
                        await self._reconcile(key)
                    except Exception:
                        log.exception("reconciling %s failed; retrying", key)
                        self.schedule(key, _RETRY)
        finally:
            self._active.pop(key, None)

    # -- reconcile ----------------------------------------------------------------------------------------
    async def _reconcile(self, key: str) -> None:
        pod = self.pods.get(key)
        rt = self.runtimes.get(key)
        uid = (pod or {}).get("metadata", {}).get("uid")
        if rt is not None and (pod is None or rt.uid != uid or not is_runtime_pod(pod)):
            await self._retire(key, rt, gone=pod is None or rt.uid != uid)
            rt = None
        if pod is None or not is_runtime_pod(pod):
            self._config_errors.pop(key, None)
            return
        meta, status = pod["metadata"], pod.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
            if rt is not None and rt.server is not None:
                grace = min(float(meta.get("deletionGracePeriodSeconds") or 1), _MAX_GRACE)
                rt.state, rt.healthy = "terminating", False
                server, rt.server = rt.server, None
                await self._stop_server(rt, server, grace)
            return
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not ip:
            return
        if rt is None:
            rt = await self._prepare(pod, key, ip)
            if rt is None:
                return
            # As early as the pod has an IP, well before Ready: kwok learns it through a watch, and clients
            # port-forward as soon as they see the pod Ready (a real kubelet serves it from the start).
            await self._publish(rt, PORT_FORWARD, port_forward_object(pod, ip, runtime_ports(rt)))
        if rt.claim_env_file is not None:
            await asyncio.to_thread(project_claim_env, rt.claim_env_file, pod)
        if rt.server is None:
            wait = rt.not_before - time.monotonic()
            if wait > 0:
                self.schedule(key, wait)
                return
            if rt.restarts and not await self._rebuild_env(pod, key, rt):
                return
            await self._start(rt, key, pod)
        await self._sync_ready(pod, rt)

    async def _prepare(self, pod: Object, key: str, ip: str) -> PodRuntime | None:
        meta = pod["metadata"]
        try:
            # Read at the container's start, as a kubelet does (a Secret changed later is seen at the
            # container's next start - `_rebuild_env` after a crash - not by the running runtime).
            spec = runtime_pod(pod, base_env=self.base_env, sources=await self._env_sources(pod))
        except ContainerConfigError as err:
            await self._report_config_error(pod, key, str(err))
            self.schedule(key, _RETRY)  # the kubelet retries too: the Secret may be created later
            return None
        self._config_errors.pop(key, None)
        for problem in spec.problems:
            log.warning("%s: %s", key, problem)
        if spec.claim:
            host = await self._claim_directory(meta["namespace"], spec.claim)
            if host is None:
                log.info("%s: volume of claim %s not bound yet", key, spec.claim)
                self.schedule(key, _RETRY)
                return None
            workspace, owned = host / spec.sub_path if spec.sub_path else host, False
        else:
            workspace, owned = self.directory / meta["namespace"] / f"{meta['name']}-{meta['uid'][:8]}", True
        rt = PodRuntime(meta["namespace"], meta["name"], meta["uid"], ip, spec, workspace, owned)
        if spec.claim_env:
            rt.claim_env_file = self.directory / ".downward" / meta["namespace"] / meta["uid"] / "claim-env"
        if self.pod_logs is not None:
            rt.log = ContainerLog(self.pod_logs, meta["namespace"], meta["name"], meta["uid"], spec.container)
        self.runtimes[key] = rt
        return rt

    async def _rebuild_env(self, pod: Object, key: str, rt: PodRuntime) -> bool:
        """Build a restarting container's environment again, as a kubelet does at every container start: a
        ConfigMap or Secret changed since the last start is seen now (until December 7 the runner read them
        once per pod). False: it cannot be built now (reported as at the first start, retried)."""
        try:
            rt.spec = runtime_pod(pod, base_env=self.base_env, sources=await self._env_sources(pod))
        except ContainerConfigError as err:
            await self._report_config_error(pod, key, str(err))
            self.schedule(key, _RETRY)
            return False
        self._config_errors.pop(key, None)
        return True

    async def _env_sources(self, pod: Object) -> EnvSources:
        """The ConfigMaps, Secrets and node allocatable the runtime container's environment reads (None for
        one that does not exist; any other error propagates: the reconcile is retried)."""
        refs = references(runtime_container(pod))
        namespace = pod["metadata"]["namespace"]

        async def get(kind: ResourceKind, name: str) -> Object | None:
            try:
                return await self.client.get(kind, name, namespace=namespace)
            except NotFound:
                return None

        config_maps = {name: await get(CONFIG_MAP, name) for name in sorted(refs.config_maps)}
        secrets = {name: await get(SECRET, name) for name in sorted(refs.secrets)}
        allocatable: dict[str, Any] = {}
        node_name = (pod.get("spec") or {}).get("nodeName")
        if refs.node and node_name:
            with contextlib.suppress(NotFound):
                node = await self.client.get(NODE, node_name)
                allocatable = dict((node.get("status") or {}).get("allocatable") or {})
        return EnvSources(config_maps=config_maps, secrets=secrets, allocatable=allocatable)

    async def _report_config_error(self, pod: Object, key: str, message: str) -> None:
        """The container cannot start: show it as a kubelet does - its status waiting with reason
        `CreateContainerConfigError` and the message, the pod not Ready, a `Failed` Event - once per
        message (a retry failing alike changes nothing)."""
        reported = (str(pod["metadata"]["uid"]), message)
        if self._config_errors.get(key) == reported:
            return
        self._config_errors[key] = reported
        log.warning("%s: container cannot start: %s; retrying every %.0fs", key, message, _RETRY)
        container = str(runtime_container(pod).get("name", ""))
        patch = config_error_patch(pod, container=container, message=message)
        with contextlib.suppress(NotFound):
            await self.client.patch(
                POD,
                pod["metadata"]["name"],
                patch,
                namespace=pod["metadata"]["namespace"],
                subresource="status",
                patch_type=PatchType.STRATEGIC,
            )
        self._kubelet.event(
            {"apiVersion": "v1", "kind": "Pod", **pod}, "Warning", "Failed", "Start", f"Error: {message}"
        )

    async def _claim_directory(self, namespace: str, claim: str) -> Path | None:
        try:
            pvc = await self.client.get(PVC, claim, namespace=namespace)
            volume = (pvc.get("spec") or {}).get("volumeName")
            if not volume:
                return None
            path = volume_host_path(await self.client.get(PV, volume))
        except NotFound:
            return None
        return Path(path) if path else None

    async def _start(self, rt: PodRuntime, key: str, pod: Object) -> None:
        config = replace(
            rt.spec.config,
            root_dir=rt.workspace,
            client_root=str(rt.spec.config.root_dir),
            listen_host=rt.ip,
            command_env=rt.spec.env,
            # Never the container path on this host: only a projection the runner keeps current.
            claim_env_file=str(rt.claim_env_file or ""),
        )
        server = RuntimeServer(config)
        if rt.log is not None:  # this instance's file, before the runtime logs its start there
            try:
                await asyncio.to_thread(rt.log.start_instance, rt.restarts)
            except OSError as err:
                log.warning("%s: no container log (%s)", key, err)
                rt.log = None
        try:
            with logging_to(rt):  # and the Logs object naming this instance's file, applied before Ready
                await asyncio.gather(
                    server.start(), self._publish(rt, LOGS, logs_object(pod, rt.log) if rt.log else None)
                )
        except OSError as err:
            rt.state, rt.message = "failed", f"cannot listen on {rt.ip}: {err.strerror or err}"
            log.warning("%s: %s; retrying in %.0fs", key, rt.message, _RETRY)
            rt.not_before = time.monotonic() + _RETRY
            self.schedule(key, _RETRY)
            return
        self._servers.add(server)
        rt.server, rt.started_at, rt.message = server, now(), ""
        rt.healthy = await self._healthy(rt)
        rt.state = "ready" if rt.healthy else "unhealthy"
        if not rt.healthy:
            self.schedule(key, _RETRY)
        log.info("%s: runtime on %s (%s) in %s: %s", key, rt.ip, server.ports, rt.workspace, rt.state)

    async def _publish(self, rt: PodRuntime, kind: ResourceKind, obj: Object | None) -> None:
        """Apply one of the pod's kwok objects (its kubelet API, kubelet_api.py); None: nothing to apply.

        Never fails: a failure leaves the runtime serving, only `kubectl logs` / `port-forward` miss it (a
        warning says so).
        """
        if obj is None:
            return
        try:
            await self.client.patch(
                kind,
                rt.name,
                obj,
                namespace=rt.namespace,
                patch_type=PatchType.APPLY,
                field_manager="devcluster-runner",
                force=True,
            )
        except Exception as err:  # never the pod's readiness
            log.warning("%s/%s: cannot publish its %s: %s", rt.namespace, rt.name, kind.kind, err)

    async def _healthy(self, rt: PodRuntime) -> bool:
        """Ask the runtime over its pod IP, as a kubelet's probe would: sandboxd health and legacy GET /."""
        assert self._http is not None
        assert rt.server is not None
        try:
            for port, path in ((rt.server.ports["rest"], "/v1/health"), (rt.server.ports["legacy"], "/")):
                async with self._http.get(f"http://{rt.ip}:{port}{path}") as resp:
                    if resp.status != 200:
                        return False
        except (aiohttp.ClientError, TimeoutError):
            return False
        return True

    async def _sync_ready(self, pod: Object, rt: PodRuntime) -> None:
        want = "True" if rt.healthy and rt.server is not None else "False"
        if ready_condition(pod) == want and not (want == "False" and rt.state == "crashed"):
            return
        await self._patch_ready(pod, rt, want == "True")

    async def _patch_ready(self, pod: Object, rt: PodRuntime, ready: bool, *, crashed: bool = False) -> None:
        patch = ready_patch(
            pod,
            ready=ready,
            container=rt.spec.container,
            restarts=rt.restarts,
            started_at=rt.started_at,
            message=rt.message or f"runtime {rt.state}",
            crashed=crashed,
        )
        try:
            await self.client.patch(
                POD,
                rt.name,
                patch,
                namespace=rt.namespace,
                subresource="status",
                patch_type=PatchType.STRATEGIC,
            )
        except NotFound:
            return
        if crashed:
            rt.state = "restarting"

    async def _retire(self, key: str, rt: PodRuntime, *, gone: bool) -> None:
        if rt.server is not None:
            server, rt.server = rt.server, None
            await self._stop_server(rt, server, 1.0)
        if gone:
            self.runtimes.pop(key, None)
            if rt.owned_workspace:
                await asyncio.to_thread(shutil.rmtree, rt.workspace, True)
            if rt.claim_env_file is not None:
                await asyncio.to_thread(shutil.rmtree, rt.claim_env_file.parent, True)
            if rt.log is not None:  # its `Logs` object goes with the pod (owner reference)
                await asyncio.to_thread(rt.log.remove)
            log.info("%s: runtime of pod %s removed", key, rt.uid)

    # -- simulated crash ----------------------------------------------------------------------------------
    async def crash(self, key: str, noticed_after: float = 0.0, *, hard: bool = False) -> PodRuntime | None:
        """Kill a pod's runtime as if its container died: NotReady now (or once the kubelet would notice,
        `noticed_after` s later, the pod meanwhile Ready with nothing listening), restarted after a back-off.

        `hard`: as SIGKILL (connections reset, in-flight requests unanswered), not SIGTERM (answered)."""
        rt = self.runtimes.get(key)
        if rt is None or rt.server is None:
            return None
        server, rt.server = rt.server, None
        rt.healthy, rt.state, rt.restarts = False, "crashed", rt.restarts + 1
        rt.message = "runtime crashed; restarting"
        await self._stop_server(rt, server, 0.0, hard=hard)
        rt.not_before = time.monotonic() + noticed_after + _RESTART_BACKOFF
        if noticed_after > 0:
            task = asyncio.create_task(self._notice_crash(key, rt, noticed_after))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            await self._notice_crash(key, rt, 0.0)
        return rt

    async def _stop_server(
        self, rt: PodRuntime, server: RuntimeServer, grace: float, *, hard: bool = False
    ) -> None:
        """Drain `server` (`grace` s), or kill it as SIGKILL would (`hard`), logging to the pod's log."""
        with logging_to(rt):
            await (server.kill() if hard else server.stop(grace))
        self._servers.discard(server)

    def kill_children(self) -> None:
        """SIGKILL every command of every runtime, now: the process is about to exit without draining."""
        for server in list(self._servers):
            server.kill_children()

    async def _notice_crash(self, key: str, rt: PodRuntime, after: float) -> None:
        await asyncio.sleep(after)
        pod = self.pods.get(key)
        if pod is not None:
            await self._patch_ready(pod, rt, False, crashed=True)
        self.schedule(key, _RESTART_BACKOFF)

    # -- control port -------------------------------------------------------------------------------------
    def control_app(self) -> web.Application:
        async def runtimes(_request: web.Request) -> web.Response:
            return web.json_response([rt.describe() for rt in self.runtimes.values()])

        async def crash(request: web.Request) -> web.Response:
            key = f"{request.match_info['namespace']}/{request.match_info['pod']}"
            try:
                noticed_after = float(request.query.get("noticed-after", "0"))
            except ValueError:
                return web.json_response({"message": "noticed-after: not a number of seconds"}, status=400)
            rt = await self.crash(key, noticed_after, hard=request.query.get("hard") == "true")
            if rt is None:
                return web.json_response({"message": f"no running runtime for {key}"}, status=404)
            return web.json_response(rt.describe())

        async def healthz(_request: web.Request) -> web.Response:
            return web.json_response({"status": "ok", "runtimes": len(self.runtimes)})

        app = web.Application()
        app.router.add_get("/runtimes", runtimes)
        app.router.add_post("/runtimes/{namespace}/{pod}/crash", crash)
        app.router.add_get("/healthz", healthz)
        return app

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def _sweep_orphan_workspaces(self) -> None:
        """Per-pod workspaces and container logs whose pod no longer exists (deleted while the runner was down)."""
        metas = [p["metadata"] for p in self.pods.list()]
        live = {f"{m['namespace']}/{m['name']}-{m['uid'][:8]}" for m in metas}
        live_logs = {f"{m['namespace']}_{m['name']}_{m['uid']}" for m in metas}

        def sweep() -> None:
            if self.pod_logs is not None and self.pod_logs.is_dir():
                for entry in self.pod_logs.iterdir():
                    if entry.name not in live_logs:
                        shutil.rmtree(entry, ignore_errors=True)
            if not self.directory.is_dir():
                return
            for ns_dir in self.directory.iterdir():
                if ns_dir.name.startswith("."):  # .downward: claim env projections, kept per live pod UID
                    continue
                for entry in ns_dir.iterdir() if ns_dir.is_dir() else ():
                    if f"{ns_dir.name}/{entry.name}" not in live:
                        shutil.rmtree(entry, ignore_errors=True)

        await asyncio.to_thread(sweep)

    async def run(self, *, control_port: int, ready_file: Path | None = None) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_HEALTH_TIMEOUT))
        control = web.AppRunner(self.control_app(), access_log=None)
        await control.setup()
        await web.TCPSite(control, "127.0.0.1", control_port).start()
        informer = asyncio.create_task(self.pods.run())
        events = asyncio.create_task(self._events.start())
        try:
            await self.pods.wait_for_sync()
            await self._sweep_orphan_workspaces()
            if ready_file is not None:
                tmp = ready_file.with_suffix(".tmp")
                tmp.write_text(str(os.getpid()))
                tmp.replace(ready_file)
            log.info("ready: control port %d, workspaces under %s", control_port, self.directory)
            await informer
        finally:
            informer.cancel()
            events.cancel()
            for task in list(self._active.values()):
                task.cancel()
            await asyncio.gather(
                *(
                    self._stop_server(rt, rt.server, _STOP_GRACE)
                    for rt in self.runtimes.values()
                    if rt.server is not None
                ),
                return_exceptions=True,
            )
            await asyncio.gather(events, return_exceptions=True)  # its last writes (1 s at most)
            await control.cleanup()
            await self._http.close()


def _pod_log_handler() -> logging.Handler:
    handler = RoutingHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))  # the runtime's own format (runtime/main.py)
    return handler


async def _main(args: argparse.Namespace) -> None:
    client = await ApiClient.from_kubeconfig(args.kubeconfig, qps=-1.0, burst=200)
    pod_logs = Path(args.pod_logs) if args.pod_logs else None
    if pod_logs is not None:  # the runtime's records also go to the log file of the pod they serve
        logging.getLogger("agent_sandbox.runtime").addHandler(_pod_log_handler())
    runner = Runner(client, Path(args.workspaces), base_env=os.environ, pod_logs=pod_logs)
    task = asyncio.create_task(
        runner.run(
            control_port=args.control_port, ready_file=Path(args.ready_file) if args.ready_file else None
        )
    )

    # The first signal stops the runner (its task's `finally` drains every runtime); a second one must not
    # cancel that drain halfway - the control listener and HTTP session left open, asyncio errors in the log,
    # the process lingering - but exit at once, as the runtime's own process does.
    def first(name: str) -> None:
        log.info("received %s, stopping every runtime (a second signal exits at once)", name)
        task.cancel()

    def again(name: str) -> None:
        log.warning("received %s again: killing every command and exiting now", name)
        runner.kill_children()  # no orphans: nothing would stop them after the exit

    handle_stop_signals(first, again)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="devcluster-runner", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--workspaces", required=True, help="directory of the per-pod workspaces")
    parser.add_argument("--control-port", type=int, required=True, help="127.0.0.1 port of /runtimes")
    parser.add_argument("--ready-file", default="", help="written once the pod list is synced")
    parser.add_argument("--pod-logs", default="", help="directory of the runtime pods' container logs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format=LOG_FORMAT)
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
