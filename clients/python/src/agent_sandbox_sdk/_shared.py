"""State shared by the sync and async front-ends: the handle's identity and connection, the client's
registry of handles, default configuration. No I/O here; the front-ends only add `run`/`await run`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ._claims import SandboxView
from ._connection import Connection
from ._kubeconfig import KubeEndpoint, load_kube_endpoint
from .constants import ROUTER_TOKEN_ENV, ROUTER_URL_ENV
from .models import (
    SandboxConnectionConfig,
    SandboxDirectConnectionConfig,
    SandboxLocalTunnelConnectionConfig,
    SandboxTracerConfig,
)

__all__ = [
    "HandleState",
    "Interruptions",
    "Registry",
    "default_connection_config",
    "kube_endpoint",
    "log",
    "router_token_headers",
]

log = logging.getLogger("agent_sandbox_sdk")


def default_connection_config(*, async_client: bool) -> SandboxConnectionConfig:
    """No config given: the router at `$AGENT_SANDBOX_ROUTER_URL` if set (with `$AGENT_SANDBOX_ROUTER_TOKEN`
    as its bearer token when set), else upstream's default (a kubectl tunnel to the router Service; the
    async client, like upstream's, has none)."""
    url = os.environ.get(ROUTER_URL_ENV)
    if url:
        return SandboxDirectConnectionConfig(api_url=url, extra_headers=router_token_headers(None))
    if async_client:
        raise ValueError(
            f"AsyncSandboxClient needs a connection_config (or {ROUTER_URL_ENV}=<router URL>); "
            "the kubectl tunnel mode is sync-only"
        )
    return SandboxLocalTunnelConnectionConfig()


def router_token_headers(token: str | None) -> dict[str, str]:
    """`Authorization: Bearer <token>` for the router: `token`, else `$AGENT_SANDBOX_ROUTER_TOKEN`, else none.

    A value given with its scheme (`Bearer v1....`, what an `Authorization` header holds) is taken without it:
    until December 6 it became `Bearer Bearer v1....`, which every router refuses as `unauthenticated`."""
    token = (token if token is not None else os.environ.get(ROUTER_TOKEN_ENV, "")).strip()
    scheme, _, rest = token.partition(" ")
    if scheme.lower() == "bearer" and rest.strip():
        token = rest.strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def kube_endpoint(
    api_client: object | None, kubeconfig: str | os.PathLike[str] | None, context: str | None
) -> KubeEndpoint:
    return load_kube_endpoint(api_client, kubeconfig=kubeconfig, context=context)


@dataclass
class HandleState:
    """Identity and transport of one sandbox handle."""

    claim_name: str | None
    sandbox_id: str
    namespace: str
    connection: Connection
    tracer_config: SandboxTracerConfig
    #: Created by this client under a generated name (deleted on cleanup; explicit names are only disconnected).
    auto_named: bool = False
    #: The claim's UID when the handle was made (None: not known). A name is not an identity - a claim can be
    #: deleted and made again under it - so the claim cleanup deletes is this one (a DELETE precondition).
    claim_uid: str | None = None
    active: bool = True
    pod_name: str | None = None
    name_hash: str | None = None
    #: Set by the client that tracks the handle (`Registry.add`): called with this state once `terminate()`
    #: has deleted the claim, so that the client forgets the handle (nothing is left for its cleanup to do).
    untrack: Callable[[HandleState], None] | None = field(default=None, repr=False)

    def remember(self, view: SandboxView) -> None:
        self.pod_name = view.pod_name
        self.name_hash = view.name_hash

    def close(self) -> None:
        self.active = False
        self.connection.close()

    def deleted(self) -> None:
        """The claim was deleted (or was no longer the one meant): nothing left to delete, nothing to track."""
        self.claim_name = None
        if self.untrack is not None:
            self.untrack(self)


