"""`agent-sandbox release`: render the release assets (operations spec §3), or only run the drift guard.

The asset rules live in `agent_sandbox.manifests.release`; this module supplies `kubectl kustomize` (the
control plane's own kubectl, built once and cached) and writes the files.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from agent_sandbox.api.errortext import describe_error
from agent_sandbox.cli.output import inform
from agent_sandbox.devcluster import ensure_binaries
from agent_sandbox.manifests import REPO_ROOT, DriftError, check_drift, render_assets

#: An image tag as the OCI distribution spec and Docker define it: anything else renders an image reference
#: no registry accepts (`...:v1 0`), and the release would ship it.
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def release_command(args: argparse.Namespace) -> int:
    """Render the assets into `args.out` (`--tag`, `--registry`), or with `args.check` only check drift."""
    k8s = REPO_ROOT / "k8s"
    # Usage errors are the caller's to fix: one line and exit 2, as argparse reports them (not a traceback
    # from deep in the rendering). `--check` needs neither value.
    if not args.check:
        if not args.tag.strip():
            print("usage error: agent-sandbox release needs --tag (e.g. --tag v0.1.0)", file=sys.stderr)
            return 2
        if not _TAG.fullmatch(args.tag):
            print(
                f"usage error: --tag {args.tag!r} is not a valid image tag (letters, digits, '_', '.' and '-', "
                "at most 128, not starting with '.' or '-'; e.g. v0.1.0)",
                file=sys.stderr,
            )
            return 2
        if not args.registry.strip("/"):
            print(
                "usage error: --registry must name a registry, e.g. registry.k8s.io/agent-sandbox",
                file=sys.stderr,
            )
            return 2
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            print(f"usage error: --out {args.out} exists and is not a directory", file=sys.stderr)
            return 2
    try:
        if args.check:
            check_drift(k8s)
            inform("k8s/kustomization.yaml lists exactly the install files")  # the exit code is the answer
            return 0
        kubectl = ensure_binaries().path("kubectl")

        def kustomize(directory: Path) -> str:
            out = subprocess.run(
                [str(kubectl), "kustomize", str(directory)], capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                raise RuntimeError(f"kubectl kustomize {directory} failed: {out.stderr.strip()}")
            return out.stdout

        assets = render_assets(k8s, tag=args.tag, registry=args.registry, kustomize=kustomize)
    except DriftError as err:
        print(f"error: {describe_error(err)}", file=sys.stderr)
        return 1
    out_dir = Path(args.out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, text in assets.files.items():
            (out_dir / name).write_text(text, encoding="utf-8")
            inform(f"wrote {out_dir / name}")  # progress: dropped with a closed stdout (`release >&-`)
    except OSError as err:  # a parent that is a file, no permission, a full disk
        print(f"error: cannot write the release assets to {out_dir}: {describe_error(err)}", file=sys.stderr)
        return 1
    return 0
