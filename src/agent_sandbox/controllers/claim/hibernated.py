"""A claim whose Sandbox is hibernated (ours, docs/lifecycle.md "Deep hibernation").

While the lifecycle controller keeps a claim's Sandbox in a SandboxArchive, the claim carries the annotation
`lifecycle.agents.x-k8s.io/hibernated-sandbox: <name>`. The claim is then neither given a replacement
(warm or cold: that would lose the archived Sandbox's volumes and identity) nor reported as missing: its
Ready condition is False with reason `SandboxHibernated`, and the message says how to restore it. The
restored Sandbox is controlled by the claim again, so resolution finds it before this rule applies.
"""

from __future__ import annotations

from agent_sandbox.api.lifecycle import ANNOTATION_HIBERNATED_SANDBOX
from agent_sandbox.api.meta import ReadOnlyObject

from .errors import ClaimError

__all__ = ["REASON_SANDBOX_HIBERNATED", "SandboxHibernated", "hibernated_sandbox"]

REASON_SANDBOX_HIBERNATED = "SandboxHibernated"


class SandboxHibernated(ClaimError):
    """Ready=False/SandboxHibernated; not retried (restoring the Sandbox re-triggers the claim)."""

    reason = REASON_SANDBOX_HIBERNATED
    suppressed = True

    def __init__(self, name: str) -> None:
        # The claim controller does not read lifecycle settings: the router's restore is offered only as far
        # as it goes (until December 7 this said a router request restores it, whatever the Sandbox asked).
        super().__init__(
            f'Sandbox "{name}" is hibernated; `agent-sandbox lifecycle resume {name}` restores it, as does a '
            "request through a router running --sandbox-lifecycle if it asked for auto-resume"
        )


def hibernated_sandbox(claim: ReadOnlyObject) -> str:
    """The name of the claim's hibernated Sandbox ("" when it has none)."""
    return str(
        ((claim.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_HIBERNATED_SANDBOX) or ""
    )
