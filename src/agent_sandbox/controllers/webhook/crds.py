"""Point the CRDs' conversion webhook at this process (controllers spec §5.7 step 3).

For each CRD: skip it if it does not exist or does not use ``Webhook`` conversion;
otherwise merge-patch ``spec.conversion.webhook``: the CA bundle, the client config, and
``conversionReviewVersions`` (only if empty).

The client config is the upstream Service reference, or, in dev mode, a ``url`` such as
``https://127.0.0.1:9443/convert``: the local control plane has no kube-proxy and Endpoints
reject loopback addresses, so a Service could never reach a webhook running on the host.
Exactly one of ``service`` and ``url`` may be set, so the patch nulls the other.

The caBundle may hold several PEM certificates (the API server trusts each). A caBundle that already trusts
the Secret's CA is left as it is, at start-up (:func:`patch_crds`) as when following a replaced Secret
(:func:`trust_ca`). One that does not becomes the Secret's CA followed by the CAs still valid that it held
(at most :data:`KEPT_CAS` of them; a follower puts the CA of the pair it serves first): the Secret may have been
replaced (a backup restore, a GitOps re-apply, a manual rotation, another replica's start-up) while replicas
still serve a pair of a CA the caBundle holds, and cutting that CA out would make the API server reject them
until their next poll. Writes happen only when the caBundle does not trust the Secret's CA and each one makes
it trust it, so replicas (which all read the same Secret) never flap it. Every write is read-modify-write under
the CRD's resourceVersion, retried on a conflict, so two replicas never undo each other's caBundle
(docs/design/webhook-cert-reload.md).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from agent_sandbox.api import constants as c
from agent_sandbox.api.kinds import ALL_KINDS
from agent_sandbox.kube import CRD, Client, Conflict, NotFound

log = logging.getLogger(__name__)

#: The CRDs served by this webhook (upstream patches all four when extensions are on).
ALL_CRD_NAMES: tuple[str, ...] = tuple(k.crd_name for k in ALL_KINDS)


#: Read-modify-write rounds of one CRD before a conflict is given up on (each round re-reads the CRD).
_CONFLICT_ROUNDS = 5
#: At most this many CAs are kept next to the one a caBundle write adds: with every replica following the Secret
#: within a poll, a served pair's CA is among the last two added unless the Secret changed three times in a poll.
KEPT_CAS = 2
_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def client_config(*, ca_pem: bytes | None, url: str | None, service: str, namespace: str) -> dict[str, Any]:
    """The ``clientConfig`` merge-patch body (pure); ``ca_pem=None`` leaves the caBundle as it is."""
    cfg: dict[str, Any] = {} if ca_pem is None else {"caBundle": base64.b64encode(ca_pem).decode()}
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


def certificates(pem: bytes) -> list[x509.Certificate]:
    """The certificates of the ``CERTIFICATE`` PEM blocks in ``pem``, in order; blocks that do not parse are
    skipped, as the API server's ``AppendCertsFromPEM`` skips them (pure)."""
    found = []
    for block in _PEM_CERTIFICATE.findall(pem.replace(b"\r\n", b"\n")):
        try:
            found.append(x509.load_pem_x509_certificate(block))
        except ValueError:
            continue
    return found


def _ders(pem: bytes) -> list[bytes]:
    return [cert.public_bytes(Encoding.DER) for cert in certificates(pem)]


def trusts(ca_bundle: bytes, ca_pem: bytes) -> bool:
    """Whether ``ca_bundle`` holds every certificate of ``ca_pem`` (compared as certificates, not text); False
    when ``ca_pem`` holds none (pure)."""
    wanted, held = _ders(ca_pem), set(_ders(ca_bundle))
    return bool(wanted) and all(der in held for der in wanted)


def switched_ca_bundle(
    ca_pem: bytes, *, keep: bytes | None, now: dt.datetime, limit: int = KEPT_CAS
) -> bytes:
    """The caBundle of a switch to ``ca_pem``: that CA first, then the first ``limit`` certificates of ``keep``
    (PEM, most wanted first: the CA of the pair served here, then those of the caBundle being replaced, in its
    order) that are valid at ``now`` and not already there, so that connections served with any of those pairs
    verify until every replica has switched (pure, deterministic). An expired CA verifies nothing: left out."""
    kept: list[bytes] = []
    seen = set(_ders(ca_pem))
    for cert in certificates(keep or b""):
        if len(kept) >= limit:
            break
        der = cert.public_bytes(Encoding.DER)
        if der not in seen and cert.not_valid_before_utc <= now < cert.not_valid_after_utc:
            seen.add(der)
            kept.append(cert.public_bytes(Encoding.PEM))
    if not kept:
        return ca_pem
    return b"".join([ca_pem if ca_pem.endswith(b"\n") else ca_pem + b"\n", *kept])


def current_ca_bundle(crd: dict[str, Any]) -> bytes:
    """The decoded ``spec.conversion.webhook.clientConfig.caBundle`` of a CRD object (b"" when unset)."""
    conversion = (crd.get("spec") or {}).get("conversion") or {}
    encoded = ((conversion.get("webhook") or {}).get("clientConfig") or {}).get("caBundle") or ""
    try:
        return base64.b64decode(encoded)
    except (binascii.Error, ValueError):
        return b""


