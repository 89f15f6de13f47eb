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

__all__ = ["ParamError", "Params", "Scenario", "resolve_params", "tuning_from_params"]


Params = dict[str, Any]


@dataclass(frozen=True)
class Scenario:
    """One benchmark scenario: its parameters' defaults, its smoke preset and its driver."""

    name: str
    summary: str
    defaults: Mapping[str, Any]
    smoke: Mapping[str, Any]
    run: Callable[[Params], Awaitable[dict[str, Any]]]


class ParamError(ValueError):
    """A parameter the scenario does not have, or a value its type cannot take (a usage error: exit 2)."""


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _coerce(value: str, like: Any) -> Any:
    """`value` as the type of the default `like` (ValueError naming the expected type)."""
    if isinstance(like, bool):
        if value.strip().lower() in _TRUE:
            return True
        if value.strip().lower() in _FALSE:
            return False
        raise ValueError(f"expects a boolean ({'/'.join(_TRUE)} or {'/'.join(_FALSE[:-1])})")
    try:
        if isinstance(like, int):
            return int(value)
        if isinstance(like, float):
            return float(value)
    except ValueError:
        raise ValueError(f"expects {'an integer' if isinstance(like, int) else 'a number'}") from None
    return value


def _value(scenario: Scenario, key: str, raw: str, source: str) -> Any:
    try:
        return _coerce(raw, scenario.defaults[key])
    except ValueError as exc:
        raise ParamError(
            f"{source}: {scenario.name} parameter {key!r} {exc}, got {raw!r} "
            f"(default {scenario.defaults[key]!r})"
        ) from None


def resolve_params(
    scenario: Scenario,
    *,
    smoke: bool,
    overrides: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Params:
    """defaults < smoke preset < BENCH_<KEY> environment < explicit overrides (type of the default).

    Raises:
        ParamError: an override names a parameter the scenario does not have (the message lists the ones it
            has), or a value does not fit the parameter's type (the message names the parameter and where
            the value came from).
    """
    params: Params = dict(scenario.defaults)
    if smoke:
        params.update(scenario.smoke)
    env = os.environ if environ is None else environ
    for key in scenario.defaults:
        variable = f"BENCH_{key.upper()}"
        raw = env.get(variable)
        if raw is not None:
            params[key] = _value(scenario, key, raw, variable)
    for key, raw in (overrides or {}).items():
        if key not in scenario.defaults:
            raise ParamError(
                f"--set {key}: {scenario.name} has no parameter {key!r} "
                f"(its parameters: {', '.join(scenario.defaults)})"
            )
        params[key] = _value(scenario, key, raw, f"--set {key}")
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