class Interruptions:
    """The Ctrl-Cs (`KeyboardInterrupt`, or `SystemExit` from a signal handler) one sync `terminate()` - or one
    client cleanup, across its claims - has met. The first is absorbed: the DELETE it cut is sent again, the
    cleanup goes on through the remaining claims, and it is raised at the end. A second one (during that
    resend, or anywhere later) is raised at once and stops it all: the claims not yet deleted stay tracked,
    for the exit hook. Until December 7 (that change's first version) each `terminate()` absorbed one and the
    cleanup caught every one, so with an unreachable API server each claim cost two Ctrl-Cs (and twice the
    request timeout).

    A cleanup shares its `Interruptions` with the `terminate()`s it calls (`shared()`): a `sandbox_class`
    whose terminate() calls `super().terminate()` made a fresh one per claim until December 7 (that change's
    second version), so each claim absorbed a Ctrl-C of its own again. A `with` block that a Ctrl-C ended
    starts from it (`first`): until then the exit absorbed one more, and stopping it took three."""

    def __init__(self, first: KeyboardInterrupt | SystemExit | None = None) -> None:
        self.first = first

    @staticmethod
    def current() -> Interruptions | None:
        """The `Interruptions` a cleanup (or a `with` exit) of this thread shares, if one runs."""
        return _SHARED_INTERRUPTIONS.get()

    @contextlib.contextmanager
    def shared(self) -> Iterator[Interruptions]:
        """Make this the one `terminate()` records in (and raises nothing of: the sharer does) meanwhile."""
        token = _SHARED_INTERRUPTIONS.set(self)
        try:
            yield self
        finally:
            _SHARED_INTERRUPTIONS.reset(token)


#: A context variable, not an attribute: each thread (a sync client is shared by threads) has its own.
_SHARED_INTERRUPTIONS: ContextVar[Interruptions | None] = ContextVar(
    "agent_sandbox_sdk_interruptions", default=None
)


def new_state(
    *,
    claim_name: str | None,
    sandbox_id: str,
    namespace: str,
    config: SandboxConnectionConfig,
    tracer_config: SandboxTracerConfig | None,
    kube: KubeEndpoint | None,
    pod_ip: str | None = None,
    auto_named: bool = False,
) -> HandleState:
    conn = Connection(
        config,
        sandbox_id=sandbox_id,
        namespace=namespace,
        pod_ip=pod_ip,
        kubectl_flags=kube.kubectl_flags() if kube is not None else [],
    )
    return HandleState(
        claim_name, sandbox_id, namespace, conn, tracer_config or SandboxTracerConfig(), auto_named=auto_named
    )


#: Every registry of this process, so that a forked child can give each a lock of its own.
_REGISTRIES: weakref.WeakSet[Registry] = weakref.WeakSet()


def _new_locks_after_fork() -> None:
    """In a forked child: a registry's lock may have been held, at the fork, by another thread of the parent -
    one the child does not have, so the lock would never be released. No registry operation was half done
    then in a way that matters (each is a few dict operations), so a fresh lock is all the child needs."""
    for registry in list(_REGISTRIES):
        registry._lock = threading.RLock()


os.register_at_fork(after_in_child=_new_locks_after_fork)


