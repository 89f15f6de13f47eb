"""Claim logic without I/O: validation, the manifest, reason -> exception mapping, status parsing."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from agent_sandbox_sdk import (
    SandboxClaimFailedError,
    SandboxNotFoundError,
    SandboxTemplateNotFoundError,
    SandboxWarmPoolNotFoundError,
)
from agent_sandbox_sdk._claims import (
    ClaimView,
    SandboxView,
    build_claim,
    check_adoption,
    new_claim_name,
    select_pod_ip,
    validate_create_args,
)

pytestmark = pytest.mark.unit


def _args(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "warmpool": "python-pool",
        "namespace": "default",
        "labels": None,
        "pod_labels": None,
        "pod_annotations": None,
        "shutdown_after_seconds": None,
        "claim_name": None,
        "adopt_existing": False,
        "sandbox_ready_timeout": 180,
    }
    base.update(over)
    return base


def test_valid_arguments_pass() -> None:
    validate_create_args(
        **_args(
            labels={"team": "ml", "example.com/owner": "a.b-c_d", "empty": ""},
            pod_labels={"app": "x"},
            pod_annotations={"example.com/note": "anything at all"},
            shutdown_after_seconds=60,
            claim_name="my.claim-1",
            adopt_existing=True,
        )
    )


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"warmpool": ""}, "warmpool"),
        ({"warmpool": "Bad_Pool"}, "warmpool"),
        ({"namespace": "Default"}, "namespace"),
        ({"labels": {"bad key!": "v"}}, "label"),
        ({"labels": {"k": "has space"}}, "label"),
        ({"labels": {"k": "x" * 64}}, "label"),
        ({"labels": {"/nameonly": "v"}}, "label"),
        ({"pod_labels": {"k": "-leading"}}, "pod label"),
        ({"pod_annotations": {"bad/key/x!": "v"}}, "pod annotation"),
        ({"shutdown_after_seconds": 0}, "shutdown_after_seconds"),
        ({"shutdown_after_seconds": 1.5}, "shutdown_after_seconds"),
        ({"shutdown_after_seconds": True}, "shutdown_after_seconds"),
        ({"shutdown_after_seconds": 10**12}, "shutdown_after_seconds"),  # OverflowError until December 6
        ({"sandbox_ready_timeout": "10"}, "sandbox_ready_timeout"),  # TypeError until December 6
        ({"sandbox_ready_timeout": float("inf")}, "sandbox_ready_timeout"),
        # until December 6 these failed deep inside (AttributeError, pydantic, "dictionary update sequence")
        ({"labels": [("a", "b")]}, "labels must be a dict"),
        ({"env": [("A", "1")]}, "env must be a dict"),
        ({"env": {"A": 1}}, "env 'A': keys and values must be strings"),
        ({"pod_annotations": {"a": None}}, "pod_annotations 'a'"),
        ({"volume_claim_templates": {"metadata": {"name": "x"}}}, "volume_claim_templates must be a list"),
        ({"volume_claim_templates": ["x"]}, "volume_claim_templates must be a list"),
        ({"claim_name": "UPPER"}, "claim_name"),
        ({"claim_name": "x" * 254}, "claim_name"),
        ({"adopt_existing": True}, "adopt_existing"),
        ({"sandbox_ready_timeout": 0}, "sandbox_ready_timeout"),
    ],
)
def test_invalid_arguments_name_the_field(over: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        validate_create_args(**_args(**over))


def test_generated_claim_names_are_dns_labels() -> None:
    names = {new_claim_name() for _ in range(50)}
    assert len(names) == 50
    assert all(re.fullmatch(r"sandbox-claim-[0-9a-f]{8}", n) for n in names)


def test_minimal_manifest_matches_the_reference_wire_shape() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    body = build_claim(name="sandbox-claim-0123abcd", warmpool="python-sandbox-pool", now=now)
    assert body == {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {
            "name": "sandbox-claim-0123abcd",
            "labels": {"agents.x-k8s.io/created-by": "python-client"},
            "annotations": {"agents.x-k8s.io/client-first-requested-at": now.isoformat()},
        },
        "spec": {"warmPoolRef": {"name": "python-sandbox-pool"}},
    }


def test_full_manifest() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    body = build_claim(
        name="c",
        warmpool="p",
        labels={"team": "ml"},
        shutdown_after_seconds=3600,
        volume_claim_templates=[{"metadata": {"name": "workspace"}}],
        pod_labels={"a": "b"},
        pod_annotations=None,
        env={"FOO": "bar"},
        now=now,
    )
    spec = body["spec"]
    assert body["metadata"]["labels"] == {"team": "ml", "agents.x-k8s.io/created-by": "python-client"}
    assert spec["lifecycle"] == {"shutdownTime": "2026-01-02T04:04:05Z", "shutdownPolicy": "Delete"}
    assert spec["volumeClaimTemplates"] == [{"metadata": {"name": "workspace"}}]
    assert spec["additionalPodMetadata"] == {"labels": {"a": "b"}}
    assert spec["env"] == [{"name": "FOO", "value": "bar"}]


def test_env_names_are_validated() -> None:
    with pytest.raises(ValueError, match="environment variable"):
        build_claim(name="c", warmpool="p", env={"1BAD": "x"})


@pytest.mark.parametrize(
    ("ips", "chosen"),
    [
        (["127.10.0.5"], "127.10.0.5"),
        (["fd00::1", "10.0.0.1"], "10.0.0.1"),
        (["::ffff:10.1.2.3"], "10.1.2.3"),
        (["fd00::1"], "fd00::1"),
        (["garbage", "", None, "192.168.1.1"], "192.168.1.1"),
        ([{"ip": "127.0.0.9"}], "127.0.0.9"),
        ([], None),
        (None, None),
    ],
)
def test_pod_ip_selection_prefers_ipv4(ips: list[Any] | None, chosen: str | None) -> None:
    assert select_pod_ip(ips) == chosen


def _claim(conditions: list[dict[str, Any]] | None = None, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "c1", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
        "spec": {"warmPoolRef": {"name": "pool"}},
        "status": {"conditions": conditions or [], **status},
    }


def _ready(status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": "Ready", "status": status, "reason": reason, "message": message}


def test_ready_needs_both_a_bound_sandbox_and_ready_true() -> None:
    assert not ClaimView.of(_claim([_ready("True", "SandboxReady")])).bound_and_ready
    assert not ClaimView.of(_claim([], sandbox={"name": "sb"})).bound_and_ready
    view = ClaimView.of(
        _claim([_ready("True", "SandboxReady")], sandbox={"name": "sb", "podIPs": ["127.1.0.2"]})
    )
    assert view.bound_and_ready
    assert view.pod_ip == "127.1.0.2"
    legacy = ClaimView.of(_claim([_ready("True", "R")], sandbox={"Name": "sb"}))
    assert legacy.sandbox_name == "sb"


@pytest.mark.parametrize(
    ("conditions", "error"),
    [
        ([_ready("False", "TemplateNotFound", "template t missing")], SandboxTemplateNotFoundError),
        ([_ready("False", "WarmPoolNotFound")], SandboxWarmPoolNotFoundError),
        ([{"type": "Other", "status": "False", "reason": "WarmPoolNotFound"}], SandboxWarmPoolNotFoundError),
        ([_ready("False", "InvalidMetadata")], SandboxClaimFailedError),
        ([_ready("False", "EnvVarsInjectionRejected")], SandboxClaimFailedError),
        ([_ready("False", "VolumeClaimTemplatesError")], SandboxClaimFailedError),
        ([_ready("False", "ClaimExpired")], SandboxClaimFailedError),
        ([_ready("False", "SandboxExpired")], SandboxClaimFailedError),
        ([_ready("False", "InvalidConfiguration")], SandboxClaimFailedError),
        ([_ready("False", "PodFailed")], SandboxClaimFailedError),
        ([_ready("False", "PodSucceeded")], SandboxClaimFailedError),
    ],
)
def test_terminal_reasons_map_to_exceptions_carrying_the_condition(
    conditions: list[dict[str, Any]], error: type[Exception]
) -> None:
    failure = ClaimView.of(_claim(conditions)).failure()
    assert isinstance(failure, error)
    assert "ns/c1" in str(failure)


@pytest.mark.parametrize(
    "reason",
    ["SandboxMissing", "SandboxNotReady", "SandboxCreatePending", "AdoptionConflict", "ReconcilerError", "X"],
)
def test_transient_reasons_keep_waiting(reason: str) -> None:
    assert ClaimView.of(_claim([_ready("False", reason)])).failure() is None


@pytest.mark.parametrize(
    "message",
    [
        'Error seen: failed to create pod: Pod "c1" is invalid: spec.containers[0].name: Invalid value: "Bad_Name"',
        'Error seen: failed to create service: Service "c1" is invalid: spec.ports[0].port: Invalid value: 0',
        'Error seen: failed to create pod: pods "c1" is forbidden: violates PodSecurity "restricted:latest": '
        'allowPrivilegeEscalation != false (container "main" must set securityContext.allowPrivilegeEscalation=false)',
    ],
)
def test_an_object_the_api_server_refused_for_good_fails_at_once(message: str) -> None:
    """Ours: upstream waits out the timeout (180 s by default) on a template whose Pod cannot be valid, or
    cannot pass the namespace's Pod Security level."""
    failure = ClaimView.of(_claim([_ready("False", "ReconcilerError", message)])).failure()
    assert isinstance(failure, SandboxClaimFailedError)
    assert failure.reason == "ReconcilerError"
    assert "spec." in str(failure) or "securityContext." in str(failure)


