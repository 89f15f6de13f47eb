"""The lifecycle component's RBAC (ours, docs/lifecycle.md): what the controller and the router need beyond
upstream's grants, and only when the feature is installed.

The controller already holds everything lifecycle does to Sandboxes, PVCs, Services and Events
(``rbac.CORE_RULES``); the additions are its own kind, SandboxArchive, and ``patch`` on SandboxClaims.
Hibernating a claim-owned Sandbox marks its claim (and restore or expiry unmarks it) with or without
``--extensions``, but the claim grants of ``EXTENSIONS_RULES`` are bound only with extensions (the Helm chart
binds that role only with ``controller.extensions=true``). The reads of claims and templates happen only with
``--extensions`` (controllers/lifecycle/watches.py), under that role, so they are not repeated here. The router,
which upstream lets read Pods only, needs to write Sandboxes (``operatingMode``, the activity record) and
restore requests on archives: that role ships in the opt-in ``k8s/router/lifecycle`` component and the Helm
value ``router.lifecycle.enabled``, never with the plain router.
"""

from __future__ import annotations

from typing import Final

from agent_sandbox.api import constants as c
from agent_sandbox.api.lifecycle import ARCHIVE
from agent_sandbox.manifests.rbac import Rule

__all__ = ["LIFECYCLE_NAME", "LIFECYCLE_RULES", "ROUTER_LIFECYCLE_NAME", "ROUTER_LIFECYCLE_RULES"]

LIFECYCLE_NAME: Final = "agent-sandbox-controller-lifecycle"
ROUTER_LIFECYCLE_NAME: Final = "sandbox-router-lifecycle"

LIFECYCLE_RULES: Final[tuple[Rule, ...]] = (
    Rule(
        (ARCHIVE.group,),
        (ARCHIVE.plural,),
        ("create", "delete", "get", "list", "patch", "update", "watch"),
        "Hibernation creates a SandboxArchive (informer for the restore requests), records on it the restored"
        " Sandbox's UID and an expiry mark (patch), refreshes its copy of a Sandbox edited while being archived"
        " (update); a restore deletes it.",
    ),
    Rule(
        (c.EXTENSIONS_GROUP,),
        (c.PLURAL_SANDBOX_CLAIMS,),
        ("patch",),
        "Hibernating a claim-owned Sandbox marks the claim (annotation hibernated-sandbox); restore and expiry"
        " unmark it. Done with or without --extensions, whose role (with the claim reads) may not be bound.",
    ),
)

ROUTER_LIFECYCLE_RULES: Final[tuple[Rule, ...]] = (
    Rule(
        (c.GROUP,),
        (c.PLURAL_SANDBOXES,),
        ("get", "list", "watch", "patch"),
        "Resume on request (operatingMode: Running) and the coalesced last-activity annotation.",
    ),
    Rule(
        (c.EXTENSIONS_GROUP,),
        (c.PLURAL_SANDBOX_TEMPLATES,),
        ("get", "list", "watch"),
        "Template-level lifecycle settings (auto-resume, idle timeout).",
    ),
    Rule(
        (ARCHIVE.group,),
        (ARCHIVE.plural,),
        ("get", "list", "watch", "patch"),
        "Restore on request: the router only asks (spec.restore); the controller recreates the Sandbox.",
    ),
    Rule(
        (c.EXTENSIONS_GROUP,),
        (c.PLURAL_SANDBOX_CLAIMS,),
        ("get",),
        "A restore under an expired claim is refused at once (503), not held until the archive goes.",
    ),
)
