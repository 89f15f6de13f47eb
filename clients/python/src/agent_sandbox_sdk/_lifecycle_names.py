"""The lifecycle controller's wire names the SDK reads and writes: annotations and condition reasons.

Copies of `agent_sandbox.api.lifecycle`'s (this SDK is standalone and cannot import the main package;
`tests/unit/sdk/test_lifecycle_wire_names.py` keeps them in step).
"""

from __future__ import annotations

__all__ = [
    "ANNOTATION_PREFIX",
    "EXPIRED_AT_ANNOTATION",
    "HIBERNATE_ANNOTATION",
    "REASON_CLAIM_EXPIRED",
    "REASON_SANDBOX_EXPIRED",
    "REASON_SANDBOX_HIBERNATED",
    "SUSPENDED_AT_ANNOTATION",
    "SUSPEND_REASON_ANNOTATION",
]

# Ours (docs/lifecycle.md): the annotations `agent-sandbox lifecycle suspend|resume` write, copied from
# `agent_sandbox.api.lifecycle.suspend_patch` / `resume_patch` (this SDK is standalone and cannot import the
# main package; keep them in step). Until December 6 a suspend left a previous `suspend-reason: Idle` and its
# `suspended-at` in place, and a resume left a pending `hibernate: "true"`, so the lifecycle controller
# suspended and archived the Sandbox again right after it was resumed.
ANNOTATION_PREFIX = "lifecycle.agents.x-k8s.io/"
SUSPEND_REASON_ANNOTATION = ANNOTATION_PREFIX + "suspend-reason"
SUSPENDED_AT_ANNOTATION = ANNOTATION_PREFIX + "suspended-at"
HIBERNATE_ANNOTATION = ANNOTATION_PREFIX + "hibernate"
#: On a SandboxArchive: the lifecycle controller found it expired (`shutdownPolicy: Retain`): kept, never
#: restored (`agent_sandbox.api.lifecycle.ANNOTATION_EXPIRED_AT`).
EXPIRED_AT_ANNOTATION = ANNOTATION_PREFIX + "expired-at"
REASON_SANDBOX_EXPIRED = "SandboxExpired"
REASON_SANDBOX_HIBERNATED = "SandboxHibernated"
REASON_CLAIM_EXPIRED = "ClaimExpired"