def test_other_reconciler_errors_keep_waiting() -> None:
    for message in ('Error seen: pods "c1" is forbidden: exceeded quota: compute', "Error seen: timeout"):
        assert ClaimView.of(_claim([_ready("False", "ReconcilerError", message)])).failure() is None


def test_failure_carries_reason_and_message() -> None:
    failure = ClaimView.of(_claim([_ready("False", "PodFailed", "container exited 1")])).failure()
    assert failure is not None
    assert failure.reason == "PodFailed"
    assert failure.condition_message == "container exited 1"
    assert "container exited 1" in str(failure)


def test_describe_names_reason_and_message() -> None:
    assert ClaimView.of(_claim()).describe() == "no Ready condition yet"
    text = ClaimView.of(_claim([_ready("False", "SandboxNotReady", "0/2 nodes available")])).describe()
    assert text == "Ready=False, reason SandboxNotReady: 0/2 nodes available"


def test_a_claim_without_any_status_is_untouched() -> None:
    assert ClaimView.of(_claim()).untouched
    assert not ClaimView.of(_claim([_ready("False", "SandboxNotReady", "")])).untouched


def test_adoption_checks() -> None:
    ok = check_adoption(_claim(), "c1", "pool")
    assert ok.uid == "u1"
    with pytest.raises(SandboxNotFoundError, match="does not exist"):
        check_adoption(None, "c1", "pool")
    with pytest.raises(ValueError, match="warm pool 'pool', not 'other'"):
        check_adoption(_claim(), "c1", "other")
    deleting = _claim()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    with pytest.raises(SandboxNotFoundError, match="being deleted"):
        check_adoption(deleting, "c1", "pool")
    no_uid = _claim()
    del no_uid["metadata"]["uid"]
    with pytest.raises(SandboxNotFoundError, match="uid"):
        check_adoption(no_uid, "c1", "pool")


