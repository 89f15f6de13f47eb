"""Warm claims that keep per-claim env (ours, docs/lifecycle.md "Warm claims with env").

Upstream cold-starts every claim that carries `env`: a running warm Pod's spec cannot change. A template
that projects the pod annotation `runtime.agents.x-k8s.io/claim-env` into its runtime container (a downward
API volume) opts in: such a claim adopts a warm member like any other, the claim's env rides on the pod
template annotation (`shape.desired_pod_metadata`), and the runtime applies it to every command.

`warm_env_possible` says when that path is taken: the template projects the annotation into every container
the claim's env targets (no `containerName` = the first container, as upstream), and the template's
`envVarsInjectionPolicy` accepts the env exactly as a cold start would (same check, so a rejected env fails
the same way on both paths). Anything else goes cold, as upstream.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from agent_sandbox.api.lifecycle import claim_env_containers
from agent_sandbox.api.meta import ReadOnlyObject

from .errors import ClaimError
from .shape import inject_env

__all__ = ["warm_env_possible"]


def warm_env_possible(claim: ReadOnlyObject, template: ReadOnlyObject | None) -> bool:
    """The claim's env can be delivered to a warm member of `template` (module docstring)."""
    if template is None:
        return False
    env: list[Mapping[str, Any]] = list((claim.get("spec") or {}).get("env") or [])
    tspec = template.get("spec") or {}
    pod_spec = (tspec.get("podTemplate") or {}).get("spec") or {}
    containers = claim_env_containers(pod_spec)
    if not containers:
        return False
    first = str(((pod_spec.get("containers") or [{}])[0]).get("name", ""))
    if not {str(e.get("containerName") or first) for e in env} <= containers:
        return False
    try:
        inject_env(tspec, copy.deepcopy(dict(pod_spec)), env)
    except ClaimError:
        return False
    return True
