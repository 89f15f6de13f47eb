"""Warm claims that keep per-claim env (ours): when a claim with env may adopt a warm member, and what the
adopted (or cold) Sandbox's pod template then carries (controllers/claim/warmenv.py, shape.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from agent_sandbox.api.lifecycle import ANNOTATION_CLAIM_ENV, CLAIM_ENV_FIELD_PATH
from agent_sandbox.controllers.claim.adoption import adoption_patch
from agent_sandbox.controllers.claim.decide import Adopt, Create, Failed, NeedCandidate, Snapshot, resolve
from agent_sandbox.controllers.claim.errors import EnvVarsInjectionRejected, ReconcilerError
from agent_sandbox.controllers.claim.shape import build_cold_sandbox
from agent_sandbox.kube import apply_json_patch
from tests.unit.controllers.claim.builders import T0, claim, member, pool, template

pytestmark = pytest.mark.unit

ENV = [{"name": "API_KEY", "value": "k1"}, {"name": "MODE", "value": "fast"}]


def projecting(*, policy: str = "Allowed", mounted_in: tuple[str, ...] = ("main",), **extra: Any) -> Any:
    """A template whose containers in `mounted_in` see the claim env annotation through a downward API file."""
    containers = [
        {
            "name": name,
            "image": "busybox",
            **(
                {"volumeMounts": [{"name": "claim-env", "mountPath": "/var/run/agent-sandbox"}]}
                if name in mounted_in
                else {}
            ),
        }
        for name in ("main", "sidecar")
    ]
    volume = {
        "name": "claim-env",
        "downwardAPI": {"items": [{"path": "claim-env", "fieldRef": {"fieldPath": CLAIM_ENV_FIELD_PATH}}]},
    }
    tmpl = template(envVarsInjectionPolicy=policy, **extra)
    tmpl["spec"]["podTemplate"]["spec"] = {"containers": containers, "volumes": [volume]}
    return tmpl


def snap(cl: Any, tmpl: Any, **kw: Any) -> Snapshot:
    return Snapshot(claim=cl, pool=pool(), template=tmpl, now=T0 + timedelta(milliseconds=300), **kw)


def test_opted_in_template_keeps_a_claim_with_env_warm() -> None:
    tmpl = projecting()
    cl = claim(env=ENV)
    assert resolve(snap(cl, tmpl)) == NeedCandidate("ns/pool")
    cand = member("pool-a")
    res = resolve(snap(cl, tmpl, warm_consulted=True, candidate=cand))
    assert isinstance(res, Adopt)
    adopted = apply_json_patch(cand, res.ops)
    annotations = adopted["spec"]["podTemplate"]["metadata"]["annotations"]
    assert annotations[ANNOTATION_CLAIM_ENV] == '{"API_KEY":"k1","MODE":"fast"}'
    # The pod spec of the warm member is untouched: the env travels by annotation only.
    assert adopted["spec"]["podTemplate"]["spec"] == cand["spec"]["podTemplate"]["spec"]


def test_claim_without_env_gets_an_empty_delivery() -> None:
    cand = member("pool-a")
    res = resolve(snap(claim(), projecting(), warm_consulted=True, candidate=cand))
    assert isinstance(res, Adopt)
    adopted = apply_json_patch(cand, adoption_patch(claim(), cand, projecting()))
    assert adopted["spec"]["podTemplate"]["metadata"]["annotations"][ANNOTATION_CLAIM_ENV] == "{}"


def test_template_without_the_projection_stays_upstream_cold() -> None:
    res = resolve(snap(claim(env=ENV), template(envVarsInjectionPolicy="Allowed")))
    assert isinstance(res, Create)
    assert ANNOTATION_CLAIM_ENV not in res.body["spec"]["podTemplate"]["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("env", "mounted_in"),
    [
        ([{"name": "A", "value": "1", "containerName": "sidecar"}], ("main",)),  # target cannot see the file
        ([{"name": "A", "value": "1", "containerName": "main"}], ("sidecar",)),
        ([{"name": "A", "value": "1"}], ("sidecar",)),  # no containerName = the first container
    ],
)
def test_env_for_a_container_without_the_projection_goes_cold(
    env: list[dict[str, str]], mounted_in: tuple[str, ...]
) -> None:
    assert isinstance(resolve(snap(claim(env=env), projecting(mounted_in=mounted_in))), Create)


def test_a_policy_that_rejects_the_env_fails_the_same_way_as_a_cold_start() -> None:
    res = resolve(snap(claim(env=ENV), projecting(policy="Disallowed"), warm_consulted=True))
    assert isinstance(res, Failed)
    assert isinstance(res.error, EnvVarsInjectionRejected)


def test_cold_start_of_an_opted_in_template_carries_both() -> None:
    body = build_cold_sandbox(claim(env=ENV), projecting())
    main = body["spec"]["podTemplate"]["spec"]["containers"][0]
    assert {"name": "API_KEY", "value": "k1"} in main["env"]  # upstream's injection, unchanged
    assert (
        body["spec"]["podTemplate"]["metadata"]["annotations"][ANNOTATION_CLAIM_ENV]
        == '{"API_KEY":"k1","MODE":"fast"}'
    )


@pytest.mark.parametrize(
    ("policy", "env", "refused"),
    [
        ("Disallowed", [{"name": "INJECTED", "value": "yes"}], EnvVarsInjectionRejected),
        ("Allowed", [{"name": "BASE", "value": "hacked"}], ReconcilerError),  # an override Allowed forbids
        ("Allowed", [{"name": "INJECTED", "value": "yes"}], None),
        ("Disallowed", [], None),  # no env: the empty delivery
    ],
)
def test_an_env_edit_after_binding_obeys_the_templates_policy(
    policy: str, env: list[dict[str, str]], refused: type[Exception] | None
) -> None:
    """The annotation follows a bound claim's env edits; until December 6 they skipped
    envVarsInjectionPolicy, so a `Disallowed` template's pod ran injected and overridden variables."""
    from agent_sandbox.controllers.claim.shape import desired_pod_metadata

    tmpl = projecting(policy=policy)
    tmpl["spec"]["podTemplate"]["spec"]["containers"][0]["env"] = [{"name": "BASE", "value": "b"}]
    if refused is None:
        annotations = desired_pod_metadata(claim(env=env), tmpl)["annotations"]
        assert annotations[ANNOTATION_CLAIM_ENV] == ('{"INJECTED":"yes"}' if env else "{}")
    else:
        with pytest.raises(refused):
            desired_pod_metadata(claim(env=env), tmpl)
