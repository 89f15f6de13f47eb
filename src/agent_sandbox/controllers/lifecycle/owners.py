"""Owner-reference patches on a hibernated Sandbox's children (PVCs, Service): the archive's hold, and its
handing back to the restored Sandbox (docs/design/lifecycle-archive.md "Mechanics"). Pure.

Every patch carries the child's resourceVersion: a concurrent writer (the Sandbox controller adopting the
same child) makes one of the two fail (409) instead of one silently undoing the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import ReadOnlyObject, new_controller_ref

__all__ = ["adopt_child_patch", "archive_owner_ref", "handover_child_patch", "release_child_patch"]


def _meta(obj: ReadOnlyObject) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def archive_owner_ref(archive: ReadOnlyObject) -> dict[str, Any]:
    """The owner reference the archive puts on the children it keeps (not a controller reference)."""
    return {
        "apiVersion": lc.ARCHIVE.api_version,
        "kind": lc.ARCHIVE.kind,
        "name": _meta(archive)["name"],
        "uid": _meta(archive).get("uid", ""),
        "controller": False,
        "blockOwnerDeletion": False,
    }


def adopt_child_patch(child: ReadOnlyObject, archive: ReadOnlyObject) -> dict[str, Any]:
    """Merge patch adding the archive's (non-controller) owner reference to a child."""
    refs = [dict(r) for r in _meta(child).get("ownerReferences") or []]
    refs.append(archive_owner_ref(archive))
    return {"metadata": {"resourceVersion": _meta(child).get("resourceVersion"), "ownerReferences": refs}}


def handover_child_patch(child: ReadOnlyObject, sandbox: ReadOnlyObject, archive_uid: str) -> dict[str, Any]:
    """Merge patch giving a child the archive keeps to the restored Sandbox (its controller reference, as
    the Sandbox controller's adoption writes it) and dropping the archive's, in one guarded write."""
    refs = [
        dict(r)
        for r in _meta(child).get("ownerReferences") or []
        if r.get("uid") != archive_uid and not r.get("controller")
    ]
    meta = _meta(sandbox)
    refs.append(
        new_controller_ref(
            api_version=c.SANDBOX_API_VERSION, kind=c.KIND_SANDBOX, name=meta["name"], uid=meta.get("uid", "")
        )
    )
    return {"metadata": {"resourceVersion": _meta(child).get("resourceVersion"), "ownerReferences": refs}}


def release_child_patch(child: ReadOnlyObject, archive_uid: str) -> dict[str, Any]:
    """Merge patch removing the archive's owner reference from a child (the restored Sandbox adopts it)."""
    refs = [dict(r) for r in _meta(child).get("ownerReferences") or [] if r.get("uid") != archive_uid]
    return {
        "metadata": {"resourceVersion": _meta(child).get("resourceVersion"), "ownerReferences": refs or None}
    }
