"""Which dev-cluster pods get a local runtime, and how it is configured (pure; the runner does the I/O).

Match rule (docs/devcluster.md "Local runner"): a pod gets a runtime when its annotation
`devcluster.agents.x-k8s.io/runtime` is "true", or when it has no such annotation ("false" opts out) and one
of its containers runs a runtime image: the image's repository name (last path segment, tag and digest
dropped) is `agent-sandbox-runtime` (this project's), `sandboxd`, `python-runtime-sandbox` or `sandbox-runtime`
(upstream's; the last is the name its examples build their runtime image under).
The same rule is rendered as a jq expression into the kwok stages, so kwok holds exactly these pods back
from Ready until the runner says their runtime answers.

The runtime is configured from the runtime container as a kubelet would run it: its `envFrom` and `env` (as
a kubelet builds them, Secrets and ConfigMaps included: pod_env.py) are the commands' environment and the
runtime's own (`SANDBOX_BASE_DIR`, `SANDBOX_EXEC_TIMEOUT_SECONDS`), its `args` (or `command` after the
program), `$(VAR)` expanded with that environment, are `agent-sandbox-runtime` flags, and a
PersistentVolumeClaim mounted at the root directory becomes the workspace. The root defaults to what the
image's own runtime serves: `/app` for upstream's legacy images (`_IMAGE_ROOTS`), `/workspace` otherwise.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent_sandbox.api.lifecycle import projects_claim_env
from agent_sandbox.devcluster.pod_env import EnvSources, container_env, expand_command

if TYPE_CHECKING:
    from agent_sandbox.runtime import RuntimeConfig

SIM_PREFIX = "devcluster.agents.x-k8s.io/"  # config.SIM_PREFIX (config imports this module)

__all__ = [
    "RUNTIME_ANNOTATION",
    "RUNTIME_IMAGE_NAMES",
    "RuntimePod",
    "image_name",
    "is_runtime_pod",
    "runtime_container",
    "runtime_pod",
    "runtime_pod_jq",
]

RUNTIME_ANNOTATION = SIM_PREFIX + "runtime"
#: The runtime images (repository names) and the root each one's own runtime serves when neither `--root-dir`
#: nor `SANDBOX_BASE_DIR` says (None: ours, `/workspace`). Upstream's legacy python-runtime (spec
#: sdk-router-runtime §2.1) serves `$SANDBOX_BASE_DIR` or `/app`, and its manifests mount the workspace PVC at
#: `/app`: served from our `/workspace`, that PVC was never the workspace and files were lost on suspend.
#: `_FLAG_ONLY`: upstream's sandboxd (§2.2) has only `--root-dir` (default `/workspace`) and does not read
#: `SANDBOX_BASE_DIR` (ours does: it serves both APIs).
_FLAG_ONLY = ""
_IMAGE_ROOTS: Mapping[str, str | None] = {
    "agent-sandbox-runtime": None,
    "sandboxd": _FLAG_ONLY,
    "python-runtime-sandbox": "/app",
    "sandbox-runtime": "/app",
}
RUNTIME_IMAGE_NAMES = tuple(_IMAGE_ROOTS)
_PROGRAMS = ("agent-sandbox-runtime", "sandboxd")
_BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
Pod = Mapping[str, Any]


def image_name(image: str) -> str:
    """Repository name of an image reference: `reg:5000/a/b:tag@sha256:..` -> `b`."""
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def _containers(pod: Pod) -> list[Mapping[str, Any]]:
    return list((pod.get("spec") or {}).get("containers") or [])


def _opt_in(pod: Pod) -> str | None:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(RUNTIME_ANNOTATION)
    return value if isinstance(value, str) else None


def is_runtime_pod(pod: Pod) -> bool:
    """The match rule above."""
    opt = _opt_in(pod)
    if opt == "true":
        return True
    if opt == "false":
        return False
    return any(image_name(str(c.get("image", ""))) in RUNTIME_IMAGE_NAMES for c in _containers(pod))


def runtime_pod_jq() -> str:
    """`is_runtime_pod` as a jq program yielding "yes"/"no" (for kwok Stage selectors; no single quotes)."""
    names = " or ".join(f'. == "{n}"' for n in RUNTIME_IMAGE_NAMES)
    return (
        f'(.metadata.annotations["{RUNTIME_ANNOTATION}"] // "") as $opt | '
        'if $opt == "true" then "yes" elif $opt == "false" then "no" '
        'elif ([.spec.containers[].image | sub("@.*$"; "") | split("/") | last | split(":") | first] '
        f'| any({names})) then "yes" else "no" end'
    )


@dataclass(frozen=True, slots=True)
class RuntimePod:
    """How to run one pod's runtime: which container, with what flags, environment and workspace."""

    container: str
    config: RuntimeConfig  # root_dir is the path inside the "container" (e.g. /workspace)
    env: dict[str, str]
    claim: str | None  # PVC mounted at the root directory, if any
    sub_path: str = ""
    problems: list[str] = field(default_factory=list)  # flags the runner could not use (logged)
    claim_env: bool = False  # the runtime's --claim-env-file is a downward API projection of the claim env


