"""Pure builders for the children of a Sandbox: PVCs, the Pod, the headless Service (controllers spec §1.4-§1.8).

Owns: the exact shape of every object the Sandbox controller creates (names, labels, annotations, owner
references, volumes, Service ports), the Pod metadata repair of §1.6 step 2 (template label/annotation
propagation with `propagated-*` bookkeeping and reserved-key scrubbing), the adoption rule of §0.4 (and
ours on top of it: a hibernated Sandbox's volumes go to its restore only, `archive_refusal`), and the
error texts that name foreign owners. Everything works on raw dicts (`kube.Object`) and never mutates its
inputs: objects handed out by informer caches are shared.

Does not own: when any of this happens (see `decide`) or I/O (see `execute`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agent_sandbox.api.constants import (
    ADOPTABLE_TRUE,
    ANNOTATION_PROPAGATED_ANNOTATIONS,
    ANNOTATION_PROPAGATED_LABELS,
    EXTENSIONS_GROUP,
    GROUP,
    KIND_SANDBOX,
    LABEL_ADOPTABLE,
    LABEL_CREATED_BY,
    LABEL_SANDBOX_NAME_HASH,
    LABEL_SANDBOX_TEMPLATE_REF_HASH,
    LABEL_WARM_POOL_SANDBOX,
    SANDBOX_API_VERSION,
)
from agent_sandbox.api.kinds import SANDBOX_WARM_POOL
from agent_sandbox.api.meta import (
    api_group,
    controlled_by,
    controller_ref,
    is_reserved_annotation,
    is_reserved_label,
    new_controller_ref,
    normalize_created_by,
)
from agent_sandbox.controllers.lifecycle.owners import archive_hold, restores
from agent_sandbox.kube import Object

__all__ = [
    "FIELD_MANAGER",
    "adoption_allowed",
    "adoption_refusal",
    "archive_refusal",
    "build_pod",
    "build_pvc",
    "build_service",
    "extension_pod_labels",
    "foreign_owner_error",
    "merge_volume_claim_volumes",
    "owned_by_predecessor",
    "owner_refs_with_controller",
    "pvc_name",
    "repair_pod_metadata",
    "sandbox_owner_ref",
    "service_ports",
    "service_ports_equal",
]

FIELD_MANAGER = "sandbox-controller"
"""Field manager of every create (controllers spec §1.4, §1.5.1, §1.8)."""

#: Pod labels derived from the Sandbox's extension ownership (§1.5.3); kept in sync on existing Pods.
EXTENSION_POD_LABEL_KEYS = (LABEL_WARM_POOL_SANDBOX, LABEL_SANDBOX_TEMPLATE_REF_HASH)

#: Reserved annotations the controller itself writes on Pods, so they survive the reserved-key scrub.
_CONTROLLER_POD_ANNOTATIONS = frozenset({ANNOTATION_PROPAGATED_LABELS, ANNOTATION_PROPAGATED_ANNOTATIONS})


def _q(value: str) -> str:
    """Quote like Go's %q for the plain names that appear in error texts."""
    return json.dumps(value)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labels: Mapping[str, str] = _meta(obj).get("labels") or {}
    return labels


def _template_meta(sandbox: Object, field: str) -> Mapping[str, str]:
    tmpl = (sandbox.get("spec") or {}).get("podTemplate") or {}
    value: Mapping[str, str] = (tmpl.get("metadata") or {}).get(field) or {}
    return value


# --------------------------------------------------------------------------- ownership


def sandbox_owner_ref(sandbox: Object) -> dict[str, Any]:
    """The controller owner reference every child of `sandbox` carries (§1.13)."""
    meta = _meta(sandbox)
    return new_controller_ref(
        api_version=SANDBOX_API_VERSION, kind=KIND_SANDBOX, name=meta["name"], uid=meta.get("uid", "")
    )


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def owner_refs_with_controller(obj: Object, sandbox: Object) -> list[dict[str, Any]]:
    """`obj`'s owner references with the Sandbox as controller; other non-controller refs are kept (§0.4).

    A reference to the Sandbox itself (same group, kind and name, as controller-runtime's
    `SetControllerReference` compares them) is replaced, not kept beside the new one: a Pod, PVC or Service
    whose reference a user had set to `controller: false` ended up with two references to one Sandbox
    (until December 6).
    """
    own = sandbox_owner_ref(sandbox)
    key = (_group(own["apiVersion"]), own["kind"], own["name"])
    refs = [
        dict(r)
        for r in _meta(obj).get("ownerReferences") or ()
        if not r.get("controller") and (_group(r.get("apiVersion", "")), r.get("kind"), r.get("name")) != key
    ]
    refs.append(own)
    return refs


