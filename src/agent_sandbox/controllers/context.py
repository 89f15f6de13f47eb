"""What every controller's `setup(mgr, ctx)` receives besides the manager, and the registry entry type.

Each kind package (`sandbox`, `template`, `warmpool`, `claim`, `webhook`) exposes `setup(mgr, ctx)`: it
registers the cache scoping and indexes it reads, builds its reconciler from `ctx`, and adds its
controller or runnable to `mgr`. The process (`main.SETUPS`) runs the enabled ones in order. This module
imports no kind package, so the kinds can import it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..kube import Manager, Tracing
from .claim_pressure import ClaimPressure
from .options import Options

__all__ = ["ControllerContext", "Setup"]


@dataclass(frozen=True)
class ControllerContext:
    """Process-wide inputs of the controller setups.

    Attributes:
        options: the parsed process flags.
        tracing: span factory (`--enable-tracing`; a no-op by default).
        allowed_label_domains: the `allowed-label-domains` allow-list (§5.2), read once by the process.
        claim_pressure: recent claim arrivals; deferrable writes wait behind them (off without
            `--extensions` or with `--sandbox-claim-priority-hold=0`).
    """

    options: Options = field(default_factory=Options)
    tracing: Tracing = field(default_factory=Tracing)
    allowed_label_domains: tuple[str, ...] = ()
    claim_pressure: ClaimPressure = field(default_factory=lambda: ClaimPressure(0.0))


@dataclass(frozen=True)
class Setup:
    """One registrable unit: `setup(mgr, ctx)` runs when `enabled(options)` is true."""

    name: str
    setup: Callable[[Manager, ControllerContext], None]
    enabled: Callable[[Options], bool] = lambda _opts: True
