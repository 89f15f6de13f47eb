"""The lifecycle vocabulary (api/lifecycle.py): settings, claim env encoding, patches, archive round trip."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.constants import ANNOTATION_POD_NAME, ANNOTATION_SANDBOX_TEMPLATE_REF

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)


def test_nothing_asked_for_is_off() -> None:
    policy = lc.lifecycle_policy({"unrelated": "x"}, {ANNOTATION_SANDBOX_TEMPLATE_REF: "t"})
    assert policy == lc.LifecyclePolicy()
    assert not policy.any


def test_sandbox_value_wins_over_template() -> None:
    policy = lc.lifecycle_policy(
        {lc.ANNOTATION_IDLE_TIMEOUT: "90s"},
        {
            lc.ANNOTATION_IDLE_TIMEOUT: "1h",
            lc.ANNOTATION_HIBERNATE_AFTER: "24h",
            lc.ANNOTATION_AUTO_RESUME: "true",
        },
    )
    assert policy == lc.LifecyclePolicy(idle_timeout=90.0, hibernate_after=86400.0, auto_resume=True)


def test_zero_turns_a_template_setting_off() -> None:
    policy = lc.lifecycle_policy({lc.ANNOTATION_IDLE_TIMEOUT: "0"}, {lc.ANNOTATION_IDLE_TIMEOUT: "15m"})
    assert policy.idle_timeout is None


@pytest.mark.parametrize(
    ("annotations", "problem"),
    [
        (
            {lc.ANNOTATION_IDLE_TIMEOUT: "15"},
            'Sandbox annotation lifecycle.agents.x-k8s.io/idle-timeout="15"',
        ),
        ({lc.ANNOTATION_HIBERNATE_AFTER: "-1h"}, "must not be negative"),
        ({lc.ANNOTATION_AUTO_RESUME: "yes"}, 'want "true" or "false"'),
    ],
)
def test_unusable_values_are_reported_and_off(annotations: dict[str, str], problem: str) -> None:
    policy = lc.lifecycle_policy(annotations)
    assert not policy.any
    assert len(policy.problems) == 1
    assert problem in policy.problems[0]


def test_template_problems_name_the_template() -> None:
    policy = lc.lifecycle_policy({}, {lc.ANNOTATION_IDLE_TIMEOUT: "soon"})
    assert policy.problems[0].startswith("SandboxTemplate annotation")


def test_claim_env_round_trip_is_stable() -> None:
    text = lc.encode_claim_env({"B": "2", "A": "1"})
    assert text == '{"A":"1","B":"2"}'
    assert lc.decode_claim_env(text) == {"A": "1", "B": "2"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[]", "want a JSON object"),
        ('{"": "x"}', "invalid variable name"),
        ('{"A=B": "x"}', "invalid variable name"),
        ('{"A": 1}', "want a string value"),
    ],
)
def test_claim_env_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lc.decode_claim_env(text)


def test_suspend_and_resume_patches() -> None:
    assert lc.suspend_patch(lc.Cause.IDLE, NOW, "42") == {
        "metadata": {
            "resourceVersion": "42",
            "annotations": {
                lc.ANNOTATION_SUSPEND_REASON: "Idle",
                lc.ANNOTATION_SUSPENDED_AT: "2026-01-02T03:04:05.6Z",
            },
        },
        "spec": {"operatingMode": "Suspended"},
    }
    resume = lc.resume_patch(lc.Cause.REQUEST, NOW)
    assert resume["spec"] == {"operatingMode": "Running"}
    assert "resourceVersion" not in resume["metadata"]
    assert resume["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] == "Request"
    assert lc.resume_patch(lc.Cause.REQUEST, NOW, "7")["metadata"]["resourceVersion"] == "7"


@pytest.mark.parametrize("cause", [lc.Cause.REQUEST, lc.Cause.MANUAL])
def test_a_resume_cancels_a_pending_hibernation(cause: lc.Cause) -> None:
    # Until December 6 `hibernate: "true"` survived the resume and the Sandbox was archived again at once.
    annotations = lc.resume_patch(cause, NOW)["metadata"]["annotations"]
    assert lc.ANNOTATION_HIBERNATE in annotations
    assert annotations[lc.ANNOTATION_HIBERNATE] is None  # merge patch: removed


def test_archive_keeps_identity_and_spec_and_restores_running() -> None:
    claim_ref = {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "name": "c",
        "uid": "claim-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    sandbox = {
        "metadata": {
            "name": "sb",
            "namespace": "ns",
            "uid": "old-uid",
            "resourceVersion": "9",
            "labels": {"app": "x"},
            "annotations": {
                ANNOTATION_POD_NAME: "sb",
                lc.ANNOTATION_HIBERNATE: "true",
                lc.ANNOTATION_SUSPEND_REASON: "Idle",
                lc.ANNOTATION_AUTO_RESUME: "true",
                "user": "kept",
            },
            "ownerReferences": [claim_ref],
        },
        "spec": {"operatingMode": "Suspended", "podTemplate": {"spec": {"hostname": "h"}}},
        "status": {"conditions": []},
    }
    children = [{"kind": "PersistentVolumeClaim", "name": "data-sb"}]
    archive = lc.archive_body(sandbox, cause=lc.Cause.AFTER, now=NOW, children=children)
    assert archive["metadata"] == {
        "name": "sb",
        "namespace": "ns",
        "labels": {"app": "x"},
        "ownerReferences": [claim_ref],
    }
    assert archive["spec"]["sandboxUID"] == "old-uid"
    assert archive["spec"]["children"] == children
    kept = archive["spec"]["sandbox"]["metadata"]["annotations"]
    assert ANNOTATION_POD_NAME not in kept
    assert lc.ANNOTATION_HIBERNATE not in kept
    assert lc.restore_requested(archive) is None
    assert kept[lc.ANNOTATION_AUTO_RESUME] == "true"  # its own opt-in goes with it

    archive["spec"]["restore"] = lc.restore_request_patch(lc.Cause.REQUEST, NOW)["spec"]["restore"]
    assert lc.restore_requested(archive) == (lc.Cause.REQUEST, NOW)
    restored = lc.archived_sandbox(archive, cause=lc.Cause.REQUEST, now=NOW)
    assert restored["metadata"]["name"] == "sb"
    assert restored["metadata"]["ownerReferences"] == [claim_ref]
    assert restored["spec"] == {"operatingMode": "Running", "podTemplate": {"spec": {"hostname": "h"}}}
    annotations = restored["metadata"]["annotations"]
    assert annotations["user"] == "kept"
    assert annotations[lc.ANNOTATION_RESUME_REASON] == "Request"
    assert lc.ANNOTATION_SUSPEND_REASON not in annotations
    assert "uid" not in restored["metadata"]
    assert "resourceVersion" not in restored["metadata"]
