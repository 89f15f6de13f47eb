"""Pure helpers: label selectors, merge-patch creation/application, JSON patch."""

from __future__ import annotations

import pytest

from agent_sandbox.kube import apply_json_patch, apply_merge_patch, compile_selector, create_merge_patch

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("", {"a": "1"}, True),
        ("a", {"a": ""}, True),
        ("a", {}, False),
        ("!a", {}, True),
        ("!a", {"a": "x"}, False),
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a!=1", {"a": "1"}, False),
        ("a in (1, 2)", {"a": "2"}, True),
        ("a in (1,2)", {}, False),
        ("a notin (1,2)", {}, True),
        ("a notin (1,2)", {"a": "1"}, False),
        ("a=1,b in (x,y),!c", {"a": "1", "b": "y"}, True),
        ("a=1,b in (x,y),!c", {"a": "1", "b": "y", "c": ""}, False),
        ("agents.x-k8s.io/sandbox-name-hash", {"agents.x-k8s.io/sandbox-name-hash": "ab"}, True),
    ],
)
def test_selector_matching(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert compile_selector(selector)(labels) is expected


def test_map_selector_and_none() -> None:
    assert compile_selector({"a": "1", "b": "2"})({"a": "1", "b": "2", "c": "3"})
    assert not compile_selector({"a": "1"})({"a": "2"})
    assert compile_selector(None)({})


@pytest.mark.parametrize("bad", ["a in (1", "a=b=c", "!a in (1)"])
def test_malformed_selector(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid label selector"):
        compile_selector(bad)


def test_create_merge_patch_diff() -> None:
    old = {"metadata": {"labels": {"a": "1", "b": "2"}}, "status": {"conditions": [{"type": "Ready"}]}}
    new = {"metadata": {"labels": {"a": "1", "c": "3"}}, "status": {"conditions": [], "x": 1}}
    patch = create_merge_patch(old, new)
    assert patch == {"metadata": {"labels": {"b": None, "c": "3"}}, "status": {"conditions": [], "x": 1}}
    assert apply_merge_patch(old, patch) == new
    assert create_merge_patch(new, new) == {}


def test_apply_merge_patch_does_not_mutate() -> None:
    target = {"a": {"b": 1}}
    out = apply_merge_patch(target, {"a": {"c": 2}, "d": None})
    assert out == {"a": {"b": 1, "c": 2}}
    assert target == {"a": {"b": 1}}


def test_json_patch_ops() -> None:
    doc = {"a": [1, 2], "b": {"c": 1}}
    out = apply_json_patch(
        doc,
        [
            {"op": "add", "path": "/a/-", "value": 3},
            {"op": "replace", "path": "/b/c", "value": 2},
            {"op": "test", "path": "/b/c", "value": 2},
            {"op": "copy", "from": "/b", "path": "/d"},
            {"op": "move", "from": "/d/c", "path": "/e"},
            {"op": "remove", "path": "/a/0"},
            {"op": "add", "path": "/f~1g", "value": True},
        ],
    )
    assert out == {"a": [2, 3], "b": {"c": 2}, "d": {}, "e": 2, "f/g": True}
    assert doc == {"a": [1, 2], "b": {"c": 1}}
    with pytest.raises(ValueError, match="test failed"):
        apply_json_patch(doc, [{"op": "test", "path": "/b/c", "value": 9}])
    with pytest.raises(ValueError, match="failed"):
        apply_json_patch(doc, [{"op": "remove", "path": "/nope"}])
