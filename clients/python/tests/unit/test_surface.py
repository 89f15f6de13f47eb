"""The public surface: a drop-in for upstream 1.0.8 (checked against a snapshot of its signatures), and
the sync and async classes stay twins.

`upstream_surface_1_0_8.json` was extracted from the published wheel by `inspect` (names, parameter
kinds, defaults, async-ness, model fields, exception bases).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

import agent_sandbox_sdk as sdk
from agent_sandbox_sdk import exceptions, metrics, models

pytestmark = pytest.mark.unit

UPSTREAM = json.loads((Path(__file__).parent / "upstream_surface_1_0_8.json").read_text())
CLASSES = {
    "SandboxClient": sdk.SandboxClient,
    "AsyncSandboxClient": sdk.AsyncSandboxClient,
    "Sandbox": sdk.Sandbox,
    "AsyncSandbox": sdk.AsyncSandbox,
    "CommandExecutor": sdk.CommandExecutor,
    "AsyncCommandExecutor": sdk.AsyncCommandExecutor,
    "Filesystem": sdk.Filesystem,
    "AsyncFilesystem": sdk.AsyncFilesystem,
}
#: Engine constructors are internal in both SDKs (handles build them).
INTERNAL = {
    "CommandExecutor.__init__",
    "AsyncCommandExecutor.__init__",
    "Filesystem.__init__",
    "AsyncFilesystem.__init__",
}


def _params(fn: Any) -> list[list[Any]]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self":
            continue
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        out.append([p.name, p.kind.name, default])
    return out


def test_every_upstream_top_level_name_exists() -> None:
    missing = [name for name in UPSTREAM["top_level"] if not hasattr(sdk, name)]
    assert not missing


@pytest.mark.parametrize("cls_name", sorted(CLASSES))
def test_methods_accept_upstream_calls(cls_name: str) -> None:
    ours = CLASSES[cls_name]
    problems = []
    for name, spec in UPSTREAM["classes"][cls_name].items():
        if f"{cls_name}.{name}" in INTERNAL:
            continue
        member = inspect.getattr_static(ours, name, None)
        if member is None:
            problems.append(f"{name}: missing")
            continue
        if spec == "property":
            if not isinstance(member, property):
                problems.append(f"{name}: not a property")
            continue
        fn = getattr(ours, name)
        if inspect.iscoroutinefunction(fn) != spec["async"]:
            problems.append(f"{name}: async should be {spec['async']}")
        mine = {p[0]: p for p in _params(fn)}
        theirs = spec["params"]
        for pname, kind, default in theirs:
            if pname not in mine:
                problems.append(f"{name}({pname}): missing")
                continue
            if mine[pname][2] != default:
                problems.append(f"{name}({pname}): default {mine[pname][2]} != upstream {default}")
            if (mine[pname][1] == "KEYWORD_ONLY") != (kind == "KEYWORD_ONLY"):
                problems.append(f"{name}({pname}): kind {mine[pname][1]} != upstream {kind}")
        positional_theirs = [p[0] for p in theirs if p[1] == "POSITIONAL_OR_KEYWORD"]
        positional_mine = [p[0] for p in _params(fn) if p[1] == "POSITIONAL_OR_KEYWORD"]
        if positional_mine[: len(positional_theirs)] != positional_theirs:
            problems.append(f"{name}: positional order {positional_mine} != upstream {positional_theirs}")
        extra_required = [p[0] for p in _params(fn) if p[0] not in {t[0] for t in theirs} and p[2] is None]
        if extra_required:
            problems.append(f"{name}: new required parameters {extra_required}")
    assert not problems


@pytest.mark.parametrize("model", sorted(UPSTREAM["models"]))
def test_model_fields_and_defaults_match(model: str) -> None:
    ours = getattr(models, model).model_fields
    for field, default in UPSTREAM["models"][model].items():
        assert field in ours, f"{model}.{field}"
        assert repr(ours[field].default) == default, f"{model}.{field}"


def test_exception_tree_contains_upstreams() -> None:
    for name, bases in UPSTREAM["exceptions"].items():
        ours = getattr(exceptions, name)
        mro = [b.__name__ for b in ours.__mro__]
        assert all(b in mro for b in bases), f"{name}: {mro}"


@pytest.mark.parametrize(("sync", "asyn"), [
    (sdk.SandboxClient, sdk.AsyncSandboxClient),
    (sdk.Sandbox, sdk.AsyncSandbox),
    (sdk.CommandExecutor, sdk.AsyncCommandExecutor),
    (sdk.Filesystem, sdk.AsyncFilesystem),
    (sdk.CommandStream, sdk.AsyncCommandStream),
])  # fmt: skip
def test_sync_and_async_twins_expose_the_same_methods(sync: type, asyn: type) -> None:
    def public(cls: type) -> dict[str, Any]:
        return {
            n: m
            for n, m in vars(cls).items()
            if not n.startswith("_") and (callable(m) or isinstance(m, property))
        }

    ours, theirs = public(sync), public(asyn)
    assert set(ours) == set(theirs)
    for name, member in ours.items():
        if isinstance(member, property) or name == "sandbox_class":
            continue
        assert _params(member) == _params(theirs[name]), name


def test_metrics_render_prometheus_text() -> None:
    metrics.observe("sandbox_client_suspend_latency_ms", 180.0, status="success")
    text = sdk.get_metrics()
    assert "# TYPE sandbox_client_suspend_latency_ms histogram" in text
    assert 'sandbox_client_suspend_latency_ms_bucket{status="success",le="250.0"}' in text
    assert 'sandbox_client_suspend_latency_ms_count{status="success"}' in text
