"""Listing flows beyond upstream's (ours): claims joined with their Sandboxes, warm pool state, and the
replicas-0 pool behind `create_sandbox_from_template` (a cold start from a template, spec §5.3.1)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from . import _kube
from ._claims import ClaimView, SandboxView, validate_claim_name
from ._hibernation import claim_says_hibernated
from ._steps import Flow
from .constants import OPERATING_MODE_SUSPENDED, REASON_TEMPLATE_NOT_FOUND, WARM_POOL_SANDBOX_LABEL
from .exceptions import SandboxNotFoundError, SandboxRequestError, SandboxTemplateNotFoundError
from .models import SandboxInfo, WarmPoolInfo

__all__ = ["cold_pool_name", "ensure_cold_pool", "get_sandbox_info", "list_sandboxes", "list_warm_pools"]

COLD_POOL_SUFFIX = "-cold"


def _created(obj: dict[str, Any]) -> datetime | None:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def sandbox_info(
    claim: dict[str, Any], sandboxes: dict[tuple[str, str], dict[str, Any]] | None
) -> SandboxInfo:
    """One `SandboxInfo` from a claim and Sandboxes by (namespace, name) (readiness from the Sandbox).

    `sandboxes` None: the caller may not read Sandboxes (RBAC), so the row is the claim's own status and
    `suspended` is unknown (None). A bound Sandbox that is missing is hibernated (`suspended` True) when the
    claim says so, else not suspended (False: deleted, or made again by the claim controller in a moment)."""
    view = ClaimView.of(claim)
    sandbox = (sandboxes or {}).get((view.namespace, view.sandbox_name or ""))
    sview = SandboxView.of(sandbox) if sandbox else None
    suspended: bool | None
    if sandboxes is None:
        suspended = None
    elif sview is not None:
        suspended = sview.operating_mode == OPERATING_MODE_SUSPENDED
    elif not view.sandbox_name:
        suspended = False  # not bound (yet): no Sandbox to be suspended
    else:
        # Ours: hibernated is suspended and more (docs/lifecycle.md); until December 6 `SUSPENDED false`.
        # Not hibernated: deleted, made again by the claim controller in a moment - not suspended (None is kept
        # for "Sandboxes not readable", which the CLI explains in a note).
        suspended = claim_says_hibernated(claim, view.sandbox_name)
    return SandboxInfo(
        claim_name=view.name,
        namespace=view.namespace,
        warm_pool=view.warmpool,
        sandbox_id=view.sandbox_name,
        # The bound Sandbox's own condition when there is one: the claim mirrors it, a moment later.
        ready=sview.ready if sview else view.ready,
        reason=(sview.reason if sview else view.reason),
        message=(sview.message if sview else view.message),
        # Not the claim's when the Sandbox has none: a just-suspended Sandbox's claim still lists the old pod's.
        pod_ip=sview.pod_ip if sview else view.pod_ip,
        suspended=suspended,
        created=_created(claim),
    )


def _forbidden(err: SandboxRequestError) -> bool:
    return err.status_code == 403


def list_sandboxes(namespace: str | None, label_selector: str | None) -> Flow[list[SandboxInfo]]:
    """Claims joined with their Sandboxes, in `namespace` or (None) in every namespace."""
    claims = yield from _kube.list_objects(_kube.CLAIMS, namespace, label_selector=label_selector)
    by_name: dict[tuple[str, str], dict[str, Any]] | None
    try:
        boxes = yield from _kube.list_objects(_kube.SANDBOXES, namespace)
        by_name = {_key(s): s for s in boxes}
    except SandboxRequestError as err:
        # A role that grants claims only (all upstream's SDK needs): rows from the claims, `suspended` unknown.
        if not _forbidden(err):
            raise
        by_name = None
    return sorted((sandbox_info(c, by_name) for c in claims), key=lambda i: (i.namespace, i.claim_name))


def get_sandbox_info(namespace: str, claim_name: str) -> Flow[SandboxInfo]:
    """One claim joined with its Sandbox: a GET of each (the Sandbox's only if the claim names one)."""
    claim = yield from _kube.get(_kube.CLAIMS, namespace, claim_name)
    if claim is None:
        raise SandboxNotFoundError(f"SandboxClaim {namespace}/{claim_name} not found")
    name = ClaimView.of(claim).sandbox_name
    if not name:
        return sandbox_info(claim, {})
    try:
        sandbox = yield from _kube.get(_kube.SANDBOXES, namespace, name)
    except SandboxRequestError as err:
        if not _forbidden(err):
            raise
        return sandbox_info(claim, None)
    return sandbox_info(claim, {(namespace, name): sandbox} if sandbox else {})


def warm_pool_info(obj: dict[str, Any]) -> WarmPoolInfo:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return WarmPoolInfo(
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        template=(spec.get("sandboxTemplateRef") or {}).get("name"),
        replicas=int(spec.get("replicas", 1) or 0),
        ready_replicas=int(status.get("readyReplicas") or 0),
        current_replicas=int(status.get("replicas") or 0),
    )


def _owning_pool(sandbox: dict[str, Any]) -> str | None:
    """The SandboxWarmPool a Sandbox is an unclaimed member of (its controller), if any."""
    for ref in (sandbox.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "SandboxWarmPool":
            return str(ref.get("name") or "") or None
    return None


def member_problem(sandbox: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of what keeps a pool member from being Ready; None when Ready, leaving, or too new to
    say. An unschedulable pod says why in `PodScheduled`, which `Ready` only summarises."""
    if (sandbox.get("metadata") or {}).get("deletionTimestamp"):
        return None
    conditions = {c.get("type"): c for c in (sandbox.get("status") or {}).get("conditions") or []}
    ready = conditions.get("Ready")
    if ready is None or ready.get("status") == "True":
        return None
    scheduled = conditions.get("PodScheduled")
    chosen = scheduled if scheduled is not None and scheduled.get("status") == "False" else ready
    return str(chosen.get("reason") or "Unknown"), str(chosen.get("message") or "")


def _readable(objects: Flow[list[dict[str, Any]]]) -> Flow[list[dict[str, Any]] | None]:
    """The listed objects, or None when the caller's role may not list them."""
    try:
        return (yield from objects)
    except SandboxRequestError as err:
        if not _forbidden(err):
            raise
        return None


def list_warm_pools(namespace: str | None) -> Flow[list[WarmPoolInfo]]:
    """The pools of `namespace` or (None) of every namespace, each with why its members are not Ready (from
    one list of Sandboxes and one of templates; left out when the role may not read them)."""
    pools = yield from _kube.list_objects(_kube.WARM_POOLS, namespace)
    # Unclaimed members only (claimed ones lose the label): a fleet's namespace holds thousands of Sandboxes.
    members = _kube.list_objects(_kube.SANDBOXES, namespace, label_selector=WARM_POOL_SANDBOX_LABEL)
    boxes = yield from _readable(members)
    templates = yield from _readable(_kube.list_objects(_kube.TEMPLATES, namespace))
    # Keyed by (namespace, name): across namespaces, pools and templates of one name are different objects.
    problems: dict[tuple[str, str], Counter[tuple[str, str]]] = {}
    for box in boxes or ():
        pool = _owning_pool(box)
        trouble = member_problem(box) if pool else None
        if pool and trouble:
            problems.setdefault((_key(box)[0], pool), Counter())[trouble] += 1
    known_templates = None if templates is None else {_key(t) for t in templates}
    infos = [warm_pool_info(obj) for obj in pools]
    for info in infos:
        if (
            known_templates is not None
            and info.template
            and (info.namespace, info.template) not in known_templates
        ):
            info.reason = REASON_TEMPLATE_NOT_FOUND
            info.message = f"SandboxTemplate {info.namespace}/{info.template} not found"
        elif (info.namespace, info.name) in problems:
            info.reason, info.message = problems[info.namespace, info.name].most_common(1)[0][0]
    return sorted(infos, key=lambda p: (p.namespace, p.name))


def cold_pool_name(template: str) -> str:
    return f"{template}{COLD_POOL_SUFFIX}"


def ensure_cold_pool(namespace: str, template: str) -> Flow[str]:
    """The name of a `replicas: 0` warm pool on `template` (created if missing): claims on it start cold."""
    validate_claim_name(template)
    if (yield from _kube.get(_kube.TEMPLATES, namespace, template)) is None:
        raise SandboxTemplateNotFoundError(f"SandboxTemplate {namespace}/{template} not found")
    name = cold_pool_name(template)
    existing = yield from _kube.get(_kube.WARM_POOLS, namespace, name)
    if existing is None:
        body = {
            "apiVersion": f"{_kube.WARM_POOLS.group}/{_kube.WARM_POOLS.version}",
            "kind": "SandboxWarmPool",
            "metadata": {"name": name},
            "spec": {"replicas": 0, "sandboxTemplateRef": {"name": template}},
        }
        resp = yield from _kube.create(_kube.WARM_POOLS, namespace, body)
        if resp.status_code != 409:
            _kube.check_kube(resp, f"create sandboxwarmpools {namespace}/{name}")
        existing = yield from _kube.get(_kube.WARM_POOLS, namespace, name)
    ref = ((existing or {}).get("spec") or {}).get("sandboxTemplateRef") or {}
    if ref.get("name") != template:
        raise ValueError(
            f"warm pool {namespace}/{name} exists but uses template {ref.get('name')!r}, not {template!r}"
        )
    return name
