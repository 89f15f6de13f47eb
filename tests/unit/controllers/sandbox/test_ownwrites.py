"""Own-write overlay of the Sandbox object: version bookkeeping (equality only, never ordering)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_sandbox.controllers.sandbox._ownwrites import OwnWrites

pytestmark = pytest.mark.unit


def obj(rv: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "Sandbox", "metadata": {"name": "sb", "resourceVersion": rv}, **extra}


def test_overlay_applies_to_every_known_older_version_until_the_cache_catches_up() -> None:
    ow = OwnWrites()
    assert ow.fresh("k", obj("1")) == obj("1")
    ow.record("k", obj("1"), [obj("2", a=1), obj("3", a=2)])
    assert ow.fresh("k", obj("1")) == obj("3", a=2)
    assert ow.fresh("k", obj("2")) == obj("3", a=2)  # the annotation echo arrived, the status one did not
    assert ow.fresh("k", obj("3")) == obj("3")  # caught up: entry dropped, cache used
    assert len(ow) == 0


def test_unknown_version_drops_the_overlay() -> None:
    ow = OwnWrites()
    ow.record("k", obj("1"), [obj("2")])
    assert ow.fresh("k", obj("9")) == obj("9")
    assert ow.fresh("k", obj("1")) == obj("1")


def test_chained_passes_accumulate_older_versions_and_ignore_noop_answers() -> None:
    ow = OwnWrites()
    ow.record("k", obj("1"), [obj("2")])
    used = ow.fresh("k", obj("1"))
    ow.record("k", used, [obj("4")])
    assert ow.fresh("k", obj("1")) == obj("4")
    assert ow.fresh("k", obj("2")) == obj("4")
    ow.record("k", obj("4"), [obj("4")])  # a no-op patch answers with the same version
    assert ow.fresh("k", obj("4")) == obj("4")
    ow.record("k", obj("5"), [])
    ow.forget("k")
    assert len(ow) == 0
