"""The caBundle rules of a certificate switch (pure parts, and `trust_ca` against an in-memory API)."""

from __future__ import annotations

import datetime as dt

import pytest

from agent_sandbox.controllers.webhook import patch_crds
from agent_sandbox.controllers.webhook.crds import switched_ca_bundle, trust_ca, trusts
from agent_sandbox.kube import CRD
from agent_sandbox.kube.testing import FakeClient
from agent_sandbox.kube.x509 import cert_pem, issue, name, new_key
from tests.unit.controllers.webhook.test_cert_trust import POOLS, SANDBOXES, _ca_bundle, _ders, _fresh
from tests.unit.controllers.webhook.test_server import crd

pytestmark = pytest.mark.unit


def _expired_ca() -> bytes:
    key = new_key()
    now = dt.datetime.now(dt.UTC)
    cert = issue(name("old"), key, issuer=None, not_before=now - dt.timedelta(days=400),
                 not_after=now - dt.timedelta(days=35), serial=1, ca=True)  # fmt: skip
    return cert_pem(cert)


def test_trusts_compares_certificates_not_bytes() -> None:
    a, b = _fresh().ca_pem, _fresh().ca_pem
    assert trusts(a, a)
    assert trusts(b"junk\n" + b + a.replace(b"\n", b"\r\n"), a)  # other blocks, other line ends
    assert not trusts(b, a)
    assert not trusts(b"", a)
    assert not trusts(a, b"not a PEM")


def test_switched_ca_bundle_keeps_one_valid_previous_ca() -> None:
    now = dt.datetime.now(dt.UTC)
    new, old = _fresh().ca_pem, _fresh().ca_pem
    assert _ders(switched_ca_bundle(new, keep=old, now=now)) == _ders(new) + _ders(old)
    assert switched_ca_bundle(new, keep=new, now=now) == new
    assert switched_ca_bundle(new, keep=None, now=now) == new
    assert switched_ca_bundle(new, keep=_expired_ca(), now=now) == new  # an expired CA verifies nothing
    assert switched_ca_bundle(new.rstrip(b"\n"), keep=old, now=now).startswith(new)  # PEM blocks stay apart


async def test_trust_ca_adds_the_ca_and_skips_what_already_trusts_it() -> None:
    new, old = _fresh().ca_pem, _fresh().ca_pem
    client = FakeClient((CRD, crd(SANDBOXES)), (CRD, crd(POOLS)), (CRD, crd("other", strategy="None")))
    await patch_crds(client, ca_pem=old, url=None, service="s", namespace="ns", crd_names=(SANDBOXES,))
    await patch_crds(client, ca_pem=new, url=None, service="s", namespace="ns", crd_names=(POOLS,))
    now = dt.datetime.now(dt.UTC)
    patched = await trust_ca(
        client, ca_pem=new, keep=old, crd_names=(SANDBOXES, POOLS, "other", "missing"), now=now
    )
    assert patched == [SANDBOXES]
    assert _ders(await _ca_bundle(client, SANDBOXES)) == _ders(new) + _ders(old)
    assert await _ca_bundle(client, POOLS) == new
    assert await trust_ca(client, ca_pem=new, keep=old, crd_names=(SANDBOXES, POOLS), now=now) == []
    # Only the caBundle: the Service reference (or a dev-mode URL another replica set) is left as it was.
    cfg = (await client.get(CRD, SANDBOXES))["spec"]["conversion"]["webhook"]["clientConfig"]
    assert cfg["service"] == {"name": "s", "namespace": "ns", "path": "/convert"}


async def test_a_conflicting_write_is_recomputed_from_a_fresh_read() -> None:
    # Another replica wrote the CRD between this one's read and its patch: the patch, guarded by the read's
    # resourceVersion, is refused; the CRD is read again and the decision made anew.
    from agent_sandbox.kube import Conflict

    new, old = _fresh().ca_pem, _fresh().ca_pem
    client = FakeClient((CRD, crd(SANDBOXES)))
    await patch_crds(client, ca_pem=old, url=None, service="s", namespace="ns", crd_names=(SANDBOXES,))
    conflict = Conflict(409, "Conflict", "the object has been modified")
    client.inject_error("patch", conflict, kind=CRD)
    now = dt.datetime.now(dt.UTC)
    assert await trust_ca(client, ca_pem=new, keep=old, crd_names=(SANDBOXES,), now=now) == [SANDBOXES]
    assert [verb for verb, kind, _, _ in client.actions[-4:] if kind == CRD.kind] == [
        "get",
        "patch",
        "get",
        "patch",
    ]
    assert _ders(await _ca_bundle(client, SANDBOXES)) == _ders(new) + _ders(old)

    client.inject_error("patch", conflict, kind=CRD)
    assert await patch_crds(
        client, ca_pem=new, url=None, service="s", namespace="ns", crd_names=(SANDBOXES,)
    ) == [SANDBOXES]
    assert _ders(await _ca_bundle(client, SANDBOXES)) == _ders(new) + _ders(old)  # trusted: left as it is

    client.inject_error("patch", conflict, kind=CRD, times=10)
    with pytest.raises(Conflict):  # not forever
        await trust_ca(client, ca_pem=_fresh().ca_pem, keep=new, crd_names=(SANDBOXES,), now=now)


