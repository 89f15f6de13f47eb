"""Release assets (operations spec §3): ``sandbox.yaml``, ``extensions.yaml``, ``sandbox-with-extensions.yaml``.

Owns: which ``k8s/`` files go into which asset and in what order, image substitution, and the drift guard
between the globbed files and ``k8s/kustomization.yaml``. Upstream's rules, reproduced:

* ``sandbox.yaml``: every install file whose basename does not contain ``extensions``, sorted by path, each
  followed by a document separator; ``extensions.yaml``: those whose basename does; kustomization files
  never. ``sandbox-with-extensions.yaml`` is ``kubectl kustomize k8s`` (the caller supplies the renderer).
* On every line holding an image placeholder, the placeholder and the rest of the line become
  ``<registry>/agent-sandbox-controller:<tag>``.
* The set of globbed files minus ``extensions.controller.yaml`` must equal the kustomization's resources.

One deliberate difference: upstream globs ``k8s/**/*.yaml``; we glob ``k8s/*.yaml`` and ``k8s/crds/*.yaml``,
because the other sub-directories of ``k8s/`` are optional kustomize components (the router), which upstream
keeps outside ``k8s/``. They become a fourth asset, ``sandbox-router.yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml

__all__ = [
    "CONTROLLER_PLACEHOLDER",
    "DEFAULT_REGISTRY",
    "ROUTER_PLACEHOLDER",
    "Assets",
    "DriftError",
    "check_drift",
    "install_files",
    "render_assets",
    "router_files",
    "substitute_images",
]

CONTROLLER_PLACEHOLDER: Final = "ko://sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller"
ROUTER_PLACEHOLDER: Final = "ko://sigs.k8s.io/agent-sandbox/cmd/sandbox-router"
DEFAULT_REGISTRY: Final = "registry.k8s.io/agent-sandbox"
_NOT_A_RESOURCE: Final = "extensions.controller.yaml"

Kustomize = Callable[[Path], str]


class DriftError(RuntimeError):
    """``k8s/kustomization.yaml`` and the install files disagree (a file added to one and not the other)."""


@dataclass(frozen=True, slots=True)
class Assets:
    """The rendered release assets, by file name."""

    files: dict[str, str]


def _is_kustomization(path: Path) -> bool:
    return path.name in ("kustomization.yaml", "kustomization.yml", "Kustomization")


def install_files(k8s: Path) -> list[Path]:
    """The install manifests: ``k8s/*.yaml`` and ``k8s/crds/*.yaml`` minus kustomization files, sorted."""
    found = [*k8s.glob("*.yaml"), *(k8s / "crds").glob("*.yaml")]
    return sorted((p for p in found if not _is_kustomization(p)), key=lambda p: p.relative_to(k8s).as_posix())


def router_files(k8s: Path) -> list[Path]:
    """The router component's manifests (``k8s/router/*.yaml`` minus its kustomization), sorted."""
    return sorted(p for p in (k8s / "router").glob("*.yaml") if not _is_kustomization(p))


def check_drift(k8s: Path) -> None:
    """Raise ``DriftError`` when the globbed files and the kustomization's resources differ."""
    kustomization = yaml.safe_load((k8s / "kustomization.yaml").read_text())
    listed = {str(r) for r in kustomization.get("resources") or ()}
    globbed = {p.relative_to(k8s).as_posix() for p in install_files(k8s) if p.name != _NOT_A_RESOURCE}
    if listed != globbed:
        raise DriftError(
            "k8s/kustomization.yaml resources and the install files differ: "
            f"only in files {sorted(globbed - listed)}, only in kustomization {sorted(listed - globbed)}"
        )


def substitute_images(text: str, *, tag: str, registry: str = DEFAULT_REGISTRY) -> str:
    """Replace each image placeholder, and anything after it on its line, with the released image."""
    for placeholder, image in (
        (CONTROLLER_PLACEHOLDER, "agent-sandbox-controller"),
        (ROUTER_PLACEHOLDER, "sandbox-router"),
    ):
        text = re.sub(re.escape(placeholder) + r".*$", f"{registry}/{image}:{tag}", text, flags=re.MULTILINE)
    return text


def _concat(paths: list[Path]) -> str:
    return "".join(p.read_text(encoding="utf-8").rstrip("\n") + "\n---\n" for p in paths)


def render_assets(k8s: Path, *, tag: str, kustomize: Kustomize, registry: str = DEFAULT_REGISTRY) -> Assets:
    """Render the release assets from ``k8s`` (drift-checked first).

    Args:
        k8s: the ``k8s/`` directory.
        tag: the release tag, e.g. ``v0.1.0`` (becomes the image tag).
        kustomize: renders a kustomization directory (``kubectl kustomize <dir>``).
        registry: image registry prefix.

    Raises:
        DriftError: see ``check_drift``.
        ValueError: an empty tag.
    """
    if not tag.strip():
        raise ValueError("a release needs a non-empty tag (e.g. v0.1.0)")
    # `reg.example/x/` is the same prefix as `reg.example/x`; joined as is it would make an image reference
    # with `//`, which no registry serves.
    registry = registry.rstrip("/")
    if not registry:
        raise ValueError("a release needs a registry prefix (e.g. registry.k8s.io/agent-sandbox)")
    check_drift(k8s)
    files = install_files(k8s)
    core = [p for p in files if "extensions" not in p.name]
    extensions = [p for p in files if "extensions" in p.name]
    raw = {
        "sandbox.yaml": _concat(core),
        "extensions.yaml": _concat(extensions),
        "sandbox-with-extensions.yaml": kustomize(k8s),
        "sandbox-router.yaml": _concat(router_files(k8s)),
    }
    return Assets({name: substitute_images(text, tag=tag, registry=registry) for name, text in raw.items()})