def _runtime_container(pod: Pod) -> Mapping[str, Any]:
    containers = _containers(pod)
    for c in containers:
        if image_name(str(c.get("image", ""))) in RUNTIME_IMAGE_NAMES:
            return c
    return containers[0] if containers else {}


def _flags(command: list[str], args: list[str]) -> list[str]:
    if command and posixpath.basename(command[0]) in _PROGRAMS:
        return command[1:] + args
    return args if not command else []


def _environment(pod: Pod, declared: Mapping[str, str], base: Mapping[str, str]) -> dict[str, str]:
    env = {"PATH": base.get("PATH", _BASE_PATH), "LANG": base.get("LANG", "C.UTF-8")}
    env["HOSTNAME"] = str((pod.get("metadata") or {}).get("name", ""))
    env.update(declared)  # as a kubelet builds it (pod_env.py)
    return env


def _claim_at(pod: Pod, container: Mapping[str, Any], root: str) -> tuple[str | None, str]:
    claims = {
        v.get("name"): (v.get("persistentVolumeClaim") or {}).get("claimName")
        for v in (pod.get("spec") or {}).get("volumes") or []
    }
    for mount in container.get("volumeMounts") or []:
        if posixpath.normpath(str(mount.get("mountPath", ""))) == posixpath.normpath(root):
            claim = claims.get(mount.get("name"))
            if claim:
                return str(claim), str(mount.get("subPath") or "")
    return None, ""


def runtime_container(pod: Pod) -> Mapping[str, Any]:
    """The container the runtime stands for (the one with a runtime image, else the first)."""
    return _runtime_container(pod)


def runtime_pod(pod: Pod, *, base_env: Mapping[str, str], sources: EnvSources | None = None) -> RuntimePod:
    """Read the runtime container of a pod that `is_runtime_pod`.

    `sources`: the ConfigMaps, Secrets and node allocatable its environment reads (pod_env.references);
    None: those are not read (their entries left out).

    Raises:
        ContainerConfigError: a Secret, ConfigMap or key it needs is missing: the container cannot start.
    """
    from agent_sandbox.runtime import parse_args  # the runtime (aiohttp, grpc) only where it runs

    container = _runtime_container(pod)
    declared = container_env(pod, container, sources)
    problems: list[str] = []
    flags = _flags(*expand_command(container, declared))
    # The runtime reads SANDBOX_BASE_DIR / SANDBOX_EXEC_TIMEOUT_SECONDS from its environment: the
    # container's, not the runner's. An image whose runtime has another default root gets it as the base
    # dir when the container sets none (blank counts as none, as upstream's runtime reads it); only for
    # parsing - the commands' environment stays what the container declares. sandboxd's
    # binary does not read SANDBOX_BASE_DIR.
    parse_env = dict(declared)
    image_root = _IMAGE_ROOTS.get(image_name(str(container.get("image", ""))))
    if image_root == _FLAG_ONLY:
        parse_env.pop("SANDBOX_BASE_DIR", None)
    elif image_root and not parse_env.get("SANDBOX_BASE_DIR", "").strip():
        parse_env["SANDBOX_BASE_DIR"] = image_root
    try:
        config, _ = parse_args(flags, environ=parse_env)
    except SystemExit:  # argparse already printed why; keep the defaults rather than not serving at all
        problems.append(f"unusable runtime flags {flags!r}; using the defaults")
        config, _ = parse_args([], environ=parse_env)
    root = str(config.root_dir)
    claim, sub_path = _claim_at(pod, container, root)
    return RuntimePod(
        container=str(container.get("name", "")),
        config=config,
        env=_environment(pod, declared, base_env),
        claim=claim,
        sub_path=sub_path,
        problems=problems,
        claim_env=projects_claim_env(pod.get("spec") or {}, container, config.claim_env_file),
    )


def unready_containers(pod: Pod) -> Sequence[str]:
    return [str(c.get("name", "")) for c in _containers(pod)]
