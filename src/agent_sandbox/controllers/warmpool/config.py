"""SandboxWarmPool controller settings (controllers spec §3, §5.1; operations spec §7).

One frozen value built from the process flags. Non-positive batch size, grace period or recheck interval
set programmatically fall back to the upstream defaults (the process flags are validated earlier and
exit 1 instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ..options import Options

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_READINESS_GRACE_PERIOD",
    "DEFAULT_UNSCHEDULABLE_RECHECK_INTERVAL",
    "EXPECTATIONS_PENDING_REQUEUE",
    "GRACE_REQUEUE_SLACK",
    "WarmPoolConfig",
]

DEFAULT_MAX_BATCH_SIZE: Final = 300
DEFAULT_READINESS_GRACE_PERIOD: Final = 300.0
DEFAULT_UNSCHEDULABLE_RECHECK_INTERVAL: Final = 60.0
EXPECTATIONS_PENDING_REQUEUE: Final = 30.0
"""Fallback requeue while earlier writes are unobserved (§3.3 step 8-9); watch events are the fast path."""
GRACE_REQUEUE_SLACK: Final = 2.0
"""Pads the self-scheduled post-grace pass so it lands strictly after the deadline (§3.3 step 11)."""


@dataclass(frozen=True, slots=True)
class WarmPoolConfig:
    """Tunables of the warm pool controller; durations in seconds.

    Attributes:
        max_batch_size: creates/deletes per pass (`--sandbox-warm-pool-max-batch-size`).
        readiness_grace_period: stuck threshold (`--sandbox-warm-pool-readiness-grace-period`).
        unschedulable_recheck_interval: requeue while holding unschedulable members.
        replenish_delay: refill hold after members drop (`--sandbox-warm-pool-replenish-delay`).
        max_refill_rate: per-pool creates/s token bucket, 0 = unpaced (`--sandbox-warm-pool-max-refill-rate`).
        enable_eviction: stamp `cluster-autoscaler.kubernetes.io/safe-to-evict` (`--enable-warm-pool-eviction`).
        grace_jitter: the post-grace requeue is multiplied by a random factor in [1, 1 + grace_jitter);
            0 disables the jitter (deterministic tests).
    """

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    readiness_grace_period: float = DEFAULT_READINESS_GRACE_PERIOD
    unschedulable_recheck_interval: float = DEFAULT_UNSCHEDULABLE_RECHECK_INTERVAL
    replenish_delay: float = 0.0
    max_refill_rate: float = 0.0
    enable_eviction: bool = True
    grace_jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.max_batch_size <= 0:
            object.__setattr__(self, "max_batch_size", DEFAULT_MAX_BATCH_SIZE)
        if self.readiness_grace_period <= 0:
            object.__setattr__(self, "readiness_grace_period", DEFAULT_READINESS_GRACE_PERIOD)
        if self.unschedulable_recheck_interval <= 0:
            object.__setattr__(self, "unschedulable_recheck_interval", DEFAULT_UNSCHEDULABLE_RECHECK_INTERVAL)

    @classmethod
    def from_options(cls, opts: Options) -> WarmPoolConfig:
        """The configuration selected by the process flags."""
        return cls(
            max_batch_size=opts.sandbox_warm_pool_max_batch_size,
            readiness_grace_period=opts.sandbox_warm_pool_readiness_grace_period,
            unschedulable_recheck_interval=opts.sandbox_warm_pool_unschedulable_recheck_interval,
            replenish_delay=opts.sandbox_warm_pool_replenish_delay,
            max_refill_rate=opts.sandbox_warm_pool_max_refill_rate,
            enable_eviction=opts.enable_warm_pool_eviction,
        )
