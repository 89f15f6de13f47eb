"""Objects the API server accepts but nobody tried: generated templates, pools and claims against the real
controller process.

Each example creates a SandboxTemplate (env, volume claim templates with duplicate or empty names,
injection policies, service, network policy, service-account token, reserved-prefix pod labels), a
SandboxWarmPool of it (or of a missing template) and a SandboxClaim (env for existing, missing and init
containers, volume claim templates overlapping the template's, reserved and ordinary pod metadata,
lifecycle in the past or future). What must hold for any of them:

* the claim gets a Ready condition (True, or False with a reason) within the bound: nothing is left
  without an answer;
* the controller logs no Python error (a bug type such as KeyError or TypeError in a reconciler or an
  informer handler): odd input is a condition, never a crash loop.
"""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import (
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    ApiClient,
    NotFound,
    Object,
    ResourceKind,
)
from tests.helpers import eventually, fuzz_settings
from tests.integration.controllers.builders import claim_body, pool_body

pytestmark = pytest.mark.integration

FUZZ = fuzz_settings("ODD_OBJECTS_EXAMPLES", 25)

BUG_TYPES = (
    "KeyError",
    "TypeError",
    "AttributeError",
    "IndexError",
    "ValueError",
    "AssertionError",
    "UnboundLocalError",
    "ZeroDivisionError",
    "RecursionError",
    "NameError",
)

_names = itertools.count()


def python_errors(log_text: str) -> list[str]:
    """Log records of the controller that carry a Python bug type (JSON lines; others ignored)."""
    found = []
    for line in log_text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            if any(f"{t}:" in line for t in BUG_TYPES) or "Traceback" in line:
                found.append(line)
            continue
        text = f"{entry.get('error', '')}\n{entry.get('stacktrace', '')}"
        if any(f"{t}:" in text or f"{t}(" in text for t in BUG_TYPES):
            found.append(line[:2000])
    return found


NAMES = st.sampled_from(["data", "data", "cache", "", "x" * 63])
ENV_NAMES = st.sampled_from(["A", "PATH", "A", "_X", "a.b"])
CONTAINERS = st.sampled_from([None, "main", "side", "init", "missing"])
LABEL_KEYS = st.sampled_from(
    ["app", "agents.x-k8s.io/pod-name", "extensions.agents.x-k8s.io/x", "sandbox.users.io/team", "a.b/c"]
)
PVC_SPEC = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}


