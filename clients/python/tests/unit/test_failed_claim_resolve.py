"""`get_sandbox` of a claim that failed for good: the failure at once, as `create_sandbox` raises it.

Until December 6 a claim the controller had refused (`agent-sandbox create --name envc --env FOO=bar` on a
template that does not allow env: `EnvVarsInjectionRejected`) made `get_sandbox` - and so `agent-sandbox
exec|cp|suspend envc` - wait out its whole `resolve_timeout` (30 s), then raise `SandboxNotFoundError`
("SandboxClaim p1/envc: SandboxClaim p1/envc was not bound ...", the claim named twice; CLI exit 3).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClaimFailedError,
    SandboxNotFoundError,
    SandboxTemplateNotFoundError,
    _calls,
)

from .fakes import FakeCluster, ready_condition
from .test_flows import run_async, sync_client

pytestmark = pytest.mark.unit

REJECTED = ready_condition(
    "False",
    "EnvVarsInjectionRejected",
    "EnvVarsInjectionPolicy is Disallowed: the claim may not set env",
)


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_calls, "BACKOFF_BASE", 0.001)


def _claim(fake: FakeCluster, name: str, conditions: list[dict[str, Any]]) -> None:
    fake.claims[name] = {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "7"},
        "spec": {"warmPoolRef": {"name": "pool"}},
        "status": {"conditions": conditions},
    }


def _get(mode: str, fake: FakeCluster, name: str, timeout: float) -> Any:
    if mode == "sync":
        return sync_client(fake).get_sandbox(name, resolve_timeout=timeout)

    async def body(client: AsyncSandboxClient) -> Any:
        return await client.get_sandbox(name, resolve_timeout=timeout)

    return run_async(fake, body)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_rejected_claim_fails_at_once_as_create_says_it(mode: str) -> None:
    fake = FakeCluster(bind=False, claim_conditions=[REJECTED])
    _claim(fake, "envc", [REJECTED])
    start = time.monotonic()
    with pytest.raises(SandboxClaimFailedError) as info:
        _get(mode, fake, "envc", 30)
    assert time.monotonic() - start < 5
    assert isinstance(
        info.value, SandboxNotFoundError
    )  # upstream's contract for get_sandbox (the CLI: exit 1)
    assert info.value.reason == "EnvVarsInjectionRejected"
    assert info.value.condition_message == REJECTED["message"]
    message = str(info.value)
    assert message.startswith(
        "SandboxClaim default/envc failed: Ready=False, reason EnvVarsInjectionRejected"
    )
    assert message.count("SandboxClaim default/envc") == 1
    assert not fake.find(lambda r: r.url.params.get("watch") == "true")  # nothing waited for


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_claim_that_fails_while_waited_for_stops_the_wait(mode: str) -> None:
    """Not yet answered when read; the watch then shows the controller's refusal."""
    fake = FakeCluster(bind=False, claim_conditions=[REJECTED])
    _claim(fake, "envc", [])
    start = time.monotonic()
    with pytest.raises(SandboxClaimFailedError, match="reason EnvVarsInjectionRejected"):
        _get(mode, fake, "envc", 20)
    assert time.monotonic() - start < 5


def test_a_claim_on_a_missing_template_is_said_as_create_says_it() -> None:
    missing = ready_condition("False", "TemplateNotFound", 'SandboxTemplate "t" not found')
    fake = FakeCluster(bind=False, claim_conditions=[missing])
    _claim(fake, "c", [missing])
    with pytest.raises(SandboxTemplateNotFoundError, match=r"^SandboxClaim default/c: sandbox template not"):
        _get("sync", fake, "c", 30)


def test_an_expired_claim_is_a_failed_claim_named_once() -> None:
    expired = ready_condition("False", "ClaimExpired", "Claim expired.")
    fake = FakeCluster(bind=False, claim_conditions=[expired])
    _claim(fake, "gone", [expired])
    with pytest.raises(SandboxClaimFailedError, match="has expired") as info:
        _get("sync", fake, "gone", 5)
    assert str(info.value).count("SandboxClaim default/gone") == 1
    assert info.value.reason == "ClaimExpired"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_claim_never_bound_is_not_found_naming_the_claim_once(mode: str) -> None:
    """Upstream's contract for a wait that runs out: `SandboxNotFoundError` (the CLI's exit 3)."""
    pending = ready_condition("False", "SandboxNotReady", "waiting for a warm sandbox")
    fake = FakeCluster(bind=False, claim_conditions=[pending])
    _claim(fake, "slow", [pending])
    with pytest.raises(SandboxNotFoundError) as info:
        _get(mode, fake, "slow", 0.5)
    message = str(info.value)
    assert message.startswith("SandboxClaim default/slow was not bound to a Sandbox within 0.5 s"), message
    assert message.count("SandboxClaim default/slow") == 1
    assert info.value.reason == "SandboxNotReady"


def test_what_resolve_raises_for_a_failed_claim_is_also_upstreams_not_found() -> None:
    """Upstream's `get_sandbox` reports every failure as `SandboxNotFoundError`; code written for it catches only
    that. The claim's own failure, raised at once, is both."""
    from agent_sandbox_sdk import (
        SandboxClaimFailedError,
        SandboxNotFoundError,
        SandboxTemplateNotFoundError,
        SandboxWarmPoolNotFoundError,
    )
    from agent_sandbox_sdk._lifecycle import _also_not_found

    for cls in (SandboxClaimFailedError, SandboxTemplateNotFoundError, SandboxWarmPoolNotFoundError):
        err = _also_not_found(cls("SandboxClaim ns/x failed", reason="R", condition_message="m"))
        assert isinstance(err, cls)
        assert isinstance(err, SandboxNotFoundError)
        assert (str(err), err.reason, err.condition_message) == ("SandboxClaim ns/x failed", "R", "m")
