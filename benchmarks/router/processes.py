"""Processes of the router benchmark: backends (nginx, the small REST app, the runtime), routers, wrk.

Everything binds 127.0.0.0/8. Each helper returns a `Proc` that is stopped (SIGTERM, then SIGKILL) by
PID in `finally` blocks of the runner; nothing is killed by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Proc", "cpu_seconds", "free_port", "rss_kib", "start_backend", "start_router", "wrk"]

HERE = Path(__file__).resolve().parent
NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  keepalive_requests 1000000;
  client_body_buffer_size 64k;
  server {{
    listen {ip}:{port} backlog=4096;
    location = / {{ default_type application/json; return 200 '{{"ok":true}}'; }}
    # A 4 KiB file; POSTs to it are answered with it too (405 -> 200), the request body discarded.
    location = /4k {{ default_type application/octet-stream; root {dir}/www; error_page 405 =200 $uri; }}
  }}
}}
"""


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    port: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        tmp = self.extra.get("tmpdir")
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def free_port(ip: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        port: int = s.getsockname()[1]
        return port


def _wait_tcp(ip: str, port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection((ip, port), timeout=1):
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start listening on {ip}:{port}")
        time.sleep(0.05)


def start_backend(kind: str, ip: str) -> Proc:
    """`nginx`, `python-rest` (benchmarks.router.backend) or `runtime` (agent-sandbox-runtime) on `ip`."""
    port = free_port(ip)
    if kind == "nginx":
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(nginx).exists():
            raise RuntimeError("nginx not installed: apt-get install -y nginx-light")
        tmp = tempfile.mkdtemp(prefix="router-bench-nginx-")
        Path(tmp, "nginx.conf").write_text(NGINX_CONF.format(dir=tmp, ip=ip, port=port))
        Path(tmp, "www").mkdir()
        Path(tmp, "www", "4k").write_bytes(b"y" * 4096)
        os.chmod(tmp, 0o755)  # nginx's worker runs as an unprivileged user
        popen = subprocess.Popen(
            [nginx, "-c", f"{tmp}/nginx.conf", "-p", tmp],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc = Proc(kind, popen, port, {"tmpdir": tmp})
    elif kind == "python-rest":
        popen = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.router.backend", ip, str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=HERE.parent.parent,
        )
        proc = Proc(kind, popen, port)
    elif kind == "runtime":
        script = Path(sys.executable).with_name("agent-sandbox-runtime")
        if not script.exists():
            raise RuntimeError("agent-sandbox-runtime is not installed in this environment")
        tmp = tempfile.mkdtemp(prefix="router-bench-runtime-")
        popen = subprocess.Popen(
            [str(script), f"--listen-host={ip}", f"--legacy-port={port}", f"--root-dir={tmp}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc = Proc(kind, popen, port, {"tmpdir": tmp})
    else:
        raise ValueError(f"unknown backend {kind!r}")
    try:
        _wait_tcp(ip, port, popen, kind)
    except Exception:
        proc.stop()
        raise
    return proc


def start_router(flags: list[str], *, env: dict[str, str] | None = None) -> Proc:
    """`agent-sandbox-router` on 127.0.0.1 (proxy, probes; metrics on a free port), ready when /readyz is."""
    port, probe, metrics = free_port(), free_port(), free_port()
    script = Path(sys.executable).with_name("agent-sandbox-router")
    argv = [
        str(script),
        f"--http-bind-address=127.0.0.1:{port}",
        f"--health-probe-bind-address=127.0.0.1:{probe}",
        f"--metrics-bind-address=127.0.0.1:{metrics}",
        "--allow-loopback-pod-ip",
        *flags,
    ]
    log = Path(tempfile.mkstemp(prefix="router-bench-", suffix=".log")[1])
    with log.open("wb") as out:
        popen = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    proc = Proc("router", popen, port, {"log": str(log), "metrics": metrics})
    deadline = time.monotonic() + 90
    while True:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{probe}/readyz", timeout=1),
        ):
            return proc
        if popen.poll() is not None or time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError(f"router did not become ready: {log.read_text()[-1500:]}")
        time.sleep(0.1)


def _proc_stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pids: list[int]) -> float:
    """user+system CPU seconds of the given processes (children not included)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            st = _proc_stat(pid)
            total += (int(st[11]) + int(st[12])) / ticks
    return total


def rss_kib(pid: int, key: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def wrk(url: str, *, connections: int, duration: float, body: str, headers: dict[str, str]) -> dict[str, Any]:
    """One wrk run (2 threads): the JSON summary of wrk_report.lua."""
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk not installed: apt-get install -y wrk")
    argv = [
        "wrk",
        "-t2",
        f"-c{connections}",
        f"-d{max(1, round(duration))}s",
        "--timeout",
        "10s",
        "-s",
        str(HERE / "wrk_report.lua"),
    ]
    for key, value in headers.items():
        argv += ["-H", f"{key}: {value}"]
    argv += [url, "--", body]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60, check=False)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith('{"requests"')), None)
    if line is None:
        raise RuntimeError(f"wrk failed: {out.stdout[-500:]} {out.stderr[-500:]}")
    result: dict[str, Any] = json.loads(line)
    return result