async def test_start_up_writes_the_secret_ca_alone_on_a_fresh_install() -> None:
    # As upstream (and the install tests): no caBundle yet, or one holding only CAs that verify nothing.
    new = _fresh().ca_pem
    client = FakeClient((CRD, crd(SANDBOXES)), (CRD, crd(POOLS)))
    await patch_crds(client, ca_pem=_expired_ca(), url=None, service="s", namespace="ns", crd_names=(POOLS,))
    await patch_crds(client, ca_pem=new, url="https://127.0.0.1:1/convert", service="s", namespace="ns",
                     crd_names=(SANDBOXES, POOLS))  # fmt: skip
    assert await _ca_bundle(client, SANDBOXES) == new
    assert await _ca_bundle(client, POOLS) == new  # the expired CA is not kept
    cfg = (await client.get(CRD, SANDBOXES))["spec"]["conversion"]["webhook"]["clientConfig"]
    assert cfg["url"] == "https://127.0.0.1:1/convert"
    assert "service" not in cfg


async def test_start_up_keeps_the_valid_cas_of_a_ca_bundle_that_does_not_trust_the_secret() -> None:
    # A replica starting after the Secret was replaced (a backup restore, a GitOps re-apply, a manual rotation)
    # but before the running replicas' next poll: they still serve the pair of a CA the caBundle holds. Start-up
    # used to write the Secret's CA alone, and the API server rejected their pair for up to a poll.
    served, new = _fresh().ca_pem, _fresh().ca_pem
    client = FakeClient((CRD, crd(SANDBOXES)))
    await patch_crds(client, ca_pem=served, url=None, service="s", namespace="ns", crd_names=(SANDBOXES,))
    await patch_crds(client, ca_pem=new, url=None, service="s", namespace="ns", crd_names=(SANDBOXES,))
    assert _ders(await _ca_bundle(client, SANDBOXES)) == _ders(new) + _ders(served)


async def test_start_up_keeps_at_most_two_other_cas_the_most_recently_added_first() -> None:
    a, b, c, new = (_fresh().ca_pem for _ in range(4))
    client = FakeClient((CRD, crd(SANDBOXES)))
    # caBundle [a, b, expired, c]: a was added last (every write puts the CA it adds first).
    held = a + b + _expired_ca() + c
    await trust_ca(client, ca_pem=held, keep=None, crd_names=(SANDBOXES,), now=dt.datetime.now(dt.UTC))
    await patch_crds(client, ca_pem=new, url=None, service="s", namespace="ns", crd_names=(SANDBOXES,))
    assert _ders(await _ca_bundle(client, SANDBOXES)) == _ders(new) + _ders(a) + _ders(b)


async def test_trust_ca_keeps_the_valid_cas_the_ca_bundle_already_holds() -> None:
    # Two Secret changes within about a poll: X -> Y (replica A added Y: caBundle [Y, X]; replica B then took
    # Y's pair) -> Z. Replica A, still serving X, adds Z: keeping only its own X cut out Y, which B serves.
    x, y, z = _fresh().ca_pem, _fresh().ca_pem, _fresh().ca_pem
    client = FakeClient((CRD, crd(SANDBOXES)))
    now = dt.datetime.now(dt.UTC)
    await patch_crds(client, ca_pem=x, url=None, service="s", namespace="ns", crd_names=(SANDBOXES,))
    assert await trust_ca(client, ca_pem=y, keep=x, crd_names=(SANDBOXES,), now=now) == [SANDBOXES]
    assert await trust_ca(client, ca_pem=z, keep=x, crd_names=(SANDBOXES,), now=now) == [SANDBOXES]
    assert _ders(await _ca_bundle(client, SANDBOXES)) == _ders(z) + _ders(x) + _ders(y)
    # Bounded: the CA served here first, then the caBundle's in its order, at most two besides the new one.
    w = _fresh().ca_pem
    assert await trust_ca(client, ca_pem=w, keep=y, crd_names=(SANDBOXES,), now=now) == [SANDBOXES]
    assert _ders(await _ca_bundle(client, SANDBOXES)) == _ders(w) + _ders(y) + _ders(z)
    # Trusted: never written again, whatever this replica serves (no flapping between replicas).
    assert await trust_ca(client, ca_pem=w, keep=x, crd_names=(SANDBOXES,), now=now) == []


def test_switched_ca_bundle_is_bounded_and_deterministic() -> None:
    now = dt.datetime.now(dt.UTC)
    new, a, b, c = (_fresh().ca_pem for _ in range(4))
    assert _ders(switched_ca_bundle(new, keep=a + b + c, now=now)) == _ders(new) + _ders(a) + _ders(b)
    assert _ders(switched_ca_bundle(new, keep=a + new + a + b, now=now)) == _ders(new) + _ders(a) + _ders(b)
    assert _ders(switched_ca_bundle(new, keep=_expired_ca() + c + b"junk", now=now)) == _ders(new) + _ders(c)
