"""What a claimed Sandbox looks like: pod-template metadata, claim labels, and the cold-start body.

Implements controllers spec §4.7 (cold creation), §4.7.3 (env injection), §4.7.4 (volumeClaimTemplates
merge) and the "desired pod template metadata" shared by §4.4 step 3 (bound-Sandbox sync) and §4.6 step 3
(warm adoption), so the three paths can never disagree and a freshly adopted or created Sandbox needs no
follow-up sync write. Pure functions over wire dicts; inputs are never modified.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api.lifecycle import ANNOTATION_CLAIM_ENV, claim_env_annotation
from agent_sandbox.api.meta import ReadOnlyObject, new_controller_ref
from agent_sandbox.api.naming import template_ref_hash

from ..blueprint import apply_secure_defaults, blueprint
from .errors import EnvVarsInjectionRejected, ReconcilerError, VolumeClaimTemplatesError
from .metadata import additional_metadata, merge_no_override

__all__ = [
    "build_cold_sandbox",
    "claim_created_by",
    "claim_owner_ref",
    "desired_pod_metadata",
    "inject_env",
    "merge_volume_claim_templates",
]


def claim_created_by(claim: ReadOnlyObject) -> str:
    """The claim's raw `agents.x-k8s.io/created-by` label ("" when absent)."""
    return str(((claim.get("metadata") or {}).get("labels") or {}).get(c.LABEL_CREATED_BY) or "")


def claim_owner_ref(claim: ReadOnlyObject) -> dict[str, Any]:
    """Controller owner reference to the claim (always written as v1beta1)."""
    meta = claim["metadata"]
    return new_controller_ref(
        api_version=c.EXTENSIONS_API_VERSION, kind=c.KIND_SANDBOX_CLAIM, name=meta["name"], uid=meta["uid"]
    )


def apply_claim_labels(labels: dict[str, str], claim: ReadOnlyObject, ref_hash: str | None) -> None:
    """claim-uid, the created-by rule (claim's non-empty value, else removed) and the ref-hash, in place."""
    labels[c.LABEL_CLAIM_UID] = claim["metadata"]["uid"]
    created_by = claim_created_by(claim)
    if created_by:
        labels[c.LABEL_CREATED_BY] = created_by
    else:
        labels.pop(c.LABEL_CREATED_BY, None)
    if ref_hash:
        labels[c.LABEL_SANDBOX_TEMPLATE_REF_HASH] = ref_hash


def desired_pod_metadata(claim: ReadOnlyObject, template: ReadOnlyObject) -> dict[str, dict[str, str]]:
    """Pod template metadata of a claim's Sandbox built from `template` (§4.4 step 3, §4.6 step 3.8).

    Template pod labels/annotations + claim-uid + ref-hash + created-by rule + the claim's additional
    metadata merged without overrides.

    Raises:
        ReconcilerError: additional metadata conflicts with the template (§4.7.2), or the claim's env
            overrides a variable the template's policy does not let it (§4.7.3).
        EnvVarsInjectionRejected: the claim has env and the template's policy refuses injection.
    """
    pod_meta = ((template.get("spec") or {}).get("podTemplate") or {}).get("metadata") or {}
    labels = dict(pod_meta.get("labels") or {})
    annotations = dict(pod_meta.get("annotations") or {})
    apply_claim_labels(labels, claim, template_ref_hash(template["metadata"]["name"]))
    # Ours (docs/lifecycle.md): a template that projects the claim env annotation gets it on every claim.
    claim_env = list((claim.get("spec") or {}).get("env") or [])
    env = claim_env_annotation(claim_env, _pod_spec(template))
    if env is not None:
        if claim_env:
            # The template's envVarsInjectionPolicy holds for every env that reaches the Pod: the annotation
            # follows edits of a bound claim's env, and until December 6 those skipped the policy (a
            # `Disallowed` template ran a claim's injected or overridden variables). Refused, the whole
            # metadata sync is skipped, so the Pod keeps the last env the policy allowed.
            inject_env(template.get("spec") or {}, copy.deepcopy(dict(_pod_spec(template))), claim_env)
        annotations[ANNOTATION_CLAIM_ENV] = env
    extra_labels, extra_annotations = additional_metadata(claim)
    merge_no_override(labels, extra_labels, what="label")
    merge_no_override(annotations, extra_annotations, what="annotation")
    return {"labels": labels, "annotations": annotations}


