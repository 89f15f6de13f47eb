"""Host-side dynamic volume provisioner of the dev cluster: every PersistentVolume is a real directory.

Owns: provisioning a PV for each PVC of a StorageClass whose provisioner is `PROVISIONER_NAME`, backed by a
fresh directory `<cluster dir>/volumes/pvc-<uid>/`, and deleting that directory and the PV once the PV is
Released with reclaim policy Delete. It behaves like an external provisioner (sig-storage-lib semantics):
it acts only on PVCs that kube-controller-manager's PV controller has annotated with
`volume.kubernetes.io/storage-provisioner: <us>`, writes the PV with a `claimRef` and lets the PV controller
bind the pair. For `WaitForFirstConsumer` classes it waits for the scheduler's
`volume.kubernetes.io/selected-node` and pins the PV to that node (a `local` PV with node affinity);
`Immediate` classes get a `hostPath` PV usable from every node (all kwok nodes share this host).

Runs as its own process (`python -m agent_sandbox.devcluster.provisioner`), started and stopped by
`DevCluster` like every component; it authenticates as `agent-sandbox:volume-provisioner`, bound to the
built-in `system:persistent-volume-provisioner` ClusterRole. Nothing is ever mounted: a local runner mounts
the directory named by the PV's `hostPath.path`/`local.path` (also in the `devcluster.agents.x-k8s.io/host-path`
annotation).

Failure modes: a failed API call or filesystem step is retried with per-object backoff; a broken watch
relists. Directories outside the volume root are never removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent_sandbox.api.errortext import describe_error
from agent_sandbox.devcluster.config import HOST_PATH_ANNOTATION, PROVISIONER_NAME
from agent_sandbox.devcluster.processes import run_component
from agent_sandbox.kube import PVC, AlreadyExists, ApiClient, Gone, NotFound, Object, ResourceKind

PV = ResourceKind("", "v1", "PersistentVolume", "persistentvolumes", namespaced=False)
STORAGE_CLASS = ResourceKind("storage.k8s.io", "v1", "StorageClass", "storageclasses", namespaced=False)

PROVISIONER_ANNOTATIONS = (
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
)
SELECTED_NODE_ANNOTATION = "volume.kubernetes.io/selected-node"
PROVISIONED_BY_ANNOTATION = "pv.kubernetes.io/provisioned-by"
HOSTNAME_LABEL = "kubernetes.io/hostname"

_RESYNC_SECONDS = 30.0
_MAX_BACKOFF = 30.0

log = logging.getLogger("volume-provisioner")


# -- pure decisions ---------------------------------------------------------------------------------------
def volume_host_path(pv: Mapping[str, Any]) -> str | None:
    """Host directory behind a PV: our annotation, else `hostPath.path` / `local.path`."""
    spec = pv.get("spec") or {}
    raw = _annotations(pv).get(HOST_PATH_ANNOTATION) or (spec.get("hostPath") or spec.get("local") or {}).get(
        "path"
    )
    return str(raw) if raw else None


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return obj.get("metadata", {}).get("annotations") or {}


def should_provision(pvc: Mapping[str, Any], storage_class: Mapping[str, Any] | None, name: str) -> bool:
    """True when `pvc` waits for a new volume from provisioner `name` (and may get one now).

    Mirrors an external provisioner: the class must name us, the PV controller must have handed the claim
    to us (storage-provisioner annotation), the claim must be unbound and alive, and a WaitForFirstConsumer
    claim needs the scheduler's selected node. Claims with a label selector cannot be provisioned.
    """
    if storage_class is None or storage_class.get("provisioner") != name:
        return False
    meta, spec = pvc.get("metadata", {}), pvc.get("spec", {})
    if meta.get("deletionTimestamp") or spec.get("volumeName") or spec.get("selector"):
        return False
    if (pvc.get("status") or {}).get("phase", "Pending") != "Pending":
        return False
    ann = _annotations(pvc)
    if not any(ann.get(key) == name for key in PROVISIONER_ANNOTATIONS):
        return False
    wffc = storage_class.get("volumeBindingMode") == "WaitForFirstConsumer"
    return not (wffc and not ann.get(SELECTED_NODE_ANNOTATION))


def pv_name(pvc: Mapping[str, Any]) -> str:
    """The PV name for a claim: `pvc-<claim uid>` (as upstream provisioners name them)."""
    return f"pvc-{pvc['metadata']['uid']}"


def pv_manifest(
    pvc: Mapping[str, Any], storage_class: Mapping[str, Any], root: Path, name: str
) -> dict[str, Any]:
    """The PV that satisfies `pvc`: claimRef to it, its size and modes, backed by `root/pvc-<uid>`."""
    meta, spec = pvc["metadata"], pvc.get("spec", {})
    volume = pv_name(pvc)
    path = str(root / volume)
    pv_spec: dict[str, Any] = {
        "capacity": {"storage": spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")},
        "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
        "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
        "storageClassName": storage_class["metadata"]["name"],
        "volumeMode": spec.get("volumeMode") or "Filesystem",
        "claimRef": {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
        },
    }
    if storage_class.get("mountOptions"):
        pv_spec["mountOptions"] = list(storage_class["mountOptions"])
    node = _annotations(pvc).get(SELECTED_NODE_ANNOTATION)
    if storage_class.get("volumeBindingMode") == "WaitForFirstConsumer" and node:
        pv_spec["local"] = {"path": path}
        pv_spec["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}
                ]
            }
        }
    else:
        pv_spec["hostPath"] = {"path": path, "type": "DirectoryOrCreate"}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume,
            "annotations": {PROVISIONED_BY_ANNOTATION: name, HOST_PATH_ANNOTATION: path},
        },
        "spec": pv_spec,
    }


def should_delete(pv: Mapping[str, Any], name: str) -> bool:
    """True when `pv` is ours, Released and reclaimed by deletion."""
    return (
        _annotations(pv).get(PROVISIONED_BY_ANNOTATION) == name
        and not pv.get("metadata", {}).get("deletionTimestamp")
        and (pv.get("status") or {}).get("phase") == "Released"
        and pv.get("spec", {}).get("persistentVolumeReclaimPolicy") == "Delete"
    )


def backing_dir(pv: Mapping[str, Any], root: Path) -> Path | None:
    """The directory behind `pv` when it lies directly inside `root` (anything else is never touched)."""
    spec = pv.get("spec", {})
    raw = (spec.get("hostPath") or spec.get("local") or {}).get("path")
    if not raw:
        return None
    path = Path(raw)
    if path.parent.resolve() != root.resolve() or path.name in ("", ".", ".."):
        return None
    return path


# -- the process ------------------------------------------------------------------------------------------
class Provisioner:
    """List+watch PVCs and PVs; one worker provisions and reclaims, retrying failures with backoff."""

    def __init__(self, client: ApiClient, root: Path, *, name: str = PROVISIONER_NAME) -> None:
        self.client = client
        self.root = root
        self.name = name
        self.claims: dict[str, Object] = {}
        self.volumes: dict[str, Object] = {}
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._queued: set[tuple[str, str]] = set()
        self._backoff: dict[tuple[str, str], float] = {}
        self._synced = {"claims": asyncio.Event(), "volumes": asyncio.Event()}
        self._tasks: set[asyncio.Task[None]] = set()

    def _enqueue(self, item: tuple[str, str]) -> None:
        if item not in self._queued:
            self._queued.add(item)
            self._queue.put_nowait(item)

    def _later(self, item: tuple[str, str]) -> None:
        delay = min(self._backoff.get(item, 0.5) * 2, _MAX_BACKOFF)
        self._backoff[item] = delay

        async def requeue() -> None:
            await asyncio.sleep(delay)
            self._enqueue(item)

        task = asyncio.create_task(requeue())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, kind: ResourceKind, store: dict[str, Object], tag: str) -> None:
        """Keep `store` equal to the server's objects of `kind`; enqueue every change."""
        while True:
            try:
                page = await self.client.list_page(kind)
                fresh = {_key(o): o for o in page.items}
                for key in set(store) - set(fresh):
                    store.pop(key)
                store.update(fresh)
                for key in fresh:
                    self._enqueue((tag, key))
                self._synced[tag].set()
                rv = page.resource_version
                async for event in self.client.watch(kind, resource_version=rv, timeout_seconds=300):
                    obj = event.object
                    if event.type == "BOOKMARK":
                        continue
                    key = _key(obj)
                    if event.type == "DELETED":
                        store.pop(key, None)
                    else:
                        store[key] = obj
                        self._enqueue((tag, key))
            except Gone:
                continue
            except Exception as exc:  # a daemon: any failure (API, transport, decoding) means relist
                if not self._synced[tag].is_set():
                    # Started alongside the API server: poll quickly and quietly until it answers.
                    log.debug("list %s not possible yet: %s", kind.plural, describe_error(exc))
                    await asyncio.sleep(0.1)
                    continue
                log.warning("watch %s failed (%s); relisting in 1s", kind.plural, describe_error(exc))
                await asyncio.sleep(1.0)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(_RESYNC_SECONDS)
            for key in list(self.claims):
                self._enqueue(("claims", key))
            for key in list(self.volumes):
                self._enqueue(("volumes", key))

    async def _storage_class(self, name: str | None) -> Object | None:
        # Read each time (only for claims still waiting): a class may be deleted and re-created.
        if not name:
            return None
        try:
            return await self.client.get(STORAGE_CLASS, name)
        except NotFound:
            return None

    async def _work(self) -> None:
        while True:
            item = await self._queue.get()
            self._queued.discard(item)
            tag, key = item
            try:
                if tag == "claims":
                    await self._sync_claim(key)
                else:
                    await self._sync_volume(key)
                self._backoff.pop(item, None)
            except Exception as exc:  # a daemon: log, back off, retry this object
                log.warning("%s %s: %s (retrying)", tag, key, describe_error(exc))
                self._later(item)

    async def _sync_claim(self, key: str) -> None:
        pvc = self.claims.get(key)
        if pvc is None or pvc.get("spec", {}).get("volumeName"):
            return
        sc = await self._storage_class(pvc.get("spec", {}).get("storageClassName"))
        if not should_provision(pvc, sc, self.name):
            return
        assert sc is not None
        if pv_name(pvc) in self.volumes:
            return
        manifest = pv_manifest(pvc, sc, self.root, self.name)
        directory = Path(manifest["metadata"]["annotations"][HOST_PATH_ANNOTATION])
        await asyncio.to_thread(_make_dir, directory)
        try:
            created = await self.client.create(PV, manifest)
        except AlreadyExists:
            return
        self.volumes[_key(created)] = created
        log.info("provisioned %s for %s at %s", manifest["metadata"]["name"], key, directory)

    async def _sync_volume(self, key: str) -> None:
        pv = self.volumes.get(key)
        if pv is None or not should_delete(pv, self.name):
            return
        directory = backing_dir(pv, self.root)
        if directory is not None:
            await asyncio.to_thread(shutil.rmtree, directory, True)
        with contextlib.suppress(NotFound):
            await self.client.delete(PV, key, uid=pv["metadata"]["uid"])
        log.info("deleted %s and %s", key, directory)

    async def run(self, ready_file: Path | None = None) -> None:
        await asyncio.to_thread(self.root.mkdir, parents=True, exist_ok=True)
        runners = [
            asyncio.create_task(self._watch(PVC, self.claims, "claims")),
            asyncio.create_task(self._watch(PV, self.volumes, "volumes")),
            asyncio.create_task(self._work()),
            asyncio.create_task(self._resync()),
        ]
        await asyncio.wait(
            [asyncio.create_task(e.wait()) for e in self._synced.values()],
            return_when=asyncio.ALL_COMPLETED,
        )
        if ready_file is not None:
            tmp = ready_file.with_suffix(".tmp")
            tmp.write_text(str(os.getpid()))
            tmp.replace(ready_file)
        log.info("ready: provisioner %s, volumes under %s", self.name, self.root)
        done, _ = await asyncio.wait(runners, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()


def _make_dir(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o777)  # any user of a local runner may write, as local-path provisioners do


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


async def _main(args: argparse.Namespace) -> None:
    client = await ApiClient.from_kubeconfig(args.kubeconfig, qps=-1.0, burst=100)
    try:
        await Provisioner(client, Path(args.root), name=args.name).run(
            Path(args.ready_file) if args.ready_file else None
        )
    finally:
        await client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="volume-provisioner", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--root", required=True, help="directory holding one sub-directory per volume")
    parser.add_argument("--name", default=PROVISIONER_NAME, help="provisioner name StorageClasses refer to")
    parser.add_argument("--ready-file", default="", help="written once the first lists succeeded")
    args = parser.parse_args(argv)
    args.root = os.path.abspath(args.root)  # PVs carry absolute paths
    return run_component(_main(args))


if __name__ == "__main__":
    sys.exit(main())
