"""Conversion snapshots as untrusted input, their size, and claims whose status is rewritten (api spec §8).

The state annotations are writable by anyone who may edit the v1beta1 object, and v1alpha1 `/status`
writes reach the to-hub conversion with a status the client chose: neither may make the conversion fail,
return values the v1alpha1 schema (or the JSON encoder) refuses, or move a claim's `spec.warmPoolRef`.
"""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import orjson
import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api.conversion import convert_review, to_hub, to_spoke

pytestmark = pytest.mark.unit

POD = {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}
SANDBOX_STATE = c.ANNOTATION_V1ALPHA1_SANDBOX_STATE
CLAIM_STATE = c.ANNOTATION_V1ALPHA1_SANDBOXCLAIM_STATE


def beta_sandbox(state: str | None = None, mode: str = "Running") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "sb", "namespace": "ns"}
    if state is not None:
        meta["annotations"] = {SANDBOX_STATE: state}
    return {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "metadata": meta,
            "spec": {"podTemplate": POD, "operatingMode": mode}}  # fmt: skip


def beta_claim(pool: str, state: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "my-claim", "namespace": "ns"}
    if state is not None:
        meta["annotations"] = {CLAIM_STATE: state}
    return {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim", "metadata": meta,
            "spec": {"warmPoolRef": {"name": pool}}, **extra}  # fmt: skip


def alpha_claim(warmpool: str | None = None, template: str = "tpl", **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"sandboxTemplateRef": {"name": template}}
    if warmpool is not None:
        spec["warmpool"] = warmpool
    return {"apiVersion": "extensions.agents.x-k8s.io/v1alpha1", "kind": "SandboxClaim",
            "metadata": {"name": "my-claim", "namespace": "ns", **meta}, "spec": spec}  # fmt: skip


def review(obj: dict[str, Any], desired: str) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "u-1", "desiredAPIVersion": desired, "objects": [obj]}}  # fmt: skip


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# ---------------------------------------------------------------------------
# 1. Hostile snapshots are ignored, never a failure and never an unencodable answer
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    [
        '{"spec":{"replicas":1},"status":{"replicas":99999999999999999999999}}',  # Go's unmarshal fails
        '{"spec":{"replicas":1},"status":{"replicas":5000000000}}',  # the scale showed it cut to 32 bits
        '{"spec":{"replicas":1},"status":{"replicas":2147483648}}',
        '{"spec":{"replicas":1},"status":{"replicas":1.5}}',
        '{"spec":' + nested(3000) + "}",  # RecursionError in the JSON parser
        '{"spec":{"replicas":' + nested(800) + "}}",
    ],
    ids=["1e22", "5e9", "2^31", "float", "nested-3000", "nested-800"],
)
def test_a_sandbox_snapshot_out_of_range_or_too_deep_is_ignored(state: str) -> None:
    plain = to_spoke(beta_sandbox())
    hub = beta_sandbox(state)
    answer = convert_review(review(hub, "agents.x-k8s.io/v1alpha1"))
    assert answer["response"]["result"] == {"status": "Success"}
    assert answer["response"]["convertedObjects"] == [plain]
    orjson.dumps(answer)


def test_the_largest_int32_status_replicas_of_an_upstream_snapshot_is_honoured() -> None:
    alpha = to_spoke(beta_sandbox('{"status":{"replicas":2147483647}}'))
    assert alpha["status"]["replicas"] == 2**31 - 1


@pytest.mark.parametrize(
    "state",
    [
        '{"spec":{"sandboxTemplateRef":{"name":"\\ud800"}}}',  # a lone surrogate orjson cannot encode
        '{"spec":{"sandboxTemplateRef":{"name":"tpl"},"warmpool":"\\udfff"}}',
        '{"spec":{"sandboxTemplateRef":{"name":"tpl"},"warmpool":' + nested(900) + "}}",
        '{"spec":{"sandboxTemplateRef":{"name":' + nested(900) + "}}}",
        '{"spec":{"sandboxTemplateRef":{}}}',  # no name: the v1alpha1 schema requires one
        '{"spec":{"sandboxTemplateRef":{"name":null}}}',
        '{"spec":' + nested(5000) + "}",
    ],
    ids=[
        "surrogate-name",
        "surrogate-warmpool",
        "deep-warmpool",
        "deep-name",
        "no-name",
        "null-name",
        "deep",
    ],
)
def test_an_unusable_claim_snapshot_is_ignored(state: str) -> None:
    plain = to_spoke(beta_claim("shadow-pool-tpl"))
    answer = convert_review(
        review(beta_claim("shadow-pool-tpl", state), "extensions.agents.x-k8s.io/v1alpha1")
    )
    assert answer["response"]["result"] == {"status": "Success"}
    assert answer["response"]["convertedObjects"] == [plain]
    orjson.dumps(answer)