def _uses_webhook(crd: dict[str, Any]) -> bool:
    return bool(((crd.get("spec") or {}).get("conversion") or {}).get("strategy") == "Webhook")


def _guarded(crd: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``patch`` applied only to the version of ``crd`` it was computed from (a stale one is a Conflict)."""
    version = (crd.get("metadata") or {}).get("resourceVersion")
    return {"metadata": {"resourceVersion": version}, **patch} if version else patch


async def _patch_read_crd(
    client: Client, name: str, compute: Callable[[dict[str, Any] | None], dict[str, Any] | None]
) -> bool:
    """Read CRD ``name`` and send the patch ``compute`` makes of it (``None``: the CRD is missing), guarded by
    the version read; on a Conflict read it again and recompute, a few rounds. True when a patch was sent;
    False when ``compute`` returned None (nothing to write, or nothing to write to)."""
    for round_ in range(_CONFLICT_ROUNDS):
        try:
            crd: dict[str, Any] | None = await client.get(CRD, name)
        except NotFound:
            crd = None
        patch = compute(crd)
        if crd is None or patch is None:
            return False
        try:
            await client.patch(CRD, name, _guarded(crd, patch))
        except Conflict:
            if round_ + 1 == _CONFLICT_ROUNDS:
                raise
            continue
        return True
    return False  # not reached: the last round returns or raises


async def patch_crds(
    client: Client,
    *,
    ca_pem: bytes,
    url: str | None,
    service: str,
    namespace: str,
    crd_names: Iterable[str] = ALL_CRD_NAMES,
    now: dt.datetime | None = None,
) -> list[str]:
    """Patch every named CRD that exists and uses webhook conversion; returns the patched names.

    A caBundle that trusts ``ca_pem`` (:func:`trusts`) is left as it is, other CAs included; one that does not
    becomes ``ca_pem`` followed by the CAs it held that are valid at ``now`` (default: the current time), at
    most :data:`KEPT_CAS` of them (:func:`switched_ca_bundle`): replicas may still serve pairs of those CAs
    (see the module docstring). A fresh install (no caBundle) gets ``ca_pem`` alone, as upstream's.

    Raises:
        agent_sandbox.kube.ApiError: any API failure other than a missing CRD (upstream exits); a Conflict
            only after several rounds of re-reading the CRD.
    """
    now = now or dt.datetime.now(dt.UTC)
    patched = []
    for name in crd_names:

        def compute(crd: dict[str, Any] | None, name: str = name) -> dict[str, Any] | None:
            if crd is None:
                log.info("CRD %s not installed; not patching its conversion webhook", name)
                return None
            held = current_ca_bundle(crd)
            bundle = None if trusts(held, ca_pem) else switched_ca_bundle(ca_pem, keep=held, now=now)
            cfg = client_config(ca_pem=bundle, url=url, service=service, namespace=namespace)
            patch = conversion_patch(crd, cfg)
            if patch is None:
                log.info("CRD %s does not use webhook conversion; leaving it alone", name)
            return patch

        if await _patch_read_crd(client, name, compute):
            patched.append(name)
    log.info(
        "conversion webhook of %s points at %s",
        ", ".join(patched) or "no CRD",
        url or f"{namespace}/{service}",
    )
    return patched


async def trust_ca(
    client: Client,
    *,
    ca_pem: bytes,
    keep: bytes | None,
    crd_names: Iterable[str] = ALL_CRD_NAMES,
    now: dt.datetime,
) -> list[str]:
    """Make the caBundle of every named CRD that uses webhook conversion trust ``ca_pem``; returns the names
    it had to patch (empty: all of them trusted it already).

    A caBundle that does not trust ``ca_pem`` becomes :func:`switched_ca_bundle`: ``ca_pem``, then ``keep`` (the
    CA of the pair this replica serves) and the caBundle's own CAs, those valid at ``now``, at most
    :data:`KEPT_CAS` besides ``ca_pem`` - another replica may already serve a CA the caBundle holds (the Secret
    changed twice within a poll). Nothing else of the CRD is touched (the Service reference or dev-mode URL
    stays as start-up set it). Only a caBundle that does not trust ``ca_pem`` is written, so replicas
    switching to the same Secret never undo each other: the first one's write makes the others' a no-op.

    Raises:
        agent_sandbox.kube.ApiError: an API failure other than a missing CRD; a Conflict only after several
            rounds of re-reading the CRD.
    """

    def compute(crd: dict[str, Any] | None) -> dict[str, Any] | None:
        if crd is None or not _uses_webhook(crd) or trusts(current_ca_bundle(crd), ca_pem):
            return None
        bundle = switched_ca_bundle(ca_pem, keep=(keep or b"") + b"\n" + current_ca_bundle(crd), now=now)
        return {"spec": {"conversion": {"webhook": {"clientConfig": {
            "caBundle": base64.b64encode(bundle).decode()}}}}}  # fmt: skip

    return [name for name in crd_names if await _patch_read_crd(client, name, compute)]