def _pod_spec(template: ReadOnlyObject) -> ReadOnlyObject:
    return ((template.get("spec") or {}).get("podTemplate") or {}).get("spec") or {}


# --------------------------------------------------------------------------- env injection (§4.7.3)

_ENV_REJECTED = "environment variable injection rejected"


def inject_env(template_spec: ReadOnlyObject, pod_spec: dict[str, Any], env: list[Mapping[str, Any]]) -> None:
    """Inject the claim's `spec.env` into `pod_spec` (a copy owned by the caller) per the template policy.

    Raises:
        EnvVarsInjectionRejected: policy Disallowed, or Allowed with a target container using envFrom.
        ReconcilerError: unknown target container, or an override the policy forbids.
    """
    policy = template_spec.get("envVarsInjectionPolicy") or c.EnvVarsInjectionPolicy.DISALLOWED
    if policy not in (c.EnvVarsInjectionPolicy.ALLOWED, c.EnvVarsInjectionPolicy.OVERRIDES):
        raise EnvVarsInjectionRejected(
            f"{_ENV_REJECTED}: environment variable injection is not allowed by the template policy"
        )
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for entry in env:
        groups.setdefault(entry.get("containerName") or "", []).append(entry)
    init = pod_spec.get("initContainers") or []
    regular = pod_spec.get("containers") or []
    known = {ct.get("name") for ct in (*init, *regular)}
    for target, entries in groups.items():
        if target and target not in known:
            raise ReconcilerError(
                f'target container "{target}" not found in template for environment variable '
                f'"{entries[0].get("name", "")}"'
            )
    for field in ("initContainers", "containers"):
        containers = [dict(ct) for ct in pod_spec.get(field) or []]
        for index, container in enumerate(containers):
            wanted = list(groups.get(container.get("name") or "", [])) if container.get("name") else []
            if field == "containers" and index == 0:
                wanted += groups.get("", [])
            if wanted:
                _inject_into(container, wanted, policy)
        if containers:
            pod_spec[field] = containers


def _inject_into(container: dict[str, Any], entries: list[Mapping[str, Any]], policy: str) -> None:
    name = container.get("name", "")
    if policy == c.EnvVarsInjectionPolicy.ALLOWED and container.get("envFrom"):
        raise EnvVarsInjectionRejected(
            f'{_ENV_REJECTED}: container "{name}" uses EnvFrom sources; Allowed policy cannot safely '
            "prevent overriding EnvFrom-provided variables"
        )
    current = [dict(v) for v in container.get("env") or []]
    for entry in entries:
        var = {"name": entry["name"], "value": entry.get("value", "")}
        at = next((i for i, v in enumerate(current) if v.get("name") == var["name"]), None)
        if at is None:
            current.append(var)
        elif policy == c.EnvVarsInjectionPolicy.OVERRIDES:
            current[at] = var  # replaced in place; any valueFrom is dropped
        else:
            raise ReconcilerError(
                "environment variable override is not allowed by the template policy for variable "
                f'"{var["name"]}"'
            )
    container["env"] = current


# --------------------------------------------------------------------------- volumeClaimTemplates (§4.7.4)


def _vct_name(entry: ReadOnlyObject) -> str:
    return str((entry.get("metadata") or {}).get("name") or "")


def _validate_vcts(entries: list[ReadOnlyObject]) -> str | None:
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        name = _vct_name(entry)
        if not name:
            return f"volume claim template at index {index} has an empty name"
        if name in seen:
            return f'duplicate volume claim template name "{name}"'
        seen.add(name)
    return None