def adoption_allowed(obj: Object, name_hash: str) -> bool:
    """§0.4: an unowned object may be adopted iff `adoptable=true` or it already carries the tracking label."""
    labels = _labels(obj)
    return labels.get(LABEL_ADOPTABLE) == ADOPTABLE_TRUE or labels.get(LABEL_SANDBOX_NAME_HASH) == name_hash


def adoption_refusal(kind: str, name: str) -> str:
    """Error text for an unowned object that lacks both authorising labels."""
    return (
        f"cannot adopt unowned {kind} {_q(name)}: missing required pool authorization label "
        f"({_q(LABEL_ADOPTABLE)}) or sandbox tracking label ({_q(LABEL_SANDBOX_NAME_HASH)})"
    )


def archive_refusal(kind: str, obj: Object, sandbox: Object) -> str | None:
    """Why the unowned `obj`, kept by a SandboxArchive (a hibernated Sandbox's PVC or Service), is not
    adopted by `sandbox`; None when no archive keeps it, or `sandbox` is that archive's restore.

    Ours, on top of §0.4 (upstream has no archives: a child without an archive's owner reference is adopted
    exactly as the spec says). A hibernated Sandbox's volumes carry its tracking label, so by §0.4 alone a
    new Sandbox created under the hibernated name adopted them, and its Pod mounted (and could change) the
    hibernated data; until December 7 it did. Only the Sandbox the lifecycle controller creates to restore
    the archive (`restores`: its `restored-from` annotation names the archive's UID) takes them back; a
    restore an older controller created without it is given the annotation (or its volumes) by the
    lifecycle controller.

    The archive itself is not read here (this controller has no grant for archives): whether the hibernated
    Sandbox can still be restored (not expired) is said by `agent-sandbox lifecycle resume` and the
    lifecycle controller's `HibernationConflict` Event, not by this text (until December 7 it offered the
    restore of an expired one too).
    """
    ref = archive_hold(obj)
    if ref is None or restores(sandbox, str(ref.get("uid") or "")):
        return None
    name, archive = _meta(obj).get("name", ""), str(ref.get("name") or "")
    return (
        f"{kind} {_q(name)} belongs to the hibernated Sandbox {_q(archive)} (SandboxArchive {_q(archive)}, "
        f"UID: {ref.get('uid', '')}) and is not given to this Sandbox, which is not restored from it: "
        f"delete the archive (kubectl delete sandboxarchive {archive}; its volumes go with it) to keep this "
        f"Sandbox, with new volumes; or delete this Sandbox and restore the hibernated one, unless it has "
        f"expired (agent-sandbox lifecycle resume {archive} says which)"
    )


def foreign_owner_error(kind: str, obj: Object, sandbox_name: str) -> str:
    """Error text naming the controller that owns `obj` instead of the Sandbox."""
    ref = controller_ref(_meta(obj)) or {}
    return (
        f"{kind} {_q(_meta(obj).get('name', ''))} is owned by {ref.get('kind', '')}/{ref.get('name', '')} "
        f"(UID: {ref.get('uid', '')}), not by sandbox {_q(sandbox_name)}"
    )


def owned_by_predecessor(obj: Object, sandbox_name: str) -> bool:
    """Whether a foreign `obj` belongs to an earlier Sandbox of the same name (deleted, its children going).

    Children are named after their Sandbox, and a warm pool's generated names are reused over time (five
    random characters), so a new member can meet the Pod, Service or PVC of a deleted namesake that has
    not finished terminating, or that the garbage collector has not reached yet. Such an object is still
    foreign (never adopted; the pass reports the §1.6 error) but it goes away by itself: a wait, not a fault.
    """
    ref = controller_ref(_meta(obj)) or {}
    return (
        ref.get("kind") == KIND_SANDBOX
        and api_group(str(ref.get("apiVersion", ""))) == GROUP
        and ref.get("name") == sandbox_name
    )


# --------------------------------------------------------------------------- PVCs (§1.4)


def pvc_name(template: Mapping[str, Any], sandbox_name: str) -> str:
    """`<template name>-<sandbox name>`."""
    return f"{_meta(template).get('name', '')}-{sandbox_name}"


def build_pvc(template: Mapping[str, Any], sandbox: Object, name_hash: str) -> Object:
    """A PVC from one volumeClaimTemplate: template labels + tracking label, template annotations."""
    tmeta = _meta(template)
    meta: dict[str, Any] = {
        "name": pvc_name(template, _meta(sandbox)["name"]),
        "namespace": _meta(sandbox).get("namespace"),
        "labels": {**(tmeta.get("labels") or {}), LABEL_SANDBOX_NAME_HASH: name_hash},
        "ownerReferences": [sandbox_owner_ref(sandbox)],
    }
    if tmeta.get("annotations"):
        meta["annotations"] = dict(tmeta["annotations"])
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta,
        "spec": copy.deepcopy(template.get("spec") or {}),
    }


