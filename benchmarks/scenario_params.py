"""What a benchmark scenario is and how its parameters resolve.

Owns: `Scenario` (name, summary, default parameters, smoke preset, driver), `Params`, `resolve_params`
(defaults < smoke preset < `BENCH_<KEY>` environment < `--set key=value`, each coerced to the type of its
default) and `tuning_from_params` (the `Tuning` the common parameters ask for).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent_sandbox.devcluster.config import KWOK_POD_PARALLELISM, POD_DELETION_INSTANT

from .tuning import Tuning

__all__ = ["Params", "Scenario", "resolve_params", "tuning_from_params"]


Params = dict[str, Any]


@dataclass(frozen=True)
class Scenario:
    """One benchmark scenario: its parameters' defaults, its smoke preset and its driver."""

    name: str
    summary: str
    defaults: Mapping[str, Any]
    smoke: Mapping[str, Any]
    run: Callable[[Params], Awaitable[dict[str, Any]]]


def _coerce(value: str, like: Any) -> Any:
    if isinstance(like, bool):
        return value.lower() in ("1", "true", "yes", "on")
    if isinstance(like, int):
        return int(value)
    if isinstance(like, float):
        return float(value)
    return value


def resolve_params(
    scenario: Scenario,
    *,
    smoke: bool,
    overrides: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Params:
    """defaults < smoke preset < BENCH_<KEY> environment < explicit overrides (type of the default)."""
    params: Params = dict(scenario.defaults)
    if smoke:
        params.update(scenario.smoke)
    env = os.environ if environ is None else environ
    for key, default in scenario.defaults.items():
        raw = env.get(f"BENCH_{key.upper()}")
        if raw is not None:
            params[key] = _coerce(raw, default)
    for key, raw in (overrides or {}).items():
        if key not in scenario.defaults:
            raise KeyError(
                f"{scenario.name}: unknown parameter {key!r} (known: {', '.join(scenario.defaults)})"
            )
        params[key] = _coerce(raw, scenario.defaults[key])
    params["smoke"] = smoke
    return params


def tuning_from_params(p: Params, **changes: Any) -> Tuning:
    """The gate's `Tuning` with the common parameters (`nodes`, `controller_flags`, ...) and `changes`."""
    base = Tuning(
        nodes=int(p["nodes"]),
        serve_v1alpha1=bool(p.get("serve_v1alpha1", True)),
        apiserver_profiling=bool(p.get("apiserver_profile", False)),
        pod_deletion=str(p.get("pod_deletion", POD_DELETION_INSTANT)),
        kwok_pod_parallelism=int(p.get("kwok_pod_parallelism", KWOK_POD_PARALLELISM)),
        controller_binary=str(p.get("controller_binary", "")),
    )
    flags = tuple(f for f in str(p.get("controller_flags", "")).split() if f)
    return replace(base, extra_flags=flags, **changes)
