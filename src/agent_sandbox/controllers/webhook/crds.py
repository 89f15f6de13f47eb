"""Point the CRDs' conversion webhook at this process (controllers spec §5.7 step 3).

For each CRD: skip it if it does not exist or does not use ``Webhook`` conversion;
otherwise merge-patch ``spec.conversion.webhook``: the CA bundle, the client config, and
``conversionReviewVersions`` (only if empty).

The client config is the upstream Service reference, or, in dev mode, a ``url`` such as
``https://127.0.0.1:9443/convert``: the local control plane has no kube-proxy and Endpoints
reject loopback addresses, so a Service could never reach a webhook running on the host.
Exactly one of ``service`` and ``url`` may be set, so the patch nulls the other.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterable
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api.kinds import ALL_KINDS
from agent_sandbox.kube import CRD, Client, NotFound

log = logging.getLogger(__name__)

#: The CRDs served by this webhook (upstream patches all four when extensions are on).
ALL_CRD_NAMES: tuple[str, ...] = tuple(k.crd_name for k in ALL_KINDS)


def client_config(*, ca_pem: bytes, url: str | None, service: str, namespace: str) -> dict[str, Any]:
    """The ``clientConfig`` merge-patch body (pure)."""
    cfg: dict[str, Any] = {"caBundle": base64.b64encode(ca_pem).decode()}
    if url:
        cfg["url"] = url
        cfg["service"] = None
    else:
        cfg["service"] = {"name": service, "namespace": namespace, "path": c.WEBHOOK_PATH}
        cfg["url"] = None
    return cfg


def conversion_patch(crd: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any] | None:
    """Merge patch for one CRD object, or None if it does not use webhook conversion (pure)."""
    conversion = (crd.get("spec") or {}).get("conversion") or {}
    if conversion.get("strategy") != "Webhook":
        return None
    webhook: dict[str, Any] = {"clientConfig": cfg}
    if not (conversion.get("webhook") or {}).get("conversionReviewVersions"):
        webhook["conversionReviewVersions"] = list(c.CONVERSION_REVIEW_VERSIONS)
    return {"spec": {"conversion": {"webhook": webhook}}}


async def patch_crds(
    client: Client,
    *,
    ca_pem: bytes,
    url: str | None,
    service: str,
    namespace: str,
    crd_names: Iterable[str] = ALL_CRD_NAMES,
) -> list[str]:
    """Patch every named CRD that exists and uses webhook conversion; returns the patched names.

    Raises:
        agent_sandbox.kube.ApiError: any API failure other than a missing CRD (upstream exits).
    """
    cfg = client_config(ca_pem=ca_pem, url=url, service=service, namespace=namespace)
    patched = []
    for name in crd_names:
        try:
            crd = await client.get(CRD, name)
        except NotFound:
            log.info("CRD %s not installed; not patching its conversion webhook", name)
            continue
        patch = conversion_patch(crd, cfg)
        if patch is None:
            log.info("CRD %s does not use webhook conversion; leaving it alone", name)
            continue
        await client.patch(CRD, name, patch)
        patched.append(name)
    log.info(
        "conversion webhook of %s points at %s",
        ", ".join(patched) or "no CRD",
        url or f"{namespace}/{service}",
    )
    return patched
