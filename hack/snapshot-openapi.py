#!/usr/bin/env python3
"""Snapshot the Kubernetes OpenAPI v3 definitions embedded in our CRDs.

The CRDs embed core/v1 PodSpec, core/v1 PersistentVolumeClaimSpec and networking/v1
NetworkPolicy{Ingress,Egress}Rule. Rather than hand-writing those schemas we copy them
from the API server of our pinned Kubernetes release and let
``agent_sandbox.api.crdgen`` turn them into structural CRD schemas.

This script fetches ``/openapi/v3/api/v1`` and ``/openapi/v3/apis/networking.k8s.io/v1``,
keeps only the definitions reachable from the four roots, drops descriptions and
strategic-merge-patch hints (CRDs carry neither), and writes
``src/agent_sandbox/api/k8s_openapi.json`` with sorted keys so re-runs diff cleanly.

Usage (a running API server, e.g. ``agent-sandbox dev up --name api-snap``)::

    hack/snapshot-openapi.py --kubeconfig "$(agent-sandbox dev kubeconfig --name api-snap)"

or, offline, from the same documents checked into the Kubernetes source tree of the
release (``api/openapi-spec/v3/`` of k8s.io/kubernetes, which upstream generates from a
running apiserver)::

    hack/snapshot-openapi.py --from-dir $(go env GOMODCACHE)/k8s.io/kubernetes@v1.35.4/api/openapi-spec/v3 \
        --kubernetes-version v1.35.4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOTS = (
    "io.k8s.api.core.v1.PodSpec",
    "io.k8s.api.core.v1.PersistentVolumeClaimSpec",
    "io.k8s.api.networking.v1.NetworkPolicyIngressRule",
    "io.k8s.api.networking.v1.NetworkPolicyEgressRule",
)
DOCUMENTS = {
    "/openapi/v3/api/v1": "api__v1_openapi.json",
    "/openapi/v3/apis/networking.k8s.io/v1": "apis__networking.k8s.io__v1_openapi.json",
}
DROP_KEYS = frozenset({"description", "x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key"})
REF_PREFIX = "#/components/schemas/"
OUT = Path(__file__).resolve().parent.parent / "src" / "agent_sandbox" / "api" / "k8s_openapi.json"


def _kubectl(kubeconfig: str, *args: str) -> str:
    return subprocess.run(
        ["kubectl", "--kubeconfig", kubeconfig, *args], check=True, capture_output=True, text=True
    ).stdout


def _load(args: argparse.Namespace) -> tuple[dict[str, Any], str, str]:
    schemas: dict[str, Any] = {}
    if args.kubeconfig:
        for path in DOCUMENTS:
            schemas.update(
                json.loads(_kubectl(args.kubeconfig, "get", "--raw", path))["components"]["schemas"]
            )
        version = json.loads(_kubectl(args.kubeconfig, "get", "--raw", "/version"))["gitVersion"]
        return schemas, version, "kube-apiserver " + ", ".join(DOCUMENTS)
    for name in DOCUMENTS.values():
        schemas.update(json.loads((Path(args.from_dir) / name).read_text())["components"]["schemas"])
    if not args.kubernetes_version:
        sys.exit("--kubernetes-version is required with --from-dir")
    return (
        schemas,
        args.kubernetes_version,
        "k8s.io/kubernetes api/openapi-spec/v3 " + ", ".join(DOCUMENTS.values()),
    )


def _clean(node: Any, found: set[str]) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in DROP_KEYS:
                continue
            if key == "$ref":
                found.add(value.removeprefix(REF_PREFIX))
            out[key] = _clean(value, found)
        return out
    if isinstance(node, list):
        return [_clean(v, found) for v in node]
    return node


def prune(schemas: dict[str, Any]) -> dict[str, Any]:
    """Definitions reachable from ROOTS, cleaned."""
    keep: dict[str, Any] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        found: set[str] = set()
        keep[name] = _clean(schemas[name], found)
        todo.extend(found - keep.keys())
    return keep


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--kubeconfig", help="fetch from the API server of this kubeconfig")
    src.add_argument("--from-dir", help="read api/openapi-spec/v3 files of a Kubernetes source tree")
    parser.add_argument("--kubernetes-version", help="version label when using --from-dir")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--check", action="store_true", help="exit 1 if --out differs from a fresh snapshot")
    args = parser.parse_args()

    schemas, version, source = _load(args)
    doc = {"kubernetesVersion": version, "roots": list(ROOTS), "source": source, "schemas": prune(schemas)}
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    out = Path(args.out)
    if args.check:
        old = json.loads(out.read_text())
        # The source label may differ (file vs live server); the definitions must not.
        if old["schemas"] != doc["schemas"] or old["kubernetesVersion"] != version:
            sys.exit(f"{out} differs from the {source} definitions of {version}")
        print(f"{out}: identical to {source} ({version}, {len(doc['schemas'])} definitions)")
        return
    out.write_text(text)
    print(f"wrote {out}: {len(doc['schemas'])} definitions from {source} ({version})")


if __name__ == "__main__":
    main()
