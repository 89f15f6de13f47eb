"""Runtime server configuration: the knobs of one server (one sandbox) and the `agent-sandbox-runtime` flags.

Upstream sandboxd's flags (spec §2.2) keep their names and defaults; the legacy runtime's environment
variables (`SANDBOX_BASE_DIR`, `SANDBOX_EXEC_TIMEOUT_SECONDS`, spec §2.1) still work as defaults. Our own
flags bound what one request may cost (command time, output, concurrent processes, body sizes).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent_sandbox.api.lifecycle import DEFAULT_CLAIM_ENV_FILE

from .process import DRAIN_AFTER_EXIT, QUIET_AFTER_EXIT

__all__ = ["DEFAULT_EXEC_TIMEOUT", "RuntimeConfig", "parse_args", "parse_seconds"]

log = logging.getLogger(__name__)

DEFAULT_EXEC_TIMEOUT = 300.0  # spec §2.1: legacy per-command limit
_SECONDS_RE = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)?$")
_UNIT = {None: 1.0, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_seconds(text: str) -> float:
    """A duration as sandboxd's flags take it ("10s", "500ms", "1m", "2h"), or a bare number of seconds.

    Only one unit per value (Go also accepts "1m30s"; write "90s").
    """
    m = _SECONDS_RE.match(text.strip())
    if not m:
        raise ValueError(f"invalid duration {text!r} (examples: 10s, 500ms, 2m, 30)")
    return float(m.group(1)) * _UNIT[m.group(2)]


@dataclass(slots=True)
class RuntimeConfig:
    """One runtime server: where it listens, which directory it serves, and its limits.

    A port of 0 binds an ephemeral port (the server reports the real one); the console script serves one
    config, the dev cluster's local runner one per pod IP in a single process.
    """

    root_dir: Path = Path("/workspace")
    listen_host: str = "0.0.0.0"
    legacy_port: int = 8888
    rest_port: int = 8080
    grpc_port: int = 9090
    metadata_env_prefix: str = "SANDBOX_"
    shutdown_timeout: float = 10.0
    http_idle_timeout: float = 60.0
    stream_chunk_size: int = 4096
    # ours
    command_timeout: float = DEFAULT_EXEC_TIMEOUT
    max_command_timeout: float = 24 * 3600.0
    max_output_bytes: int = 1 << 20
    max_processes: int = 64
    max_json_body_bytes: int = 1 << 20
    max_upload_bytes: int = 1 << 30
    # A blank line in `/execute/stream` after this long without output (0 = none): idle timeouts of the
    # router and other proxies would cut a quiet command's stream.
    stream_keepalive: float = 30.0
    # How long a command's output is still read after it exited (sandboxd's WaitDelay): what a background
    # child it left keeps open is given up then. Not a flag (sandboxd has none); tests shorten it.
    output_drain_after_exit: float = DRAIN_AFTER_EXIT
    # ...or sooner, once the pipes have been quiet this long after the exit (ours; not a flag either).
    output_quiet_after_exit: float = QUIET_AFTER_EXIT
    # Environment of the commands (default: the server's own). The runner gives each pod its own.
    command_env: Mapping[str, str] | None = field(default=None, repr=False)
    # The root as clients name it, when it differs from root_dir (the runner serves "/workspace" from a host
    # directory); sandboxd strips this prefix from paths.
    client_root: str | None = None
    # A claim's env, projected from the pod annotation by the downward API ("" = none); how long a command
    # waits for it to be delivered (runtime/claimenv.py).
    claim_env_file: str = DEFAULT_CLAIM_ENV_FILE
    claim_env_wait: float = 30.0

    def validate(self) -> None:
        """Reject values the server cannot run with (ValueError naming the flag)."""
        for name in ("legacy_port", "rest_port", "grpc_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ValueError(f"--{name.replace('_', '-')} must be within 0-65535, got {port}")
        ports = [p for p in (self.legacy_port, self.rest_port, self.grpc_port) if p]
        if len(set(ports)) != len(ports):
            raise ValueError("--legacy-port, --rest-port and --grpc-port must differ")
        if not str(self.root_dir):
            raise ValueError("--root-dir must be non-empty")
        positive = (
            "shutdown_timeout",
            "http_idle_timeout",
            "command_timeout",
            "max_command_timeout",
            "max_output_bytes",
            "max_processes",
            "max_json_body_bytes",
            "max_upload_bytes",
            "claim_env_wait",
            "output_drain_after_exit",
            "output_quiet_after_exit",
        )
        for name in positive:
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        if not (math.isfinite(self.stream_keepalive) and self.stream_keepalive >= 0):
            raise ValueError(f"--stream-keepalive must be >= 0, got {self.stream_keepalive}")
        if self.stream_chunk_size < 0:
            raise ValueError(f"--stream-chunk-size must be >= 0, got {self.stream_chunk_size}")
        if self.stream_chunk_size == 0:
            self.stream_chunk_size = 4096


def _env_exec_timeout(environ: Mapping[str, str]) -> float:
    raw = environ.get("SANDBOX_EXEC_TIMEOUT_SECONDS")
    if raw is None:
        return DEFAULT_EXEC_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        log.warning(
            "SANDBOX_EXEC_TIMEOUT_SECONDS=%r is not a positive number; using %s", raw, DEFAULT_EXEC_TIMEOUT
        )
        return DEFAULT_EXEC_TIMEOUT
    return value


def _seconds(text: str) -> float:
    try:
        return parse_seconds(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    base_dir = environ.get("SANDBOX_BASE_DIR", "").strip()
    p = argparse.ArgumentParser(
        prog="agent-sandbox-runtime",
        description="Sandbox runtime: legacy HTTP (8888), sandboxd REST (8080) and gRPC ProcessService (9090).",
    )

    def add(name: str, **kw: object) -> None:
        # Go's flag package takes both -flag and --flag; upstream manifests use both spellings.
        p.add_argument(f"--{name}", f"-{name}", **kw)  # type: ignore[arg-type]

    add("listen-host", default="0.0.0.0", help="bind host of every listener (default 0.0.0.0)")
    add("legacy-port", type=int, default=8888, help="legacy runtime HTTP port (default 8888)")
    add("rest-port", type=int, default=8080, help="sandboxd REST port (default 8080)")
    add("grpc-port", type=int, default=9090, help="sandboxd gRPC ProcessService port (default 9090)")
    add(
        "root-dir",
        default=base_dir or "/workspace",
        help="confinement root, created 0755 if missing (default $SANDBOX_BASE_DIR or /workspace)",
    )
    add("metadata-env-prefix", default="SANDBOX_", help="env prefix served by /v1/metadata")
    add("shutdown-timeout", type=_seconds, default=10.0, help="grace for requests and children (default 10s)")
    add(
        "http-idle-timeout",
        type=_seconds,
        default=60.0,
        help="keep-alive idle close, and the longest silence in an incomplete request body (408) (default 60s)",
    )
    add("stream-chunk-size", type=int, default=0, help="max bytes per streamed output event (0 -> 4096)")
    add(
        "command-timeout",
        type=_seconds,
        default=_env_exec_timeout(environ),
        help="default limit of an HTTP command (default $SANDBOX_EXEC_TIMEOUT_SECONDS or 300s)",
    )
    add(
        "max-command-timeout", type=_seconds, default=24 * 3600.0, help="largest per-command timeout accepted"
    )
    add("max-output-bytes", type=int, default=1 << 20, help="bytes kept per stream of a buffered command")
    add("max-processes", type=int, default=64, help="concurrent commands per server")
    add("max-json-body-bytes", type=int, default=1 << 20, help="largest JSON request body")
    add("max-upload-bytes", type=int, default=1 << 30, help="largest uploaded file")
    add(
        "stream-keepalive",
        type=_seconds,
        default=30.0,
        help="a blank line in /execute/stream after this long without output, for proxies' idle timeouts "
        "(default 30s; 0 = none)",
    )
    add(
        "claim-env-file",
        default=DEFAULT_CLAIM_ENV_FILE,
        help="file holding a warm claim's env (a downward API projection of the pod annotation "
        f"runtime.agents.x-k8s.io/claim-env); '' disables (default {DEFAULT_CLAIM_ENV_FILE})",
    )
    add(
        "claim-env-wait",
        type=_seconds,
        default=30.0,
        help="how long a command waits for the claim env to be delivered (default 30s)",
    )
    add("log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--version", "-version", action="store_true", help="print the version and exit")
    return p


def _without_zap_flags(argv: Sequence[str]) -> list[str]:
    """sandboxd's `--zap-*` logging flags (controller-runtime's zap options) are accepted and ignored."""
    out: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
            if not arg.startswith("-"):
                continue
        if arg.startswith("-") and arg.lstrip("-").startswith("zap-"):
            skip_value = "=" not in arg and arg.lstrip("-") != "zap-devel"
            log.info("ignoring sandboxd logging flag %s (use --log-level)", arg.split("=", 1)[0])
            continue
        out.append(arg)
    return out


def parse_args(
    argv: Sequence[str], environ: Mapping[str, str] | None = None
) -> tuple[RuntimeConfig, argparse.Namespace]:
    """Parse the command line into a validated config (argparse exits 2 with a message on bad input)."""
    env = os.environ if environ is None else environ
    parser = _parser(env)
    ns = parser.parse_args(_without_zap_flags(argv))
    if not ns.root_dir.strip():
        parser.error("--root-dir must be non-empty")
    config = RuntimeConfig(
        root_dir=Path(ns.root_dir),
        listen_host=ns.listen_host,
        legacy_port=ns.legacy_port,
        rest_port=ns.rest_port,
        grpc_port=ns.grpc_port,
        metadata_env_prefix=ns.metadata_env_prefix,
        shutdown_timeout=ns.shutdown_timeout,
        http_idle_timeout=ns.http_idle_timeout,
        stream_chunk_size=ns.stream_chunk_size,
        command_timeout=ns.command_timeout,
        max_command_timeout=ns.max_command_timeout,
        max_output_bytes=ns.max_output_bytes,
        max_processes=ns.max_processes,
        max_json_body_bytes=ns.max_json_body_bytes,
        max_upload_bytes=ns.max_upload_bytes,
        stream_keepalive=ns.stream_keepalive,
        claim_env_file=ns.claim_env_file,
        claim_env_wait=ns.claim_env_wait,
    )
    try:
        config.validate()
    except ValueError as err:
        parser.error(str(err))
    return config, ns
