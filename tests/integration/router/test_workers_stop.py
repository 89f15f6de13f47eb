"""`--workers`: the stop of a supervisor and its workers (router spec §1.12).

Until December 7 a Ctrl-C in a terminal (SIGINT to the whole process group) reached the workers twice - the
terminal's SIGINT, then the supervisor's SIGTERM - and they took the second as "stop now": they exited 1
without draining. And the workers' metrics directory was left behind by every stop but the normal one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import listen_port, wait_for

pytestmark = pytest.mark.integration


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _start(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """A supervisor with one worker in its own process group (as a shell runs it), its temporary files under
    a directory of the test's."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    log = tmp_path / "router.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KUBERNETES_SERVICE"))}
    env["TMPDIR"] = str(temp)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent_sandbox.router", "--workers=2", "--metrics-bind-address=0",
             "--allow-loopback-pod-ip", "--shutdown-timeout=5s", *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )  # fmt: skip
    return proc, log, temp


def _wait(proc: subprocess.Popen[bytes]) -> int:
    try:
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ctrl_c_to_the_process_group_drains_the_workers(tmp_path: Path) -> None:
    probe = listen_port()
    proc, log, temp = _start(
        tmp_path,
        f"--http-bind-address=127.0.0.1:{listen_port()}",
        f"--health-probe-bind-address=127.0.0.1:{probe}",
    )
    try:
        wait_for(lambda: _ready(probe) or proc.poll() is not None, what="router and worker ready", timeout=60)
        assert proc.poll() is None, log.read_text()[-2000:]
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    finally:
        code = _wait(proc)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "again: exiting now" not in text  # no worker took the supervisor's SIGTERM for a second signal
    assert text.count('"msg":"router stopped"') == 2, text[-3000:]  # the supervisor and its worker drained
    assert list(temp.iterdir()) == []  # the metrics directory is gone


def test_the_metrics_directory_is_removed_after_a_failed_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc, log, temp = _start(
            tmp_path,
            f"--http-bind-address=127.0.0.1:{taken.getsockname()[1]}",
            f"--health-probe-bind-address=127.0.0.1:{listen_port()}",
        )
        code = _wait(proc)
    assert code == 1, log.read_text()[-2000:]
    assert list(temp.iterdir()) == []


def test_the_metrics_directory_is_removed_after_a_second_signal(tmp_path: Path) -> None:
    probe, port = listen_port(), listen_port()
    proc, log, temp = _start(
        tmp_path, f"--http-bind-address=127.0.0.1:{port}", f"--health-probe-bind-address=127.0.0.1:{probe}"
    )
    try:
        wait_for(lambda: _ready(probe) or proc.poll() is not None, what="router and worker ready", timeout=60)
        assert proc.poll() is None, log.read_text()[-2000:]
        with socket.create_connection(("127.0.0.1", port)) as held:
            held.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # half a head: the drain waits for it
            time.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)  # the held connection open until the process is gone
    finally:
        code = _wait(proc)
    assert code == 1, log.read_text()[-2000:]
    assert "again: exiting now" in log.read_text()
    assert list(temp.iterdir()) == []
