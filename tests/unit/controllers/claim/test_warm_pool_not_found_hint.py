"""`WarmPoolNotFound` on a shadow pool names the migration fix (api spec §8.4, §8.7; controllers spec quirks).

A v1alpha1 claim that names only a template is served as a v1beta1 claim on `shadow-pool-<template>`, a
pool its author never wrote down: the Ready message keeps the pinned `SandboxWarmPool "<name>" not found`
and adds what to do. Any other pool name keeps the pinned message alone.
"""

from __future__ import annotations

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.claim.errors import WarmPoolNotFound

pytestmark = pytest.mark.unit


def test_a_missing_shadow_pool_says_how_to_create_it() -> None:
    err = WarmPoolNotFound("shadow-pool-python")
    assert err.reason == c.REASON_WARM_POOL_NOT_FOUND
    assert err.message == (
        'SandboxWarmPool "shadow-pool-python" not found; a v1alpha1 claim that names SandboxTemplate '
        '"python" directly needs this pool (replicas 0, sandboxTemplateRef "python"): create it or run '
        "helm/files/migrate.sh --phase=bootstrap (docs/api-migration-guide.md)"
    )
    assert str(err) == 'SandboxWarmPool "shadow-pool-python" not found'


@pytest.mark.parametrize("name", ["pool", "my-shadow-pool-x", "shadow-poolx"])
def test_any_other_pool_keeps_the_pinned_message(name: str) -> None:
    assert WarmPoolNotFound(name).message == f'SandboxWarmPool "{name}" not found'
