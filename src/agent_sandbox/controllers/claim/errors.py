"""Claim failure taxonomy: each failure knows its Ready reason, message and retry class (controllers spec §4.10).

```
ClaimError(reason, suppressed)                  Ready=False/<reason>
├── TemplateNotFound        TemplateNotFound      requeue 1 min, no error
├── WarmPoolNotFound        WarmPoolNotFound      requeue 1 min, no error
├── SandboxCreatePending    SandboxCreatePending  requeue 200 ms, no error (AlreadyExists, cache lag)
├── AdoptionConflict        AdoptionConflict      backoff
├── InvalidMetadata         InvalidMetadata       suppressed (no backoff)
├── EnvVarsInjectionRejected                      suppressed
├── VolumeClaimTemplatesError                     suppressed
├── SandboxNotOwned         ClaimExpired          suppressed ("Claim expired. <e>; deletion skipped.")
└── ReconcilerError         ReconcilerError       backoff ("Error seen: <e>")
```

A "suppressed" failure is reported in status and not retried with backoff: retrying cannot fix a claim
whose spec is wrong; the next spec/template change re-triggers the claim. Everything else that is not a
`ClaimError` (an API error, a timeout) becomes `ReconcilerError` at the status boundary and is retried.
"""

from __future__ import annotations

from agent_sandbox.api import constants as c

__all__ = [
    "AdoptionConflict",
    "ClaimError",
    "EnvVarsInjectionRejected",
    "InvalidMetadata",
    "ReconcilerError",
    "SandboxCreatePending",
    "SandboxNotOwned",
    "TemplateNotFound",
    "VolumeClaimTemplatesError",
    "WarmPoolNotFound",
]


class ClaimError(Exception):
    """A claim-level failure with the Ready reason it maps to.

    Attributes:
        reason: the claim's Ready reason while this failure holds.
        suppressed: True when retrying with backoff is pointless (status only).
    """

    reason: str = c.REASON_RECONCILER_ERROR
    suppressed: bool = False

    @property
    def message(self) -> str:
        """The Ready condition message for this failure."""
        return str(self)


class TemplateNotFound(ClaimError):
    reason = c.REASON_TEMPLATE_NOT_FOUND

    def __init__(self, name: str) -> None:
        super().__init__(f'SandboxTemplate "{name}" not found')


class WarmPoolNotFound(ClaimError):
    reason = c.REASON_WARM_POOL_NOT_FOUND

    def __init__(self, name: str) -> None:
        super().__init__(f'SandboxWarmPool "{name}" not found')
        self.name = name

    @property
    def message(self) -> str:
        """The pinned `SandboxWarmPool "<name>" not found`, plus a migration hint for a shadow pool.

        A v1alpha1 claim that names only a template converts to a v1beta1 claim on `shadow-pool-<template>`
        (api spec §8.4), a pool its author never mentioned and that only the migration bootstrap creates
        (the controller never does, controllers spec quirks); the hint says what to do.
        """
        if not self.name.startswith(c.SHADOW_POOL_PREFIX):
            return str(self)
        template = self.name.removeprefix(c.SHADOW_POOL_PREFIX)
        return (
            f'{self}; a v1alpha1 claim that names SandboxTemplate "{template}" directly needs this pool '
            f'(replicas 0, sandboxTemplateRef "{template}"): create it or run '
            "helm/files/migrate.sh --phase=bootstrap (docs/api-migration-guide.md)"
        )


class SandboxCreatePending(ClaimError):
    """The cold create hit AlreadyExists before the cache showed the Sandbox."""

    reason = c.REASON_SANDBOX_CREATE_PENDING

    def __init__(self) -> None:
        super().__init__("sandbox already exists (cache lag)")

    @property
    def message(self) -> str:
        return "Sandbox already created; waiting for cache to converge"


class AdoptionConflict(ClaimError):
    """Transient contention on a warm candidate; the next pass retries from a converged view."""

    reason = c.REASON_ADOPTION_CONFLICT

    @property
    def message(self) -> str:
        return f"{self}; the next pass retries from a converged view"


class InvalidMetadata(ClaimError):
    reason = c.REASON_INVALID_METADATA
    suppressed = True


class EnvVarsInjectionRejected(ClaimError):
    reason = c.REASON_ENV_VARS_INJECTION_REJECTED
    suppressed = True


class VolumeClaimTemplatesError(ClaimError):
    reason = c.REASON_VOLUME_CLAIM_TEMPLATES_ERROR
    suppressed = True


class SandboxNotOwned(ClaimError):
    """Expiry (Retain) found a Sandbox of that name not controlled by the claim: deletion skipped."""

    reason = c.REASON_CLAIM_EXPIRED
    suppressed = True

    @property
    def message(self) -> str:
        return f"Claim expired. {self}; deletion skipped."


class ReconcilerError(ClaimError):
    """Anything else: reported as `Error seen: <text>` and retried with backoff."""

    @property
    def message(self) -> str:
        return f"{c.RECONCILER_ERROR_MESSAGE_PREFIX}{self}"
