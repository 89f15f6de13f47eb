"""The cache index functions (controllers spec §1.1, §3.1, §4.1)."""

from __future__ import annotations

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.indexes import (
    claim_pool_index,
    pod_name_hash_index,
    pool_template_ref_index,
    sandbox_claim_uid_index,
    sandbox_warm_pool_index,
)

pytestmark = pytest.mark.unit


def test_label_indexes() -> None:
    sb = {"metadata": {"labels": {c.LABEL_WARM_POOL_SANDBOX: "abc"}}}
    assert sandbox_warm_pool_index(sb) == ["abc"]
    assert sandbox_warm_pool_index({"metadata": {}}) == []
    assert list(pod_name_hash_index({"metadata": {"labels": {c.LABEL_SANDBOX_NAME_HASH: "h"}}})) == ["h"]
    assert list(pod_name_hash_index({"metadata": {"labels": {c.LABEL_SANDBOX_NAME_HASH: ""}}})) == [""]
    assert list(pod_name_hash_index({"metadata": {}})) == []


def test_reference_indexes_skip_empty_names() -> None:
    assert pool_template_ref_index({"spec": {"sandboxTemplateRef": {"name": "t"}}}) == ["t"]
    assert pool_template_ref_index({"spec": {"sandboxTemplateRef": {"name": ""}}}) == []
    assert claim_pool_index({"spec": {"warmPoolRef": {"name": "pool"}}}) == ["pool"]
    assert claim_pool_index({"metadata": {}, "spec": {"warmPoolRef": {"name": ""}}}) == []


def test_claim_uid_index_only_for_claim_controllers() -> None:
    def owned(kind: str, api_version: str) -> dict[str, object]:
        ref = {"apiVersion": api_version, "kind": kind, "name": "o", "uid": "u1", "controller": True}
        return {"metadata": {"ownerReferences": [ref]}}

    assert sandbox_claim_uid_index(owned("SandboxClaim", "extensions.agents.x-k8s.io/v1alpha1")) == ["u1"]
    assert sandbox_claim_uid_index(owned("SandboxWarmPool", "extensions.agents.x-k8s.io/v1beta1")) == []
    assert sandbox_claim_uid_index(owned("SandboxClaim", "apps/v1")) == []
    assert sandbox_claim_uid_index({"metadata": {}}) == []
