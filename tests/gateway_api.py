"""The Gateway API's `Gateway` CRD (standard channel), for tests of the SDKs' gateway mode.

Taken from the published Go module (`go mod download`, the Go module proxy or the local module cache), as the
local control plane's own components are; nothing is vendored. No Gateway implementation runs here: tests
that use the CRD publish a Gateway's `status.addresses` themselves.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from agent_sandbox.devcluster import DevCluster

MODULE = "sigs.k8s.io/gateway-api"
VERSION = "v1.6.3"
CRD_NAME = "gateways.gateway.networking.k8s.io"
CRD_FILE = "config/crd/standard/gateway.networking.k8s.io_gateways.yaml"


def gateway_crd_path() -> Path:
    """The module's `CRD_FILE` (the module is downloaded on first use)."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("the Go toolchain is not on PATH (it also builds the local control plane)")
    out = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{VERSION}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return Path(json.loads(out.stdout)["Dir"]) / CRD_FILE


def install_gateway_crd(cluster: DevCluster) -> None:
    """Apply the Gateway CRD (server-side: it is too large for the last-applied annotation) and wait until
    it is Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(gateway_crd_path()), check=True)
    # Polled, not `kubectl wait`: that fails at once on a CRD whose status is not written yet.
    cluster.admin().wait_crds_established([CRD_NAME])
