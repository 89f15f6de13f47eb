"""Every cache index the controllers read through, in one table (controllers spec §1.1, §3.1, §4.1).

| Index | Kind | Value | Used by |
|---|---|---|---|
| `POD_BY_SANDBOX_HASH` | Pod | `sandbox-name-hash` label | sandbox |
| `SANDBOX_BY_POOL` | Sandbox | `warm-pool-sandbox` label | warm pool (members) |
| `POOL_BY_TEMPLATE` | SandboxWarmPool | `spec.sandboxTemplateRef.name` | warm pool, claim (template events) |
| `CLAIM_BY_POOL` | SandboxClaim | `spec.warmPoolRef.name` | claim (pool events) |
| `SANDBOX_BY_CLAIM_UID` | Sandbox | UID of the controlling SandboxClaim | claim (what a claim owns) |
| `SANDBOX_BY_TEMPLATE` | Sandbox | `sandbox-template-ref` annotation | lifecycle (template settings change) |

A setup registers the indexes it reads with `ensure_indexes`; registering one twice (two controllers
sharing it) is a no-op. Index functions are pure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import claim_pool_name, controlled_by, controller_ref, pool_template_name
from agent_sandbox.kube import POD, SANDBOX, SANDBOX_CLAIM, SANDBOX_WARM_POOL, Cache, Object, ResourceKind

__all__ = [
    "CLAIM_BY_POOL",
    "INDEX_CLAIM_POOL",
    "INDEX_POD_NAME_HASH",
    "INDEX_POOL_TEMPLATE_REF",
    "INDEX_SANDBOX_CLAIM_UID",
    "INDEX_SANDBOX_TEMPLATE_REF",
    "INDEX_SANDBOX_WARM_POOL",
    "POD_BY_SANDBOX_HASH",
    "POOL_BY_TEMPLATE",
    "SANDBOX_BY_CLAIM_UID",
    "SANDBOX_BY_POOL",
    "SANDBOX_BY_TEMPLATE",
    "Index",
    "claim_pool_index",
    "ensure_indexes",
    "pod_name_hash_index",
    "pool_template_ref_index",
    "sandbox_claim_uid_index",
    "sandbox_template_index",
    "sandbox_warm_pool_index",
]

INDEX_POD_NAME_HASH: Final = f".metadata.labels[{c.LABEL_SANDBOX_NAME_HASH}]"
"""Pods by their tracking-label value (same name as upstream's field index)."""
INDEX_SANDBOX_WARM_POOL: Final = f".metadata.labels[{c.LABEL_WARM_POOL_SANDBOX}]"
"""Sandboxes by the value of the `warm-pool-sandbox` label."""
INDEX_POOL_TEMPLATE_REF: Final = ".spec.sandboxTemplateRef.name"
"""SandboxWarmPools by `spec.sandboxTemplateRef.name` (none when empty)."""
INDEX_CLAIM_POOL: Final = ".spec.warmPoolRef.name"
"""SandboxClaims by `spec.warmPoolRef.name` (none when empty)."""
INDEX_SANDBOX_CLAIM_UID: Final = "claim-controller-uid"
"""Sandboxes by the UID of their controlling SandboxClaim (how a claim finds what it already owns)."""
INDEX_SANDBOX_TEMPLATE_REF: Final = "sandbox-template-ref"
"""Sandboxes by the SandboxTemplate they were built from (the `sandbox-template-ref` annotation)."""


def pod_name_hash_index(obj: Object) -> Iterable[str]:
    """The Pod's tracking-label value (no entry without the label)."""
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(c.LABEL_SANDBOX_NAME_HASH)
    return (value,) if value is not None else ()


def sandbox_warm_pool_index(obj: Object) -> list[str]:
    """The Sandbox's `warm-pool-sandbox` label value, if the label is present."""
    value = (obj["metadata"].get("labels") or {}).get(c.LABEL_WARM_POOL_SANDBOX)
    return [value] if value is not None else []


def pool_template_ref_index(obj: Object) -> list[str]:
    """The pool's template name (nothing when empty)."""
    name = pool_template_name(obj)
    return [name] if name else []


def claim_pool_index(obj: Object) -> list[str]:
    """The claim's pool name (nothing when empty)."""
    name = claim_pool_name(obj)
    return [name] if name else []


def sandbox_claim_uid_index(obj: Object) -> list[str]:
    """The UID of the Sandbox's controlling SandboxClaim (group + kind, any version)."""
    ref = controller_ref(obj["metadata"])
    if ref is not None and ref.get("uid") and controlled_by(obj, SANDBOX_CLAIM):
        return [ref["uid"]]
    return []


def sandbox_template_index(obj: Object) -> list[str]:
    """The template a Sandbox was built from (`agents.x-k8s.io/sandbox-template-ref`), if any."""
    name = (obj["metadata"].get("annotations") or {}).get(c.ANNOTATION_SANDBOX_TEMPLATE_REF)
    return [name] if name else []


@dataclass(frozen=True, slots=True)
class Index:
    """One cache index: on `kind`, named `name`, computed by `fn`."""

    kind: ResourceKind
    name: str
    fn: Callable[[Object], Iterable[str]]


POD_BY_SANDBOX_HASH: Final = Index(POD, INDEX_POD_NAME_HASH, pod_name_hash_index)
SANDBOX_BY_POOL: Final = Index(SANDBOX, INDEX_SANDBOX_WARM_POOL, sandbox_warm_pool_index)
POOL_BY_TEMPLATE: Final = Index(SANDBOX_WARM_POOL, INDEX_POOL_TEMPLATE_REF, pool_template_ref_index)
CLAIM_BY_POOL: Final = Index(SANDBOX_CLAIM, INDEX_CLAIM_POOL, claim_pool_index)
SANDBOX_BY_CLAIM_UID: Final = Index(SANDBOX, INDEX_SANDBOX_CLAIM_UID, sandbox_claim_uid_index)
SANDBOX_BY_TEMPLATE: Final = Index(SANDBOX, INDEX_SANDBOX_TEMPLATE_REF, sandbox_template_index)


def ensure_indexes(cache: Cache, *indexes: Index) -> None:
    """Register `indexes` on `cache`; one already registered (by another controller) is kept."""
    for index in indexes:
        # The informer refuses a second index of the same name: another controller registered it, with
        # this very function (every index is defined once, above).
        with contextlib.suppress(ValueError):
            cache.add_index(index.kind, index.name, index.fn)