def _pvcs(names: list[str]) -> list[Object]:
    return [{"metadata": {"name": n} if n else {}, "spec": PVC_SPEC} for n in names]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Object, Object, Object]:
    n = next(_names)
    tmpl, pool, claim = f"t{n}", f"p{n}", f"c{n}"
    containers: list[Object] = [{"name": "main", "image": "busybox", "env": [{"name": "A", "value": "t"}]}]
    if draw(st.booleans()):
        containers.append({"name": "side", "image": "busybox"})
    pod: dict[str, Any] = {"containers": containers}
    if draw(st.booleans()):
        pod["initContainers"] = [{"name": "init", "image": "busybox"}]
    token = draw(st.sampled_from([None, True, False]))
    if token is not None:
        pod["automountServiceAccountToken"] = token
    spec: dict[str, Any] = {
        "podTemplate": {
            "metadata": {"labels": draw(st.dictionaries(LABEL_KEYS, st.sampled_from(["v", ""]), max_size=2))},
            "spec": pod,
        },
        "envVarsInjectionPolicy": draw(st.sampled_from(["Allowed", "Overrides", "Disallowed"])),
        "volumeClaimTemplatesPolicy": draw(st.sampled_from(["Allowed", "Overrides", "Disallowed"])),
        "networkPolicyManagement": draw(st.sampled_from(["Managed", "Unmanaged"])),
    }
    if vcts := draw(st.lists(NAMES, max_size=2)):
        spec["volumeClaimTemplates"] = _pvcs(vcts)
    service = draw(st.sampled_from([None, True, False]))
    if service is not None:
        spec["service"] = service
    if draw(st.booleans()):
        spec["networkPolicy"] = {"ingress": [], "egress": draw(st.sampled_from([[], [{}]]))}
    template = {
        "apiVersion": SANDBOX_TEMPLATE.api_version,
        "kind": "SandboxTemplate",
        "metadata": {"name": tmpl},
    }
    template["spec"] = spec
    pool_template = draw(st.sampled_from([tmpl, tmpl, tmpl, "missing-template"]))
    warm_pool = pool_body(pool, draw(st.integers(0, 2)), pool_template)
    claim_spec: dict[str, Any] = {}
    if env := draw(st.lists(st.tuples(ENV_NAMES, CONTAINERS), max_size=3)):
        claim_spec["env"] = [
            {"name": name, "value": "c", **({"containerName": cn} if cn else {})} for name, cn in env
        ]
    if vcts := draw(st.lists(NAMES, max_size=2)):
        claim_spec["volumeClaimTemplates"] = _pvcs(vcts)
    if draw(st.booleans()):
        claim_spec["additionalPodMetadata"] = {
            "labels": draw(st.dictionaries(LABEL_KEYS, st.just("v"), max_size=2)),
            "annotations": draw(st.dictionaries(LABEL_KEYS, st.just("v"), max_size=2)),
        }
    if draw(st.booleans()):
        when = datetime.now(UTC) + timedelta(seconds=draw(st.sampled_from([-3600, -1, 2, 3600])))
        lifecycle: dict[str, Any] = {"shutdownTime": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
        if draw(st.booleans()):
            lifecycle["shutdownPolicy"] = draw(st.sampled_from(["Delete", "DeleteForeground", "Retain"]))
        if draw(st.booleans()):
            lifecycle["ttlSecondsAfterFinished"] = 0
        claim_spec["lifecycle"] = lifecycle
    return template, warm_pool, claim_body(claim, pool, **claim_spec)


def _ready(obj: Object) -> Object | None:
    return next(
        (cd for cd in (obj.get("status") or {}).get("conditions") or () if cd["type"] == "Ready"), None
    )


async def answered(kube: ApiClient, kind: ResourceKind, name: str, namespace: str) -> Object | bool:
    """The object's Ready condition once it has one (within 30 s), or True if it was deleted first (an
    expired one with a Delete policy: an answer too)."""

    async def probe() -> Object | bool | None:
        try:
            return _ready(await kube.get(kind, name, namespace=namespace))
        except NotFound:
            return True

    return await eventually(probe, f"a Ready condition on {kind.kind} {name}", within=30)


@FUZZ
@given(scenario=scenarios())
async def test_odd_but_accepted_objects(
    kube: ApiClient, namespace: str, controller: Started, scenario: tuple[Object, Object, Object]
) -> None:
    template, pool, claim = scenario
    await kube.create(SANDBOX_TEMPLATE, template, namespace=namespace)
    await kube.create(SANDBOX_WARM_POOL, pool, namespace=namespace)
    name = claim["metadata"]["name"]
    await kube.create(SANDBOX_CLAIM, claim, namespace=namespace)

    ready = await answered(kube, SANDBOX_CLAIM, name, namespace)
    event(
        f"Ready {ready['status']} {ready.get('reason')} {ready.get('message', '')[:150]}"
        if isinstance(ready, dict)
        else "claim deleted"
    )
    errors = python_errors(controller.log.read_text(errors="replace"))
    assert not errors, errors[:3]


# Names a Sandbox may have (DNS subdomain, up to 253) that its children cannot all have: a Service name is a
# DNS label (63, starts with a letter), PVC names add the claim template's name, pod names feed a hostname.
SANDBOX_NAMES = st.sampled_from(
    ["s", "1starts-with-digit", "has.dots.in.it", "x" * 63, "y" * 64, "z" * 200, "a." * 60 + "b"]
)


@st.composite
def sandboxes(draw: st.DrawFn) -> Object:
    n = next(_names)
    base = draw(SANDBOX_NAMES)
    name = f"{base}{n}" if len(base) < 250 else f"{base[:248]}{n}"
    spec: dict[str, Any] = {
        "podTemplate": {
            "metadata": {"labels": draw(st.dictionaries(LABEL_KEYS, st.sampled_from(["v", ""]), max_size=2))},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        }
    }
    service = draw(st.sampled_from([None, True, False]))
    if service is not None:
        spec["service"] = service
    if vcts := draw(st.lists(st.sampled_from(["data", "d" * 63]), max_size=2, unique=True)):
        spec["volumeClaimTemplates"] = _pvcs(vcts)
    mode = draw(st.sampled_from([None, "Running", "Suspended"]))
    if mode:
        spec["operatingMode"] = mode
    if draw(st.booleans()):
        when = datetime.now(UTC) + timedelta(seconds=draw(st.sampled_from([-3600, 2, 3600])))
        spec["shutdownTime"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        spec["shutdownPolicy"] = draw(st.sampled_from(["Delete", "Retain"]))
    return {"apiVersion": SANDBOX.api_version, "kind": "Sandbox", "metadata": {"name": name}, "spec": spec}


@FUZZ
@given(sandbox=sandboxes())
async def test_odd_but_accepted_sandboxes(
    kube: ApiClient, namespace: str, controller: Started, sandbox: Object
) -> None:
    name = sandbox["metadata"]["name"]
    await kube.create(SANDBOX, sandbox, namespace=namespace)

    ready = await answered(kube, SANDBOX, name, namespace)
    if isinstance(ready, dict):
        event(f"Ready {ready['status']} {ready.get('reason')} {ready.get('message', '')[:120]}")
    errors = python_errors(controller.log.read_text(errors="replace"))
    assert not errors, errors[:3]
