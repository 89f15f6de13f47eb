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


async def test_start_up_writes_the_secret_ca_alone_when_the_ca_bundle_does_not_trust_it() -> None:
    # As upstream (and the install tests): a fresh install, or a Secret replaced at start-up.
    new, other = _fresh().ca_pem, _fresh().ca_pem
    client = FakeClient((CRD, crd(SANDBOXES)))
    await patch_crds(client, ca_pem=other, url=None, service="s", namespace="ns", crd_names=(SANDBOXES,))
    await patch_crds(client, ca_pem=new, url="https://127.0.0.1:1/convert", service="s", namespace="ns",
                     crd_names=(SANDBOXES,))  # fmt: skip
    assert await _ca_bundle(client, SANDBOXES) == new
    cfg = (await client.get(CRD, SANDBOXES))["spec"]["conversion"]["webhook"]["clientConfig"]
    assert cfg["url"] == "https://127.0.0.1:1/convert"
    assert "service" not in cfg
