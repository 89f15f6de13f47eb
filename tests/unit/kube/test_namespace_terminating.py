"""A create refused because its namespace is being deleted is recognised, and is no Event warning.

The Status body is the one kube-apiserver's NamespaceLifecycle admission plugin sends (403 Forbidden with
a `NamespaceTerminating` cause, serialised as `details.causes[].reason`).
"""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from agent_sandbox.kube import EVENT, EventBroadcaster, Forbidden
from agent_sandbox.kube.errors import error_from_status, is_namespace_terminating
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit


def terminating(name: str = "p1", ns: str = "gone", plural: str = "pods") -> Forbidden:
    """The API server's answer to a create in a namespace being deleted (as sent on the wire)."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'{plural} "{name}" is forbidden: unable to create new content in namespace {ns} '
        "because it is being terminated",
        "reason": "Forbidden",
        "details": {
            "name": name,
            "kind": plural,
            "causes": [
                {
                    "reason": "NamespaceTerminating",
                    "message": f"namespace {ns} is being terminated",
                    "field": "metadata.namespace",
                }
            ],
        },
        "code": 403,
    }
    err = error_from_status(403, orjson.dumps(body))
    assert isinstance(err, Forbidden)
    return err


def rbac(name: str = "p1") -> Forbidden:
    message = f'pods "{name}" is forbidden: User "system:serviceaccount:x:y" cannot create resource "pods"'
    body = {"kind": "Status", "code": 403, "reason": "Forbidden", "message": message,
            "details": {"name": name, "kind": "pods"}}  # fmt: skip
    err = error_from_status(403, orjson.dumps(body))
    assert isinstance(err, Forbidden)
    return err


def test_the_namespace_lifecycle_refusal_is_recognised() -> None:
    assert is_namespace_terminating(terminating())


@pytest.mark.parametrize(
    "err",
    [
        rbac(),
        Forbidden(403, "Forbidden", "exceeded quota"),
        Forbidden(403, "Forbidden", "x", {"causes": [{"reason": "FieldValueInvalid"}]}),
        Forbidden(403, "Forbidden", "x", {"causes": "NamespaceTerminating"}),
        ValueError("NamespaceTerminating"),
        None,
    ],
)
def test_every_other_error_is_not(err: BaseException | None) -> None:
    assert not is_namespace_terminating(err)


async def _write_one(refusal: Forbidden) -> None:
    fake = FakeClient()
    fake.inject_error("create", refusal, kind=EVENT)
    broadcaster = EventBroadcaster(fake, instance="test")  # type: ignore[arg-type]
    regarding = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p1", "namespace": "gone", "uid": "u"},
    }
    broadcaster.recorder("sandbox-controller").event(regarding, "Warning", "FailedCreate", "Creating", "x")
    task = asyncio.create_task(broadcaster.start())
    for _ in range(50):
        await asyncio.sleep(0)
        if any(a[:2] == ("create", EVENT.kind) for a in fake.actions):
            break
    await asyncio.sleep(0)  # the refusal's handling ran in the same step as the create
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [a[:2] for a in fake.actions] == [("create", EVENT.kind)]


async def test_an_event_refused_in_a_terminating_namespace_is_dropped_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="agent_sandbox.kube.events")
    await _write_one(terminating("p1.18eeb15d0591897c", plural="events.events.k8s.io"))
    dropped = [r for r in caplog.records if "dropping event" in r.getMessage()]
    assert [r.levelno for r in dropped] == [logging.DEBUG]


async def test_an_event_refused_by_rbac_stays_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="agent_sandbox.kube.events")
    await _write_one(rbac())
    dropped = [r for r in caplog.records if "dropping event" in r.getMessage()]
    assert [r.levelno for r in dropped] == [logging.WARNING]