@dataclass(eq=False)
class Registry:
    """The client's handles, keyed by (namespace, claim name).

    Thread-safe: a sync client is shared by threads, and each `terminate()` drops its handle (`untrack`) from
    the thread that called it. Every operation takes `_lock` (never across I/O) and the iterations work on
    a snapshot; until December 7 `list_active_sandboxes()` and a `with` exit's cleanup raised `RuntimeError:
    dictionary changed size during iteration` while other threads terminated handles (the exit then deleted
    nothing). Read `handles` directly only where no other thread runs (tests)."""

    handles: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: The process that tracked each handle: a forked child inherits the registry, not the claims.
    _pids: dict[tuple[str, str], int] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def __post_init__(self) -> None:
        _REGISTRIES.add(self)

    def add(self, namespace: str, claim: str, handle: Any, *, inherit: bool = False) -> None:
        """Track `handle` for the claim, replacing the handle tracked for it before.

        `inherit` (`get_sandbox`): a new handle on the very claim this process created under a generated name
        (`get_sandbox` after `close()`, or after its Sandbox changed) stands for it, and stays one cleanup
        deletes. Until December 6 the new handle, not auto-named, replaced the closed one and the claim
        outlived the process. Only the same claim - the same UID, not just the same name - inherits: a claim
        made again under that name since (by someone else, or by this program with an explicit name) is not
        this process's to delete, and `create_sandbox` handles never inherit (an explicit name is only
        disconnected; a generated one is auto-named already). A forked child's new handle on its parent's
        claim does not become the child's to delete either."""
        key = (namespace, claim)
        with self._lock:
            previous = self.handles.get(key)
            if (
                inherit
                and previous is not None
                and previous is not handle
                and self._to_delete(key, previous)
                and previous._state.claim_uid is not None
                and previous._state.claim_uid == handle._state.claim_uid
            ):
                handle._state.auto_named = True
            self.handles[key] = handle
            self._pids[key] = os.getpid()
            # Forgotten once its `terminate()` deleted the claim: until December 7 every terminated handle
            # stayed here until `list_active_sandboxes()` (a long-lived client grew without bound, and its exit
            # cleanup walked them all). Not before: a DELETE that failed or was interrupted leaves it to cleanup.
            handle._state.untrack = functools.partial(self._forget, key)

    def get(self, namespace: str, claim: str) -> Any:
        """The handle tracked for the claim, if any."""
        with self._lock:
            return self.handles.get((namespace, claim))

    def snapshot(self) -> list[tuple[tuple[str, str], Any]]:
        """A snapshot of every tracked handle with its key."""
        with self._lock:
            return list(self.handles.items())

    def tracked_here(self) -> list[tuple[tuple[str, str], Any]]:
        """The handles this process tracked - what its cleanup may delete. A forked child (a prefork server's
        worker) that exits normally must not delete, from its inherited registry, the claims its parent uses.
        A snapshot: the cleanup's `terminate()`s (and other threads') drop handles as it walks it."""
        pid = os.getpid()
        with self._lock:
            return [(key, h) for key, h in self.handles.items() if self._pids.get(key) == pid]

    def get_active(self, namespace: str, claim: str) -> Any:
        with self._lock:
            handle = self.handles.get((namespace, claim))
            return handle if handle is not None and handle.is_active else None

    def _forget(self, key: tuple[str, str], state: HandleState) -> None:
        """Drop the handle of `state` if it is still the one tracked for `key` (a newer handle on the claim,
        from `get_sandbox`, stays)."""
        with self._lock:
            handle = self.handles.get(key)
            if handle is not None and handle._state is state:
                del self.handles[key]
                self._pids.pop(key, None)

    def forget(self, namespace: str, claim: str, handle: Any) -> None:
        """Drop `handle` if it is still the one tracked for the claim."""
        self._forget((namespace, claim), handle._state)

    def active_keys(self) -> list[tuple[str, str]]:
        """The keys of the connected handles. Closed handles are forgotten here only when cleanup has nothing
        left to do with them: an auto-named claim this process created stays until cleanup deletes it (until
        December 6 listing after `close()` dropped it, and the claim outlived the process)."""
        with self._lock:
            for key in [k for k, h in self.handles.items() if not h.is_active and not self._to_delete(k, h)]:
                del self.handles[key]
                self._pids.pop(key, None)
            return [k for k, h in self.handles.items() if h.is_active]

    def _to_delete(self, key: tuple[str, str], handle: Any) -> bool:
        """Whether cleanup would delete this handle's claim (`tracked_here`, auto-named, not yet deleted)."""
        return bool(
            self._pids.get(key) == os.getpid()
            and handle._state.auto_named
            and handle._state.claim_name is not None
        )