def test_sandbox_view() -> None:
    obj = {
        "metadata": {"name": "sb", "annotations": {"agents.x-k8s.io/pod-name": "sb-pod"}},
        "spec": {"operatingMode": "Suspended"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "SandboxSuspended", "message": "m"}
            ],
            "selector": "agents.x-k8s.io/sandbox-name-hash=abc123,other=x",
            "podIPs": ["127.1.0.7"],
            "serviceFQDN": "sb.ns.svc.cluster.local",
        },
    }
    view = SandboxView.of(obj)
    assert (view.pod_name, view.name_hash, view.pod_ip, view.service_fqdn) == (
        "sb-pod",
        "abc123",
        "127.1.0.7",
        "sb.ns.svc.cluster.local",
    )
    assert view.operating_mode == "Suspended"
    assert view.status_pair() == ("SandboxNotReady", "m")
    bare = SandboxView.of({"metadata": {"name": "sb"}})
    assert bare.pod_name == "sb"
    assert bare.status_pair() == ("SandboxNotReady", "Unknown message")


def _member(*conditions: tuple[str, str, str, str], deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "pool-abc12"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    conds = [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]
    return {"metadata": meta, "status": {"conditions": conds}}


def test_a_pool_members_problem_prefers_the_schedulers_words() -> None:
    from agent_sandbox_sdk._inventory import member_problem

    unschedulable = _member(
        ("Ready", "False", "DependenciesNotReady", "Pod exists with phase: Pending"),
        ("PodScheduled", "False", "Unschedulable", "0/1 nodes are available: 1 Insufficient cpu."),
    )
    assert member_problem(unschedulable) == ("Unschedulable", "0/1 nodes are available: 1 Insufficient cpu.")
    failing = _member(("Ready", "False", "ReconcilerError", "Error seen: pods is forbidden"))
    assert member_problem(failing) == ("ReconcilerError", "Error seen: pods is forbidden")
    assert member_problem(_member(("Ready", "True", "DependenciesReady", "Pod is Ready"))) is None
    assert member_problem(_member()) is None  # too new to say
    assert member_problem(_member(("Ready", "False", "X", "y"), deleting=True)) is None  # leaving


def test_a_just_suspended_sandbox_shows_no_pod_ip_although_its_claim_still_lists_one() -> None:
    """The claim mirrors the Sandbox's pod IPs a moment later: `list`/`get`/`suspend` showed the old pod's
    address for a Sandbox that had none any more (SUSPENDED true, POD IP 127.10.0.2)."""
    from agent_sandbox_sdk._inventory import sandbox_info

    claim = {
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"warmPoolRef": {"name": "pool"}},
        "status": {"sandbox": {"name": "sb", "podIPs": ["127.10.0.2"]}},
    }
    suspended = {
        "metadata": {"name": "sb", "namespace": "ns"},
        "spec": {"operatingMode": "Suspended"},
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "SandboxSuspended"}]},
    }
    info = sandbox_info(claim, {("ns", "sb"): suspended})
    assert (info.suspended, info.pod_ip) == (True, None)
    assert sandbox_info(claim, None).pod_ip == "127.10.0.2"  # claims-only: the claim is all there is


