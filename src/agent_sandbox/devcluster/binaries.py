"""Locate or build the control-plane binaries (pinned versions, cached per Go version).

Owns: the pinned versions and the cache layout `~/.cache/agent-sandbox/bin/<key>/`. The build itself is
`build-control-plane.sh` next to this file (plain `go` plumbing, see docs/devcluster.md); it is run
once per key and its output is streamed so a cold build (minutes) shows progress.

Failure modes: Go missing, or a build failure -> `BuildError` naming the step and the log file.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "1.35.4"
ETCD_VERSION = "3.6.5"
KWOK_VERSION = "0.8.0"
# Helm v3 for the chart tests (helm/); its k8s.io libraries are v0.35, like the control plane's.
HELM_VERSION = "3.20.2"

BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "etcd", "kwok", "helm")
_SCRIPT = Path(__file__).with_name("build-control-plane.sh")


class BuildError(RuntimeError):
    """The control plane could not be built (Go missing, download or compile failure)."""


def cache_root() -> Path:
    """Root of everything the project caches (binaries, clusters); `AGENT_SANDBOX_CACHE` overrides."""
    env = os.environ.get("AGENT_SANDBOX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "agent-sandbox"


@dataclass(frozen=True, slots=True)
class Binaries:
    """Absolute paths of the built control-plane binaries."""

    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def complete(self) -> bool:
        if not all(os.access(self.path(b), os.X_OK) for b in BINARIES):
            return False
        # helm is not in the directory key; its stamp says which version the binary is.
        try:
            return self.path("helm.version").read_text().strip() == HELM_VERSION
        except OSError:
            return False


def _go_version(go: str) -> str:
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def binaries_dir(go: str | None = None) -> Path:
    """Cache directory for the pinned versions built by the local Go toolchain."""
    go = go or shutil.which("go")
    if go is None:
        raise BuildError(
            "Go toolchain not found on PATH: the local control plane is built from the official Go "
            "modules (k8s.io/kubernetes, etcd, kwok). Install Go >= 1.25 and retry."
        )
    key = f"k8s-v{KUBERNETES_VERSION}-etcd-v{ETCD_VERSION}-kwok-v{KWOK_VERSION}-{_go_version(go)}-{_arch()}"
    return cache_root() / "bin" / key


def ensure_binaries(*, quiet: bool = False) -> Binaries:
    """Return the cached binaries, building them first if any is missing.

    Raises:
        BuildError: Go is missing or the build failed; the message names the log file and its tail.
    """
    directory = binaries_dir()
    bins = Binaries(directory)
    if bins.complete:
        return bins
    log_path = cache_root() / "build" / "build.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # Parallel test workers (or two checkouts) may ask at once on a cold cache: one builds, the others
    # wait for it and then find the binaries complete.
    with (log_path.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if bins.complete:
            return bins
        _build(directory, log_path, quiet=quiet)
    return bins


def _build(directory: Path, log_path: Path, *, quiet: bool) -> None:
    bins = Binaries(directory)
    directory.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "AGENT_SANDBOX_K8S_VERSION": KUBERNETES_VERSION,
        "AGENT_SANDBOX_ETCD_VERSION": ETCD_VERSION,
        "AGENT_SANDBOX_KWOK_VERSION": KWOK_VERSION,
        "AGENT_SANDBOX_HELM_VERSION": HELM_VERSION,
        "AGENT_SANDBOX_CACHE": str(cache_root()),
    }
    print(
        f"building the local control plane (Kubernetes v{KUBERNETES_VERSION}, etcd v{ETCD_VERSION}, "
        f"kwok v{KWOK_VERSION}, helm v{HELM_VERSION}) into {directory}; a cold build takes 15-30 minutes, "
        f"log: {log_path}",
        file=sys.stderr,
        flush=True,
    )
    tail: list[str] = []
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            ["bash", str(_SCRIPT), str(directory)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            tail = [*tail[-29:], line.rstrip()]
            if not quiet and line.startswith("[build"):
                print(line.rstrip(), file=sys.stderr, flush=True)
        code = proc.wait()
    if code != 0 or not bins.complete:
        missing = [b for b in BINARIES if not os.access(bins.path(b), os.X_OK)]
        raise BuildError(
            f"building the control plane failed (exit {code}; missing: {', '.join(missing) or 'none'}).\n"
            f"log: {log_path}\nlast lines:\n" + "\n".join(tail[-20:])
        )
