"""The runtime pods' kubelet API the runner provides (devcluster/kubelet_api.py): CRI log lines, files per
instance, routing by context, the kwok objects."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from pathlib import Path
from typing import cast

import aiohttp
from aiohttp import web

from agent_sandbox.devcluster.kubelet_api import (
    ContainerLog,
    RoutingHandler,
    cri_line,
    logs_object,
    port_forward_object,
)
from agent_sandbox.devcluster.runner import Runner
from agent_sandbox.kube import ApiClient

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}}


def test_cri_line_is_one_full_line_per_line_of_text() -> None:
    at = dt.datetime(2026, 12, 3, 8, 1, 2, 345678, tzinfo=dt.UTC)
    assert cri_line("a\nb", now=at) == (
        "2026-12-03T08:01:02.345678Z stderr F a\n2026-12-03T08:01:02.345678Z stderr F b\n"
    )
    assert cri_line("", stream="stdout", now=at) == "2026-12-03T08:01:02.345678Z stdout F \n"


def test_files_per_instance_and_the_logs_object_names_the_previous_one(tmp_path: Path) -> None:
    log = ContainerLog(tmp_path, "ns", "p", "u-1", "runtime")
    log.start_instance(0)
    assert log.current == tmp_path / "ns_p_u-1" / "runtime" / "0.log"
    assert log.current.exists()
    first = logs_object(POD, log)
    assert first["metadata"] == {
        "name": "p",
        "namespace": "ns",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-1"}],
    }
    assert first["spec"] == {"logs": [{"containers": ["runtime"], "logsFile": str(log.current)}]}
    log.start_instance(1)
    assert logs_object(POD, log)["spec"]["logs"][0]["previousLogsFile"] == str(
        tmp_path / "ns_p_u-1/runtime/0.log"
    )
    log.remove()
    assert not (tmp_path / "ns_p_u-1").exists()


def test_each_runtime_port_is_forwarded_to_the_same_port_on_the_pod_ip() -> None:
    obj = port_forward_object(POD, "127.10.0.7", [8888, 8080, 9090, 8080])
    assert (obj["apiVersion"], obj["kind"]) == ("kwok.x-k8s.io/v1alpha1", "PortForward")
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-1"}
    ]
    assert obj["spec"] == {
        "forwards": [
            {"ports": [port], "target": {"address": "127.10.0.7", "port": port}}
            for port in (8080, 8888, 9090)
        ]
    }


async def test_records_go_to_the_log_active_where_they_were_logged_and_tasks_inherit_it(
    tmp_path: Path,
) -> None:
    logger = logging.getLogger("test.kubelet_api.routing")
    logger.propagate, logger.level = False, logging.INFO
    handler = RoutingHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    a, b = ContainerLog(tmp_path, "ns", "a", "1", "c"), ContainerLog(tmp_path, "ns", "b", "2", "c")
    a.start_instance(0)
    b.start_instance(0)
    try:
        with a.active():
            task = asyncio.create_task(_log_later(logger, "from a task started while a was active"))
            logger.info("a's start")
        with b.active():
            logger.info("b's start")
            await task
        logger.info("nobody's")  # outside every pod: the runner's own log only
    finally:
        logger.removeHandler(handler)
    assert _texts(a.current) == ["a's start", "from a task started while a was active"]
    assert _texts(b.current) == ["b's start"]


async def test_a_server_started_while_a_log_is_active_logs_its_requests_there(tmp_path: Path) -> None:
    """As the runner starts a pod's RuntimeServer: requests arrive later, outside that context."""
    logger = logging.getLogger("test.kubelet_api.server")
    logger.propagate, logger.level = False, logging.INFO
    handler = RoutingHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    log = ContainerLog(tmp_path, "ns", "a", "1", "c")
    log.start_instance(0)

    async def hello(request: web.Request) -> web.Response:
        logger.info("served %s", request.path)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/{name}", hello)
    runner = web.AppRunner(app, access_log=None)
    try:
        with log.active():
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/one") as resp:
            assert resp.status == 200
    finally:
        await runner.cleanup()
        logger.removeHandler(handler)
    assert _texts(log.current) == ["served /one"]


async def _log_later(logger: logging.Logger, text: str) -> None:
    await asyncio.sleep(0.01)
    logger.info(text)


def _texts(path: Path) -> list[str]:
    return [line.split(" F ", 1)[1] for line in path.read_text().splitlines()]


async def test_a_restarted_runner_sweeps_the_logs_of_pods_deleted_while_it_was_down(tmp_path: Path) -> None:
    runner = Runner(cast(ApiClient, None), tmp_path / "workspaces", base_env={}, pod_logs=tmp_path / "logs")
    live = {"metadata": {"namespace": "ns", "name": "kept", "uid": "u-1"}}
    runner.pods.list = lambda: [live]  # type: ignore[method-assign]
    kept = ContainerLog(tmp_path / "logs", "ns", "kept", "u-1", "runtime")
    gone = ContainerLog(tmp_path / "logs", "ns", "gone", "u-2", "runtime")
    for log in (kept, gone):
        log.start_instance(0)
    await runner._sweep_orphan_workspaces()
    assert kept.current.exists()
    assert not gone.pod_dir.exists()
