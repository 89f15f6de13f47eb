"""The SandboxArchive CRD (ours, docs/lifecycle.md "Deep hibernation"; docs/design/lifecycle-archive.md).

A small, single-version, namespaced kind of our own group: a hibernated Sandbox's identity and spec
(`spec.sandbox`, kept verbatim), when and why it was archived, the children it keeps alive, and the restore
request (`spec.restore`). No status subresource: everything is written once by the controller, except
`spec.restore`, which a router or the CLI sets to ask for the restore. Installed only by the opt-in
lifecycle component (`k8s/lifecycle/`, Helm `lifecycle.enabled`).
"""

from __future__ import annotations

from typing import Any

from agent_sandbox.api.lifecycle import ANNOTATION_EXPIRED_AT, ARCHIVE, Cause

__all__ = ["archive_crd"]


def _string(**extra: Any) -> dict[str, Any]:
    return {"type": "string", **extra}


def _annotation_path(key: str) -> str:
    """The printer-column JSONPath of annotation `key` (`.metadata.annotations.a\\.b/c`)."""
    return ".metadata.annotations." + key.replace(".", "\\.")


def archive_crd() -> dict[str, Any]:
    """The CustomResourceDefinition object of `SandboxArchive`."""
    spec_schema = {
        "type": "object",
        "required": ["sandbox", "sandboxUID", "archivedAt"],
        "properties": {
            "sandbox": {
                "type": "object",
                "description": "The archived Sandbox: metadata (labels, annotations, ownerReferences) and spec.",
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "sandboxUID": _string(description="UID of the archived Sandbox object."),
            "archivedAt": _string(format="date-time"),
            "reason": _string(enum=[str(Cause.AFTER), str(Cause.REQUESTED)]),
            "children": {
                "type": "array",
                "description": "PVCs and Service kept alive by this archive (owner reference).",
                "items": {
                    "type": "object",
                    "required": ["kind", "name"],
                    "properties": {
                        "kind": _string(enum=["PersistentVolumeClaim", "Service"]),
                        "name": _string(),
                    },
                },
            },
            "restore": {
                "type": "object",
                "description": "Set to ask for the restore (router on request, CLI/SDK resume by name).",
                "required": ["cause"],
                "properties": {
                    "cause": _string(enum=[str(Cause.REQUEST), str(Cause.MANUAL)]),
                    "requestedAt": _string(format="date-time"),
                },
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": ARCHIVE.crd_name},
        "spec": {
            "group": ARCHIVE.group,
            "names": {
                "kind": ARCHIVE.kind,
                "listKind": ARCHIVE.list_kind,
                "plural": ARCHIVE.plural,
                "shortNames": list(ARCHIVE.short_names),
                "singular": ARCHIVE.singular,
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": ARCHIVE.version,
                    "served": True,
                    "storage": True,
                    "additionalPrinterColumns": [
                        {"jsonPath": ".spec.reason", "name": "Reason", "type": "string"},
                        {"jsonPath": ".spec.archivedAt", "name": "Archived", "type": "date"},
                        {"jsonPath": ".spec.restore.cause", "name": "Restore", "type": "string"},
                        # Set on an expired `Retain` archive (never restored): tells it from a restorable
                        # one in `kubectl get sbarchive`. The key's dots are escaped (JSONPath field).
                        {
                            "jsonPath": _annotation_path(ANNOTATION_EXPIRED_AT),
                            "name": "Expired",
                            "type": "date",
                        },
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": _string(),
                                "kind": _string(),
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                            },
                        }
                    },
                }
            ],
        },
    }