def test_pools_of_every_namespace_keep_each_namespaces_members_and_templates_apart() -> None:
    """`agent-sandbox pools -A` (probe fleet11): a pool named like another namespace's gets its own
    members' reason, and a template is looked for in the pool's own namespace."""
    import json

    from agent_sandbox_sdk._inventory import list_warm_pools
    from agent_sandbox_sdk._steps import HttpResponse, Send

    def pool(ns: str, name: str, template: str) -> dict[str, Any]:
        spec = {"replicas": 2, "sandboxTemplateRef": {"name": template}}
        return {"metadata": {"name": name, "namespace": ns}, "spec": spec, "status": {"readyReplicas": 0}}

    stuck = _member(
        ("PodScheduled", "False", "Unschedulable", "0/1 nodes are available"), ("Ready", "False", "X", "y")
    )
    stuck["metadata"].update(
        namespace="a", ownerReferences=[{"controller": True, "kind": "SandboxWarmPool", "name": "p"}]
    )
    answers = {
        "sandboxwarmpools": [pool("b", "p", "t"), pool("a", "p", "t")],
        "sandboxes": [stuck],
        "sandboxtemplates": [{"metadata": {"name": "t", "namespace": "a"}}],
    }
    flow = list_warm_pools(None)
    step = next(flow)
    while True:
        assert isinstance(step, Send)
        assert "/namespaces/" not in step.request.url  # every namespace: the cluster-wide collections
        body = {"items": answers[step.request.url.rsplit("/", 1)[1]], "metadata": {}}
        try:
            step = flow.send(HttpResponse(200, {}, json.dumps(body).encode()))
        except StopIteration as done:
            infos = done.value
            break
    got = [(i.namespace, i.name, i.reason, i.message) for i in infos]
    assert got == [
        ("a", "p", "Unschedulable", "0/1 nodes are available"),
        ("b", "p", "TemplateNotFound", "SandboxTemplate b/t not found"),
    ]
