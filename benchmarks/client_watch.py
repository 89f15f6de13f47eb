"""The client view from a separate process (issue 20): create sent -> Ready seen, by a process of its own.

The harness's own watch (`trackers.ClaimTracker`) shares an event loop and a core with the load generator,
so its Ready times can be early or late relative to a user's. This process does what a user's client
does: one watch over SandboxClaims in every namespace, and for each claim the first version it sees
with Ready=True. The latency is that moment minus the claim's `client-first-requested-at` annotation (the
load generator stamps it with the send time, same wall clock), so nothing but the object is shared.

Run by `ClientWatchProcess` around a claim phase; writes one JSON line per Ready claim
(`{"claim": "ns/name", "ready": epoch, "requested": epoch}`) to `--out`, and creates `--ready-file` once
its watch is established.

    python -m benchmarks.client_watch --kubeconfig K --out claims.jsonl --ready-file ready
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.kube import SANDBOX_CLAIM, ApiClient, Gone, KubeError

from .objects import parse_rfc3339

__all__ = ["ClientWatchProcess", "read_ready", "watch_claims"]


def _ready(obj: dict[str, Any]) -> bool:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


async def watch_claims(kubeconfig: str, out: Path, ready_file: Path) -> None:
    """Record the first Ready=True version of every claim until cancelled."""
    api = await ApiClient.from_kubeconfig(kubeconfig, connections=1)
    seen: set[str] = set()
    try:
        with out.open("a", buffering=1) as sink:
            rv = (await api.list_page(SANDBOX_CLAIM, limit=1)).resource_version
            ready_file.touch()  # noqa: ASYNC240 (once, before the watch: a tiny local file)
            while True:
                try:
                    async for ev in api.watch(SANDBOX_CLAIM, resource_version=rv, timeout_seconds=600):
                        now = time.time()
                        meta = ev.object.get("metadata") or {}
                        rv = meta.get("resourceVersion") or rv
                        key = f"{meta.get('namespace')}/{meta.get('name')}"
                        if ev.type not in ("ADDED", "MODIFIED") or key in seen or not _ready(ev.object):
                            continue
                        seen.add(key)
                        requested = parse_rfc3339(
                            (meta.get("annotations") or {}).get(c.ANNOTATION_CLIENT_FIRST_REQUESTED_AT)
                        )
                        sink.write(json.dumps({"claim": key, "ready": now, "requested": requested}) + "\n")
                except Gone:
                    rv = (await api.list_page(SANDBOX_CLAIM, limit=1)).resource_version
                except KubeError as exc:
                    print(f"client_watch: {type(exc).__name__}: {exc}; resuming", file=sys.stderr)
                    await asyncio.sleep(0.2)
    finally:
        await api.close()


def read_ready(path: Path) -> dict[str, tuple[float, float | None]]:
    """claim -> (Ready seen, requested) from a `--out` file; a torn last line is skipped."""
    out: dict[str, tuple[float, float | None]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        out.setdefault(rec["claim"], (float(rec["ready"]), rec.get("requested")))
    return out


class ClientWatchProcess:
    """Starts the watcher process, waits for its watch, stops it (by PID) and reads what it saw."""

    def __init__(self, kubeconfig: str, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.out = directory / "client-watch.jsonl"
        self.ready_file = directory / "client-watch.ready"
        for p in (self.out, self.ready_file):
            p.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.client_watch",
                f"--kubeconfig={kubeconfig}",
                f"--out={self.out}",
                f"--ready-file={self.ready_file}",
            ],
            stderr=subprocess.DEVNULL,
        )

    async def wait_watching(self, within: float = 30.0) -> bool:
        deadline = time.monotonic() + within
        while not self.ready_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    async def stop(self) -> dict[str, tuple[float, float | None]]:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.wait, 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        return read_ready(self.out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.client_watch", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--ready-file", required=True, type=Path)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(watch_claims(args.kubeconfig, args.out, args.ready_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