def merge_volume_claim_templates(
    template_spec: ReadOnlyObject, claim_vcts: list[ReadOnlyObject]
) -> list[ReadOnlyObject]:
    """The Sandbox's volumeClaimTemplates: the template's, merged with the claim's per policy.

    Raises:
        VolumeClaimTemplatesError: invalid lists, policy Disallowed, or a forbidden override.
        ReconcilerError: unknown policy value.
    """
    tmpl: list[ReadOnlyObject] = list(template_spec.get("volumeClaimTemplates") or [])
    if not claim_vcts:
        problem = _validate_vcts(tmpl)
        if problem:
            raise VolumeClaimTemplatesError(f"invalid volume claim templates in template: {problem}")
        return tmpl
    prefix = "failed to merge volume claim templates: "
    for label, entries in (("template", tmpl), ("claim", claim_vcts)):
        problem = _validate_vcts(entries)
        if problem:
            raise VolumeClaimTemplatesError(f"{prefix}{label}: {problem}")
    policy = template_spec.get("volumeClaimTemplatesPolicy") or c.VolumeClaimTemplatesPolicy.DISALLOWED
    claim_by_name = {_vct_name(e): e for e in claim_vcts}
    if policy == c.VolumeClaimTemplatesPolicy.DISALLOWED:
        raise VolumeClaimTemplatesError(f"{prefix}volume claim templates are disallowed by the template")
    if policy == c.VolumeClaimTemplatesPolicy.ALLOWED:
        for entry in tmpl:
            if _vct_name(entry) in claim_by_name:
                raise VolumeClaimTemplatesError(
                    f"{prefix}overriding volume claim templates is forbidden by the template: cannot "
                    f'override template volume "{_vct_name(entry)}"'
                )
        return [*tmpl, *claim_vcts]
    if policy == c.VolumeClaimTemplatesPolicy.OVERRIDES:
        tmpl_names = {_vct_name(e) for e in tmpl}
        merged = [claim_by_name.get(_vct_name(e), e) for e in tmpl]
        return merged + [e for e in claim_vcts if _vct_name(e) not in tmpl_names]
    raise ReconcilerError(f"{prefix}unknown volumeClaimTemplatesPolicy {policy!r}")


# --------------------------------------------------------------------------- cold Sandbox (§4.7)


def build_cold_sandbox(claim: ReadOnlyObject, template: ReadOnlyObject) -> dict[str, Any]:
    """The Sandbox a cold start creates: named like the claim, built from the template's blueprint.

    Raises:
        ClaimError: env / volumeClaimTemplates / metadata problems (see the helpers above).
    """
    cmeta = claim["metadata"]
    tname = template["metadata"]["name"]
    tspec: ReadOnlyObject = template.get("spec") or {}
    claim_spec: ReadOnlyObject = claim.get("spec") or {}
    spec = copy.deepcopy(blueprint(tspec))
    pod_template = spec["podTemplate"]
    pod_spec = apply_secure_defaults(tspec, copy.deepcopy(pod_template.get("spec") or {}))
    if claim_spec.get("env"):
        inject_env(tspec, pod_spec, list(claim_spec["env"]))
    pod_template["spec"] = pod_spec
    pod_template["metadata"] = desired_pod_metadata(claim, template)
    vcts = merge_volume_claim_templates(tspec, list(claim_spec.get("volumeClaimTemplates") or []))
    if vcts:
        spec["volumeClaimTemplates"] = copy.deepcopy(vcts)
    else:
        spec.pop("volumeClaimTemplates", None)
    labels = {c.LABEL_LAUNCH_TYPE: c.LAUNCH_TYPE_COLD}
    apply_claim_labels(labels, claim, template_ref_hash(tname))
    annotations = {c.ANNOTATION_SANDBOX_TEMPLATE_REF: tname}
    trace = (cmeta.get("annotations") or {}).get(c.ANNOTATION_TRACE_CONTEXT)
    if trace:
        annotations[c.ANNOTATION_TRACE_CONTEXT] = trace
    return {
        "apiVersion": c.SANDBOX_API_VERSION,
        "kind": c.KIND_SANDBOX,
        "metadata": {
            "name": cmeta["name"],
            "namespace": cmeta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [claim_owner_ref(claim)],
        },
        "spec": spec,
    }