# --------------------------------------------------------------------------- Pod (§1.5.1, §1.5.3, §1.6)


def merge_volume_claim_volumes(existing: Sequence[Object], pvc_volumes: Sequence[Object]) -> list[Object]:
    """StatefulSet precedence: drop template volumes named like a PVC volume, then append the PVC volumes."""
    if not pvc_volumes:
        return list(existing)
    names = {v.get("name") for v in pvc_volumes}
    return [v for v in existing if v.get("name") not in names] + list(pvc_volumes)


def extension_pod_labels(sandbox: Object) -> dict[str, str]:
    """§1.5.3: labels propagated from the Sandbox only while an extensions controller owns it."""
    ref = controller_ref(_meta(sandbox))
    if ref is None or api_group(str(ref.get("apiVersion", ""))) != EXTENSIONS_GROUP:
        return {}
    labels = _labels(sandbox)
    out: dict[str, str] = {}
    if controlled_by(sandbox, SANDBOX_WARM_POOL) and labels.get(LABEL_WARM_POOL_SANDBOX):
        out[LABEL_WARM_POOL_SANDBOX] = labels[LABEL_WARM_POOL_SANDBOX]
    if labels.get(LABEL_SANDBOX_TEMPLATE_REF_HASH):
        out[LABEL_SANDBOX_TEMPLATE_REF_HASH] = labels[LABEL_SANDBOX_TEMPLATE_REF_HASH]
    return out


def _created_by(sandbox: Object) -> str | None:
    value = _labels(sandbox).get(LABEL_CREATED_BY)
    return normalize_created_by(value) if value else None


def build_pod(sandbox: Object, name_hash: str) -> Object:
    """The Pod of §1.5.1: template spec verbatim plus PVC volumes; filtered, bookkept metadata."""
    smeta = _meta(sandbox)
    spec = sandbox.get("spec") or {}
    labels: dict[str, str] = {}
    copied_labels: list[str] = []
    for key, value in _template_meta(sandbox, "labels").items():
        if not is_reserved_label(key):
            labels[key] = value
            copied_labels.append(key)
    # System labels are applied after user input so a template can never override them.
    labels[LABEL_SANDBOX_NAME_HASH] = name_hash
    labels.update(extension_pod_labels(sandbox))
    created_by = _created_by(sandbox)
    if created_by:
        labels[LABEL_CREATED_BY] = created_by

    annotations: dict[str, str] = {}
    copied_annotations: list[str] = []
    for key, value in _template_meta(sandbox, "annotations").items():
        if not is_reserved_annotation(key):
            annotations[key] = value
            copied_annotations.append(key)
    if copied_labels:
        annotations[ANNOTATION_PROPAGATED_LABELS] = ",".join(sorted(copied_labels))
    if copied_annotations:
        annotations[ANNOTATION_PROPAGATED_ANNOTATIONS] = ",".join(sorted(copied_annotations))

    pod_spec = copy.deepcopy((spec.get("podTemplate") or {}).get("spec") or {})
    pvc_volumes = [
        {"name": _meta(t).get("name", ""), "persistentVolumeClaim": {"claimName": pvc_name(t, smeta["name"])}}
        for t in spec.get("volumeClaimTemplates") or ()
    ]
    if pvc_volumes:
        pod_spec["volumes"] = merge_volume_claim_volumes(pod_spec.get("volumes") or [], pvc_volumes)

    meta: dict[str, Any] = {
        "name": smeta["name"],
        "namespace": smeta.get("namespace"),
        "labels": labels,
        "ownerReferences": [sandbox_owner_ref(sandbox)],
    }
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def _split_keys(value: str | None) -> list[str]:
    return [k for k in (value or "").split(",") if k]