def test_only_the_name_of_a_snapshot_template_ref_is_restored() -> None:
    """Upstream's typed unmarshal keeps `name` only; copying the snapshot's object whole returned whatever
    it held - a 300-deep value made the answer unencodable (orjson's depth limit), a 500 for every list."""
    state = json.dumps({"spec": {"sandboxTemplateRef": {"name": "t", "x": json.loads(nested(300))},
                                 "warmpool": "default"}})  # fmt: skip
    answer = convert_review(review(beta_claim("shadow-pool-t", state), "extensions.agents.x-k8s.io/v1alpha1"))
    (alpha,) = answer["response"]["convertedObjects"]
    assert alpha["spec"]["sandboxTemplateRef"] == {"name": "t"}
    assert alpha["spec"]["warmpool"] == "default"
    orjson.dumps(answer)


def test_an_object_too_deep_to_copy_is_a_failure_not_an_exception() -> None:
    deep: Any = {}
    for _ in range(3000):
        deep = {"a": deep}
    obj = {"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Sandbox", "metadata": {"name": "x"},
           "spec": {"podTemplate": {"spec": deep}}}  # fmt: skip
    answer = convert_review(review(obj, "agents.x-k8s.io/v1beta1"))
    result = answer["response"]["result"]
    assert result["status"] == "Failure"
    assert "RecursionError" in result["message"]
    assert answer["response"]["convertedObjects"] == []


# ---------------------------------------------------------------------------
# 3. A claim's status never decides its spec.warmPoolRef
# ---------------------------------------------------------------------------


