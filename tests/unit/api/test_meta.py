"""The object vocabulary: label rules, ownership, conditions, time, resourceVersion order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import kinds, meta, naming

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("go-client", "go-client"),
        ("python-client", "python-client"),
        ("controller", "controller"),
        ("", "unknown"),
        (None, "unknown"),
        ("kubectl", "unknown"),
        ("Python-Client", "unknown"),
    ],
)
def test_normalize_created_by(value: str | None, expected: str) -> None:
    assert meta.normalize_created_by(value) == expected


@pytest.mark.parametrize(
    ("key", "label", "annotation"),
    [
        ("agents.x-k8s.io/foo", True, True),
        ("extensions.agents.x-k8s.io/foo", True, True),
        ("opentelemetry.io/trace-context", False, True),
        ("sandbox.users.io/team", False, False),
        ("api.agents.x-k8s.io/v1alpha1-sandbox-state", False, False),
        ("app", False, False),
    ],
)
def test_reserved_keys(key: str, label: bool, annotation: bool) -> None:
    assert meta.is_reserved_label(key) is label
    assert meta.is_reserved_annotation(key) is annotation


def test_owner_matching_ignores_version() -> None:
    old = {"apiVersion": "extensions.agents.x-k8s.io/v1alpha1", "kind": "SandboxWarmPool", "name": "p"}
    assert meta.owner_ref_matches(old, c.EXTENSIONS_GROUP, "SandboxWarmPool")
    assert not meta.owner_ref_matches(old, c.GROUP, "SandboxWarmPool")
    assert not meta.owner_ref_matches({"apiVersion": "v1", "kind": "SandboxWarmPool"}, c.EXTENSIONS_GROUP,
                                   "SandboxWarmPool")  # fmt: skip
    assert meta.api_group("v1") == ""
    assert meta.api_group("apps/v1") == "apps"


def test_classify_ownership() -> None:
    ref = meta.new_controller_ref(api_version="agents.x-k8s.io/v1beta1", kind="Sandbox", name="s", uid="u1")
    assert ref["controller"] is True
    assert ref["blockOwnerDeletion"] is True
    non_controller = dict(ref, controller=False, uid="u9")
    assert meta.classify_ownership({}, "u1") is meta.Ownership.UNOWNED
    assert meta.classify_ownership({"ownerReferences": [non_controller]}, "u1") is meta.Ownership.UNOWNED
    assert meta.classify_ownership({"ownerReferences": [non_controller, ref]}, "u1") is meta.Ownership.OWNED
    assert meta.classify_ownership({"ownerReferences": [ref]}, "u2") is meta.Ownership.FOREIGN


# --------------------------------------------------------------------------- conditions

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def _cond(status: str, reason: str = "R", **extra: object) -> dict[str, object]:
    return {"type": "Ready", "status": status, "reason": reason, "message": "m", **extra}


def test_upsert_appends_with_now_or_the_given_time() -> None:
    conditions: list[dict[str, object]] = [{"type": "Other", "status": "True"}]
    meta.upsert_condition(conditions, _cond("True", observedGeneration=2), T0)
    assert conditions[1] == {
        **_cond("True", observedGeneration=2),
        "lastTransitionTime": "2026-01-01T12:00:00Z",
    }
    given: list[dict[str, object]] = []
    meta.upsert_condition(given, _cond("True", lastTransitionTime="2025-12-31T00:00:00Z"), T0)
    assert given[0]["lastTransitionTime"] == "2025-12-31T00:00:00Z"


def test_upsert_stamps_only_a_status_flip_and_keeps_the_position() -> None:
    old = {**_cond("False", observedGeneration=1), "lastTransitionTime": "2026-01-01T11:00:00Z"}
    conditions = [old, {"type": "Other", "status": "True"}]
    meta.upsert_condition(conditions, _cond("False", reason="Still", observedGeneration=2), T1)
    assert conditions[0]["lastTransitionTime"] == "2026-01-01T11:00:00Z"
    assert (conditions[0]["reason"], conditions[0]["observedGeneration"]) == ("Still", 2)
    meta.upsert_condition(conditions, _cond("True", observedGeneration=3), T1)
    assert conditions[0]["lastTransitionTime"] == "2026-01-01T12:05:00Z"
    assert conditions[1]["type"] == "Other"
    assert old["status"] == "False"  # replaced, never mutated: the old dict may be a cache object's


def test_upsert_without_generation_drops_a_stale_one() -> None:
    conditions = [{**_cond("True", observedGeneration=4), "lastTransitionTime": "x"}]
    meta.upsert_condition(conditions, _cond("True"), T0)
    assert "observedGeneration" not in conditions[0]


def test_find_remove_and_truth() -> None:
    obj = {"status": {"conditions": [_cond("True"), {"type": "Finished", "status": "False"}]}}
    assert meta.find_condition(obj["status"]["conditions"], "Finished") == {
        "type": "Finished",
        "status": "False",
    }
    assert meta.find_condition(None, "Ready") is None
    assert meta.find_condition("garbage", "Ready") is None
    assert meta.is_ready(obj)
    assert not meta.is_condition_true(obj, "Finished")
    assert not meta.is_ready(None)
    assert not meta.is_ready({})
    conditions = list(obj["status"]["conditions"])
    meta.remove_condition(conditions, "Ready")
    assert [cd["type"] for cd in conditions] == ["Finished"]


# --------------------------------------------------------------------------- time


def test_time_formats() -> None:
    assert meta.format_time(T0 + timedelta(microseconds=999)) == "2026-01-01T12:00:00Z"
    assert meta.format_rfc3339nano(T0) == "2026-01-01T12:00:00Z"
    assert meta.format_rfc3339nano(T0 + timedelta(microseconds=120000)) == "2026-01-01T12:00:00.12Z"
    assert meta.format_rfc3339nano(T0 + timedelta(microseconds=1)) == "2026-01-01T12:00:00.000001Z"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T12:00:00Z", T0),
        ("2026-01-01T12:00:00.123456789Z", T0 + timedelta(microseconds=123456)),
        ("2026-01-01T14:00:00+02:00", T0),
        ("2026-01-01T14:00:00.5+02:00", T0 + timedelta(milliseconds=500)),
        ("2026-01-01T12:00:00", T0),  # no offset: UTC
        ("2026-01-01t12:00:00z", T0),
        ("", None),
        ("yesterday", None),
        (None, None),
        (17, None),
    ],
)
def test_parse_time(text: object, expected: datetime | None) -> None:
    assert meta.parse_time(text) == expected


# --------------------------------------------------------------------------- ownership and references


def _owned(kind: str, uid: str, *, api_version: str, controller: bool = True) -> dict[str, object]:
    ref = {"apiVersion": api_version, "kind": kind, "name": "owner", "uid": uid, "controller": controller}
    return {"metadata": {"ownerReferences": [ref]}}


def test_controlled_by_matches_group_kind_and_uid_whatever_the_version() -> None:
    member = _owned("SandboxWarmPool", "p1", api_version="extensions.agents.x-k8s.io/v1alpha1")
    assert meta.controlled_by(member, kinds.SANDBOX_WARM_POOL)
    assert meta.controlled_by(member, kinds.SANDBOX_WARM_POOL, "p1")
    assert not meta.controlled_by(member, kinds.SANDBOX_WARM_POOL, "p2")
    assert not meta.controlled_by(member, kinds.SANDBOX_CLAIM)
    assert not meta.controlled_by(None, kinds.SANDBOX_CLAIM)
    other_group = _owned("SandboxWarmPool", "p1", api_version="apps/v1")
    assert not meta.controlled_by(other_group, kinds.SANDBOX_WARM_POOL)
    assert meta.controlled_by(other_group, uid="p1")  # kind-agnostic, as metav1.IsControlledBy
    assert not meta.controlled_by(other_group, uid="")
    assert meta.controller_name(member, kinds.SANDBOX_WARM_POOL) == "owner"
    assert meta.controller_name(member, kinds.SANDBOX) is None


def test_owner_name_falls_back_to_a_non_controller_owner() -> None:
    loose = _owned(
        "SandboxWarmPool", "p1", api_version="extensions.agents.x-k8s.io/v1beta1", controller=False
    )
    assert meta.controller_name(loose, kinds.SANDBOX_WARM_POOL) is None
    assert meta.owner_name(loose, kinds.SANDBOX_WARM_POOL) == "owner"
    assert meta.owner_name({"metadata": {}}, kinds.SANDBOX_WARM_POOL) is None


def test_named_references() -> None:
    claim = {"spec": {"warmPoolRef": {"name": "pool"}}, "status": {"sandbox": {"name": "sb"}}}
    assert (meta.claim_pool_name(claim), meta.claim_sandbox_name(claim)) == ("pool", "sb")
    assert (meta.claim_pool_name({}), meta.claim_sandbox_name({"status": None})) == ("", "")
    assert meta.pool_template_name({"spec": {"sandboxTemplateRef": {"name": "t"}}}) == "t"
    assert meta.pool_key("ns", "pool") == "ns/pool"


# --------------------------------------------------------------------------- resourceVersion order


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("9", "10", -1),
        ("10", "9", 1),
        ("123", "123", 0),
        ("99999999999999999999", "100000000000000000000", -1),
        ("", "1", None),
        ("0", "1", None),
        ("007", "8", None),
        ("12a", "13", None),
        ("-1", "2", None),
        ("١٢", "13", None),  # non-ASCII digits are not a Kubernetes resourceVersion
    ],
)
def test_compare_resource_versions(a: str, b: str, expected: int | None) -> None:
    assert meta.compare_resource_versions(a, b) == expected


def test_is_newer_is_false_when_not_comparable() -> None:
    def obj(rv: str) -> dict[str, object]:
        return {"metadata": {"resourceVersion": rv}}

    assert meta.is_newer(obj("11"), obj("9"))
    assert not meta.is_newer(obj("9"), obj("11"))
    assert not meta.is_newer(obj("9"), obj("9"))
    assert not meta.is_newer(obj("opaque-2"), obj("opaque-1"))


def test_moved_names_stay_importable_from_constants() -> None:
    assert c.name_hash is naming.name_hash
    assert c.controller_ref is meta.controller_ref
    assert c.SANDBOX is kinds.SANDBOX
    with pytest.raises(AttributeError):
        _ = c.no_such_name