def repair_pod_metadata(
    pod: Object, sandbox: Object, name_hash: str
) -> tuple[dict[str, str], dict[str, str], bool]:
    """§1.6 step 2 on copies of the Pod's labels and annotations.

    Returns:
        (labels, annotations, changed). The Pod itself is not modified.
    """
    labels = dict(_labels(pod))
    annotations: dict[str, str] = dict(_meta(pod).get("annotations") or {})
    before = (dict(labels), dict(annotations))
    tmpl_labels = _template_meta(sandbox, "labels")
    tmpl_annotations = _template_meta(sandbox, "annotations")

    labels[LABEL_SANDBOX_NAME_HASH] = name_hash
    managed_labels = []
    for key, value in tmpl_labels.items():
        if not is_reserved_label(key):
            labels[key] = value
            managed_labels.append(key)
    for key in _split_keys(annotations.get(ANNOTATION_PROPAGATED_LABELS)):
        if is_reserved_label(key):
            # An older controller may have copied a reserved key; scrub it (never the tracking label).
            if key != LABEL_SANDBOX_NAME_HASH:
                labels.pop(key, None)
        elif key not in tmpl_labels:
            labels.pop(key, None)
    wanted_ext = extension_pod_labels(sandbox)
    for key in EXTENSION_POD_LABEL_KEYS:
        if key in wanted_ext:
            labels[key] = wanted_ext[key]
        else:
            labels.pop(key, None)
    created_by = _created_by(sandbox)
    if created_by:
        labels[LABEL_CREATED_BY] = created_by
    else:
        labels.pop(LABEL_CREATED_BY, None)

    managed_annotations = []
    for key, value in tmpl_annotations.items():
        if not is_reserved_annotation(key):
            annotations[key] = value
            managed_annotations.append(key)
    for key in _split_keys(annotations.get(ANNOTATION_PROPAGATED_ANNOTATIONS)):
        if is_reserved_annotation(key):
            if key not in _CONTROLLER_POD_ANNOTATIONS:
                annotations.pop(key, None)
        elif key not in tmpl_annotations:
            annotations.pop(key, None)
    # A shrinking list is written as "" rather than removed (upstream behaviour, §1.6 step 2.8).
    for key, keys in (
        (ANNOTATION_PROPAGATED_LABELS, managed_labels),
        (ANNOTATION_PROPAGATED_ANNOTATIONS, managed_annotations),
    ):
        joined = ",".join(sorted(keys))
        if annotations.get(key, "") != joined:
            annotations[key] = joined
    return labels, annotations, (labels, annotations) != before


# --------------------------------------------------------------------------- Service (§1.8)


def _container_ports(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    ports: list[Mapping[str, Any]] = []
    for container in pod_spec.get("containers") or ():
        ports.extend(container.get("ports") or ())
    for container in pod_spec.get("initContainers") or ():
        # Native sidecars (restartPolicy Always) serve traffic like regular containers.
        if container.get("restartPolicy") == "Always":
            ports.extend(container.get("ports") or ())
    return ports


def service_ports(sandbox: Object) -> list[dict[str, Any]] | None:
    """Derived headless-Service ports (§1.8 steps 1-6); None when the template declares no ports."""
    pod_spec = ((sandbox.get("spec") or {}).get("podTemplate") or {}).get("spec") or {}
    names: dict[tuple[int, str], str] = {}
    reserved: set[str] = set()
    for port in _container_ports(pod_spec):
        number = int(port.get("containerPort") or 0)
        if number == 0:
            continue
        key = (number, str(port.get("protocol") or "TCP"))
        names.setdefault(key, "")
        name = str(port.get("name") or "")
        # First explicit name per (port, protocol) wins, unless another pair already claimed it.
        if not name or names[key] or name in reserved:
            continue
        names[key] = name
        reserved.add(name)
    if not names:
        return None
    out = []
    for number, protocol in sorted(names):
        name = names[(number, protocol)] or _generated_port_name(number, protocol, reserved)
        reserved.add(name)
        out.append({"name": name, "protocol": protocol, "port": number, "targetPort": number})
    return out


def _generated_port_name(port: int, protocol: str, reserved: set[str]) -> str:
    base = f"p-{port}-{protocol.lower()}"
    if base not in reserved:
        return base
    suffix = 2
    while f"{base}-{suffix}" in reserved:
        suffix += 1
    return f"{base}-{suffix}"


def service_ports_equal(
    current: Sequence[Mapping[str, Any]] | None, desired: Sequence[Object] | None
) -> bool:
    """Compare by name, protocol, port and targetPort only (nodePort, appProtocol... are not managed)."""
    current, desired = current or (), desired or ()
    if len(current) != len(desired):
        return False
    for a, b in zip(current, desired, strict=True):
        for field in ("name", "port", "targetPort"):
            if a.get(field) != b.get(field):
                return False
        if (a.get("protocol") or "TCP") != (b.get("protocol") or "TCP"):
            return False
    return True


def build_service(sandbox: Object, name_hash: str) -> Object:
    """The headless Service: `clusterIP: None`, selector and label = tracking label, derived ports."""
    smeta = _meta(sandbox)
    spec: dict[str, Any] = {"clusterIP": "None", "selector": {LABEL_SANDBOX_NAME_HASH: name_hash}}
    ports = service_ports(sandbox)
    if ports is not None:
        spec["ports"] = ports
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": smeta["name"],
            "namespace": smeta.get("namespace"),
            "labels": {LABEL_SANDBOX_NAME_HASH: name_hash},
            "ownerReferences": [sandbox_owner_ref(sandbox)],
        },
        "spec": spec,
    }