def status_write(hub: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """What kube-apiserver stores after a v1alpha1 `/status` write: the stored object read as v1alpha1, its
    status replaced by the client's, converted back to v1beta1."""
    alpha = to_spoke(copy.deepcopy(hub))
    alpha["status"] = copy.deepcopy(status)
    return to_hub(alpha)


def test_a_v1alpha1_status_write_does_not_move_the_warm_pool() -> None:
    """The probe: a cold-started claim made from a template; a status naming another pool's Sandbox used
    to rewrite spec.warmPoolRef (rule (b) of api §8.4 read status.sandbox.name) without a new generation."""
    hub = to_hub(alpha_claim())
    assert hub["spec"]["warmPoolRef"] == {"name": "shadow-pool-tpl"}
    after = status_write(hub, {"sandbox": {"name": "other-pool-abcde"}})
    assert after["spec"] == hub["spec"]
    assert after["status"] == {"sandbox": {"name": "other-pool-abcde"}}
    assert to_spoke(after)["spec"] == {"sandboxTemplateRef": {"name": "tpl"}}


def test_a_warm_start_is_read_from_the_assignment_record() -> None:
    """Rule (b) still maps a warm-started v1alpha1 claim to its originating pool, as upstream; the evidence is
    the claim's assignment record (metadata, which a /status write cannot change), as the claim controller
    reads it (controllers spec §4.5)."""
    for record in ({"annotations": {c.ANNOTATION_SANDBOX_NAME: "warm-pool-x1y2z"}},
                   {"labels": {c.LABEL_SANDBOX_NAME_LEGACY: "warm-pool-x1y2z"}}):  # fmt: skip
        src = alpha_claim("default", **record)
        src["status"] = {"sandbox": {"name": "warm-pool-x1y2z"}}
        hub = to_hub(src)
        assert hub["spec"]["warmPoolRef"] == {"name": "warm-pool"}, record
        assert to_spoke(hub) == src, "alpha -> beta -> alpha stays lossless"
        # the status cannot move it, not even by dropping the bound name
        for status in ({}, {"sandbox": {"name": "my-claim"}}, {"sandbox": {"name": "elsewhere-abcde"}}):
            assert status_write(hub, status)["spec"] == hub["spec"], (record, status)


def test_a_status_alone_does_not_make_a_warm_start() -> None:
    src = alpha_claim("default")
    src["status"] = {"sandbox": {"name": "other-pool-abcde"}}
    assert to_hub(src)["spec"]["warmPoolRef"] == {"name": "shadow-pool-tpl"}


POOLS = ["shadow-pool-tpl", "tpl", "pool-a", "warm", "shadow-pool-other", "my-claim"]
SNAPSHOTS: list[dict[str, Any] | None] = [
    None,
    {"sandboxTemplateRef": {"name": "tpl"}},
    {"sandboxTemplateRef": {"name": "tpl"}, "warmpool": "default"},
    {"sandboxTemplateRef": {"name": "tpl"}, "warmpool": "none"},
    {"sandboxTemplateRef": {"name": "tpl"}, "warmpool": "pool-a"},
    {"sandboxTemplateRef": {"name": "other"}, "warmpool": "shadow-pool-tpl"},
]
BOUND = ["", "my-claim", "pool-a-x1y2z", "warm-abcde", "shadow-pool-tpl-q1w2e", "nodash"]
RECORDS: list[dict[str, Any]] = [
    {},
    {"annotations": {c.ANNOTATION_SANDBOX_NAME: "pool-a-x1y2z"}},
    {"annotations": {c.ANNOTATION_SANDBOX_NAME: "warm-abcde"}},
    {"labels": {c.LABEL_SANDBOX_NAME_LEGACY: "shadow-pool-tpl-q1w2e"}},
]
NEW_STATUS = [{}, {"sandbox": {"name": "other-pool-abcde"}}, {"sandbox": {"name": "my-claim"}},
              {"sandbox": {"name": "pool-a-x1y2z"}}, {"sandbox": {"name": "warm-abcde"}}]  # fmt: skip


@pytest.mark.parametrize(("pool", "snapshot"), list(itertools.product(POOLS, range(len(SNAPSHOTS)))))
def test_no_status_write_changes_the_spec_of_any_stored_claim(pool: str, snapshot: int) -> None:
    """Every combination of stored pool, snapshot, bound Sandbox and assignment record: a v1alpha1 status
    write (and an unchanged v1alpha1 write) stores the spec it read."""
    for bound, record, status in itertools.product(BOUND, RECORDS, NEW_STATUS):
        state = SNAPSHOTS[snapshot]
        hub = beta_claim(
            pool,
            None if state is None else json.dumps({"apiVersion": "x", "kind": "SandboxClaim", "spec": state}),
            status={"sandbox": {"name": bound}} if bound else {},
        )
        for where, values in record.items():
            hub["metadata"].setdefault(where, {}).update(values)
        assert status_write(hub, status)["spec"] == hub["spec"], (bound, record, status)


# ---------------------------------------------------------------------------
# 4. The snapshot holds what the way back reads, and never pushes annotations over the API server's limit
# ---------------------------------------------------------------------------


def test_the_snapshot_holds_only_what_the_way_back_reads() -> None:
    env = [{"name": f"VAR_{i}", "value": "x" * 1024} for i in range(150)]
    sandbox = {"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Sandbox", "metadata": {"name": "s"},
               "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i", "env": env}]}},
                        "replicas": 0}}  # fmt: skip
    state = json.loads(to_hub(sandbox)["metadata"]["annotations"][SANDBOX_STATE])
    assert state == {"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Sandbox", "spec": {"replicas": 0}}
    claim = alpha_claim("pool-a")
    claim["spec"]["env"] = env
    state = json.loads(to_hub(claim)["metadata"]["annotations"][CLAIM_STATE])
    assert state == {"apiVersion": "extensions.agents.x-k8s.io/v1alpha1", "kind": "SandboxClaim",
                     "spec": {"sandboxTemplateRef": {"name": "tpl"}, "warmpool": "pool-a"}}  # fmt: skip
    for kind, state_key in (("SandboxTemplate", c.ANNOTATION_V1ALPHA1_SANDBOXTEMPLATE_STATE),
                            ("SandboxWarmPool", c.ANNOTATION_V1ALPHA1_SANDBOXWARMPOOL_STATE)):  # fmt: skip
        obj = {"apiVersion": "extensions.agents.x-k8s.io/v1alpha1", "kind": kind, "metadata": {"name": "t"},
               "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "env": env}]}}, "replicas": 1}}  # fmt: skip
        state = json.loads(to_hub(obj)["metadata"]["annotations"][state_key])
        assert state == {"apiVersion": "extensions.agents.x-k8s.io/v1alpha1", "kind": kind, "spec": {}}


def test_no_snapshot_when_it_would_push_the_annotations_over_the_limit() -> None:
    """kube-apiserver refuses an object whose annotations (keys + values) exceed 256 KiB; v1beta1 accepted an
    object that v1alpha1 refused because of the snapshot. An object that fits without it now fits."""
    limit = 256 * 1024
    key = "kubectl.kubernetes.io/last-applied-configuration"
    for fill in (limit - len(key) - 40, limit - len(key)):
        claim = alpha_claim("pool-a", annotations={key: "x" * fill})
        hub = to_hub(claim)
        assert CLAIM_STATE not in hub["metadata"]["annotations"], fill
        assert to_spoke(hub)["spec"] == {"sandboxTemplateRef": {"name": "pool-a"}, "warmpool": "pool-a"}
    small = to_hub(alpha_claim("pool-a", annotations={key: "x" * 1000}))
    assert CLAIM_STATE in small["metadata"]["annotations"]
