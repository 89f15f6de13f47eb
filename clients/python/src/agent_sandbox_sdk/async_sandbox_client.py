"""`AsyncSandboxClient`: the asyncio twin of `SandboxClient` (spec §3.9), running the same flows.

One client serves many concurrent sandboxes: its driver pools connections for all of them (no thread
pool). Like upstream, `connection_config` is required unless `$AGENT_SANDBOX_ROUTER_URL` is set, and
`cleanup=True` is the default (auto-named claims are deleted at interpreter exit, synchronously).
"""

from __future__ import annotations

import asyncio
import atexit
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar

from . import _inventory, _kube, _lifecycle, metrics
from ._claims import validate_create_args
from ._closewatch import closed_error
from ._driver import AsyncDriver, SyncDriver
from ._shared import Registry, default_connection_config, kube_endpoint, log
from ._tracing import tracing_for
from .async_sandbox import _CLEANUP_LIMIT, AsyncSandbox, _cancelling, _stop_limit
from .exceptions import SandboxError, SandboxMetadataError, SandboxNotFoundError
from .models import SandboxConnectionConfig, SandboxInfo, SandboxTracerConfig, WarmPoolInfo

__all__ = ["AsyncSandboxClient"]


class AsyncSandboxClient:
    """Creates sandboxes from warm pools and tracks their handles.

    `connection_config`: how handles reach sandboxes (default: the router at `$AGENT_SANDBOX_ROUTER_URL`,
    else a kubectl tunnel to the router Service). `api_client`: Kubernetes access (a kubeconfig path, a
    lightkube `KubeConfig`, or a `kubernetes` `ApiClient`); default `$KUBECONFIG`, in-cluster, `~/.kube/config`.
    `transport`: an httpx2 transport for every HTTP request (tests, custom networking).
    `cleanup=True`: at interpreter exit, delete auto-named claims this client created (explicit names are
    only disconnected).
    """

    sandbox_class: ClassVar[type[AsyncSandbox]] = AsyncSandbox

    def __init__(
        self,
        connection_config: SandboxConnectionConfig | None = None,
        tracer_config: SandboxTracerConfig | None = None,
        cleanup: bool = True,
        api_client: Any = None,
        *,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        transport: Any = None,
    ) -> None:
        self.connection_config = connection_config or default_connection_config(async_client=True)
        self.tracer_config = tracer_config or SandboxTracerConfig()
        self._driver = AsyncDriver(
            kube_endpoint(api_client, kubeconfig, context),
            transport=transport,
            tracing=tracing_for(self.tracer_config),
        )
        self._registry = Registry()
        if cleanup:
            atexit.register(self._cleanup_at_exit)

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self._cleanup()

    @property
    def context_namespace(self) -> str:
        """The namespace the Kubernetes configuration names: the kubeconfig context's, or the pod's service
        account's in a cluster; "default" when it names none. What kubectl uses without `-n`; the methods
        themselves keep upstream's explicit `namespace="default"` default."""
        return self._driver.kube.namespace if self._driver.kube is not None else "default"

    async def close(self) -> None:
        """Disconnect every handle and close pooled connections (claims stay). Calls in flight meanwhile (other
        tasks) fail with `SandboxClientClosedError`; a create among them deletes its auto-named claim."""
        self._driver.closing()  # before the registry is read: a create completing from now on undoes itself
        for _key, handle in self._registry.snapshot():
            await handle.close_connection()
        await self._driver.aclose()

    def _cleanup_at_exit(self) -> None:
        """Delete tracked auto-named claims with a synchronous driver (no event loop at exit)."""
        driver = SyncDriver(self._driver.kube)
        try:
            for (namespace, claim), handle in self._registry.tracked_here():
                if handle._state.auto_named and handle.claim_name is not None:
                    try:
                        # that claim, by UID: one made again under its name since is someone else's
                        driver.run(_lifecycle.delete_claim(namespace, claim, uid=handle._state.claim_uid))
                    except SandboxError as err:
                        log.error("deleting SandboxClaim %s/%s at exit failed: %s", namespace, claim, err)
        finally:
            driver.close()

    async def _cleanup(self) -> None:
        """The end of an `async with` block: delete the claims this client created, disconnect the others.

        The first cancellation meanwhile stops none of it (one already under way - the block was cancelled, or
        the task caught one - is not counted: an `asyncio.timeout` around the block does not cut a DELETE):
        each DELETE is answered (`terminate()` is shielded), the remaining claims are deleted too, and then the
        cancellation is raised. A second one - the task's `cancelling()` two above its count at entry, or a
        DELETE's own cancellation (the event loop closing, asyncio's second Ctrl-C) - stops the cleanup at once
        (its connections are still closed); the claims not yet deleted stay tracked (with `cleanup=True`, the
        exit hook deletes them). Until December 7 the first cancellation ended the cleanup at once, and the
        claim whose DELETE it cut - already dropped from the registry - outlived the process, even with
        `cleanup=True`; then, for a while, none stopped it, and it started new DELETEs in a closing event loop
        ("Task was destroyed but it is pending!")."""
        limit = _stop_limit()
        interrupted: asyncio.CancelledError | None = None
        token = _CLEANUP_LIMIT.set(limit)  # the count a `super().terminate()` of a `sandbox_class` keeps
        # Before the registry is read: a create of another task completing from now on deletes its own claim
        # rather than track a handle this cleanup no longer sees.
        self._driver.closing()
        try:
            for (namespace, claim), handle in self._registry.tracked_here():
                if handle._state.auto_named:
                    # A cancellation raised out of it stops the cleanup here: the rest stays tracked.
                    absorbed = await self._delete_created(namespace, claim, handle, limit)
                else:
                    try:
                        await handle.close_connection()
                        absorbed = None
                    except asyncio.CancelledError as cancel:
                        if _cancelling() > limit:
                            raise
                        absorbed = cancel
                interrupted = interrupted or absorbed
        finally:
            _CLEANUP_LIMIT.reset(token)
            # Stopped by a second cancellation too: until December 7 (that change's second version) the pooled
            # connections were then left open.
            await self._driver.aclose()
        if interrupted is not None:
            raise interrupted

    async def _delete_created(
        self, namespace: str, claim: str, handle: AsyncSandbox, limit: int
    ) -> asyncio.CancelledError | None:
        """Cleanup's delete of a claim this client created: that claim, by its UID. One made again under its
        name since (by someone else) is refused by the API server and left alone, quietly; until December 6
        cleanup deleted it by name. Errors are logged, as `delete_sandbox` logs them.

        The handle stays tracked until its claim is deleted (`terminate()` then drops it): a DELETE that
        failed or was interrupted leaves it to the exit cleanup (`cleanup=True`), as upstream's registry does.
        Returns the cancellation `terminate()` absorbed; one that stops the cleanup is raised."""
        try:
            # The bound method, not the class's: a terminate() replaced on the instance (`mock.patch.object`)
            # is called too (until December 7 cleanup went around it).
            if getattr(handle.terminate, "__func__", None) is AsyncSandbox.terminate:
                return await handle._terminate(limit)
            try:  # a `sandbox_class` with its own terminate(): called; a cancellation out of it counts as one
                await handle.terminate()
            except asyncio.CancelledError as cancel:
                if _cancelling() > limit:
                    raise
                return cancel
        except SandboxError as err:
            log.error("deleting SandboxClaim %s/%s failed: %s", namespace, claim, err)
        return None

    def _track(
        self,
        claim: str,
        sandbox_id: str,
        namespace: str,
        *,
        pod_ip: str | None = None,
        auto_named: bool = False,
        uid: str | None = None,
        inherit: bool = False,
    ) -> AsyncSandbox:
        """A new handle, tracked. `uid`: the claim's; `inherit` (get_sandbox only): see `Registry.add`."""
        handle = self.sandbox_class(
            claim,
            sandbox_id,
            namespace,
            self.connection_config,
            self.tracer_config,
            self._driver,
            pod_ip=pod_ip,
        )
        handle._state.auto_named = auto_named
        handle._state.claim_uid = uid
        self._registry.add(namespace, claim, handle, inherit=inherit)
        return handle

    # ------------------------------------------------------------------------------------ create

    async def create_sandbox(
        self,
        warmpool: str,
        namespace: str = "default",
        sandbox_ready_timeout: int | float = 180,
        labels: Mapping[str, str] | None = None,
        *,
        shutdown_after_seconds: int | None = None,
        volume_claim_templates: Sequence[Mapping[str, Any]] | None = None,
        pod_labels: Mapping[str, str] | None = None,
        pod_annotations: Mapping[str, str] | None = None,
        claim_name: str | None = None,
        adopt_existing: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> AsyncSandbox:
        """Claim a sandbox from the warm pool `warmpool` and wait until it is Ready.

        Raises `SandboxWarmPoolNotFoundError` / `SandboxTemplateNotFoundError` / `SandboxClaimFailedError`
        as soon as the claim reports so, and `SandboxTimeoutError` (a `TimeoutError`) naming the claim's
        last condition after `sandbox_ready_timeout` seconds. An auto-named claim is deleted on failure.
        """
        validate_create_args(
            warmpool=warmpool,
            namespace=namespace,
            labels=labels,
            pod_labels=pod_labels,
            pod_annotations=pod_annotations,
            shutdown_after_seconds=shutdown_after_seconds,
            claim_name=claim_name,
            adopt_existing=adopt_existing,
            sandbox_ready_timeout=sandbox_ready_timeout,
            env=env,
            volume_claim_templates=volume_claim_templates,
        )

        untracked: list[tuple[str, str | None]] = []
        closes = self._driver.closes

        def track(created: _lifecycle.CreatedClaim) -> AsyncSandbox:
            view = created.view
            if self._driver.closes != closes:
                # A `close()` (or the `async with` exit's cleanup) started while the create ran: it fails like
                # any call in flight across a `close()`, and its auto-named claim is deleted below, as an
                # interrupted create's is. Until December 7 it returned after the cleanup had read the
                # registry, and its claim was never deleted. (Both start with `closing()`, before they read
                # the registry: a handle tracked here before it is in what they read.)
                if created.auto_named:
                    untracked.append((view.name, view.uid))
                raise closed_error(f"create_sandbox {namespace}/{view.name}")
            try:
                return self._track(
                    view.name,
                    view.sandbox_name or view.name,
                    namespace,
                    pod_ip=view.pod_ip,
                    auto_named=created.auto_named,
                    uid=view.uid,
                )
            except BaseException:
                # The handle could not be made (a `sandbox_class` whose constructor raises): the claim is in
                # no registry, so no cleanup would ever delete it. `track` runs synchronously inside the
                # driver; the DELETE follows below, once the error comes out of `run`. An explicit name is
                # the caller's (perhaps adopted) claim and stays, as on any failed create.
                if created.auto_named:
                    untracked.append((view.name, view.uid))
                raise

        flow = _lifecycle.create_and_wait(
            warmpool=warmpool,
            namespace=namespace,
            timeout=sandbox_ready_timeout,
            labels=labels,
            shutdown_after_seconds=shutdown_after_seconds,
            volume_claim_templates=volume_claim_templates,
            pod_labels=pod_labels,
            pod_annotations=pod_annotations,
            env=env,
            claim_name=claim_name,
            adopt_existing=adopt_existing,
        )
        with metrics.timed("sandbox_client_create_latency_ms"):
            # Tracked as soon as it is Ready: a cancellation while the create closes its watch then ends the
            # call (asyncio.timeout raises TimeoutError), and the client still deletes the claim.
            try:
                return await self._driver.run(flow, track)
            except BaseException:
                for name, uid in untracked:
                    await self._delete_untracked(namespace, name, uid)
                raise

    async def _delete_untracked(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Best effort: DELETE a Ready auto-named claim no handle stands for (by `uid` when known); a failure
        is logged. Shielded: a cancellation meanwhile is raised once
        the DELETE has gone out and been answered, not in its middle."""
        deleting = asyncio.ensure_future(self._driver.run(_lifecycle.delete_claim(namespace, name, uid=uid)))
        interrupted: asyncio.CancelledError | None = None
        while not deleting.done():
            try:
                await asyncio.shield(deleting)
            except asyncio.CancelledError as cancel:
                interrupted = cancel
            except Exception as err:  # the caller gets the error that left the claim untracked
                log.error("deleting SandboxClaim %s/%s after its handle failed: %s", namespace, name, err)
        if interrupted is not None:
            raise interrupted

    async def create_sandbox_from_template(
        self,
        template: str,
        namespace: str = "default",
        sandbox_ready_timeout: int | float = 180,
        **kwargs: Any,
    ) -> AsyncSandbox:
        """Cold-start a sandbox from a SandboxTemplate (ours): claims from a `replicas: 0` warm pool
        `<template>-cold`, created on first use. Keywords as `create_sandbox`."""
        pool = await self._driver.run(_inventory.ensure_cold_pool(namespace, template))
        return await self.create_sandbox(pool, namespace, sandbox_ready_timeout, **kwargs)

    # ------------------------------------------------------------------------------------ find

    async def get_sandbox(
        self,
        claim_name: str,
        namespace: str = "default",
        resolve_timeout: int | float = 30,
        warmpool_name: str | None = None,
    ) -> AsyncSandbox:
        """A handle on an existing claim (this process's tracked one if still active); `SandboxNotFoundError`.

        A claim that is not bound and failed for good raises at once what `create_sandbox` raises for it (also
        a `SandboxNotFoundError`, upstream's contract):
        `SandboxClaimFailedError` (e.g. `EnvVarsInjectionRejected`, `ClaimExpired`),
        `SandboxTemplateNotFoundError`, `SandboxWarmPoolNotFoundError` (ours: upstream waits out
        `resolve_timeout`, then raises `SandboxNotFoundError`).
        `warmpool_name`: refuse (`ValueError`) a claim that draws from another warm pool.
        """
        try:
            claim, sandbox = await self._driver.run(
                _lifecycle.resolve_claim(
                    namespace, claim_name, timeout=resolve_timeout, warmpool=warmpool_name
                )
            )
        except SandboxNotFoundError:  # a failed claim's error is one too (`resolve_claim`)
            if (stale := self._registry.get_active(namespace, claim_name)) is not None:
                await stale.close_connection()
            raise
        tracked = self._registry.get_active(namespace, claim_name)
        if tracked is not None:
            if tracked.sandbox_id == sandbox.name and tracked._state.claim_uid in (None, claim.uid):
                return tracked  # type: ignore[no-any-return]
            # Its Sandbox changed, or its claim was made again under the name (a cold start's Sandbox is named
            # after its claim, so the name alone matched): a handle on another claim, whose `terminate()` (by
            # UID) would leave this one alone. Until December 6 it was returned as this claim's handle.
            await tracked.close_connection()
        return self._track(
            claim_name,
            sandbox.name,
            namespace,
            pod_ip=sandbox.pod_ip or claim.pod_ip,
            uid=claim.uid,
            inherit=True,
        )

    async def list_active_sandboxes(self) -> list[tuple[str, str]]:
        """(namespace, claim name) of this client's handles that are still connected."""
        return self._registry.active_keys()

    async def list_all_sandboxes(
        self, namespace: str = "default", label_selector: str | None = None
    ) -> list[str]:
        """Names of every SandboxClaim in `namespace` (optionally filtered by labels)."""
        claims = await self._driver.run(
            _kube.list_objects(_kube.CLAIMS, namespace, label_selector=label_selector)
        )
        return [str(c["metadata"]["name"]) for c in claims]

    async def list_sandboxes(
        self, namespace: str | None = "default", label_selector: str | None = None
    ) -> list[SandboxInfo]:
        """Every claim in `namespace` with its Sandbox's state (ours).

        `namespace` None: every namespace (needs the right to list claims cluster-wide)."""
        return await self._driver.run(_inventory.list_sandboxes(namespace, label_selector))

    async def get_sandbox_info(self, claim_name: str, namespace: str = "default") -> SandboxInfo:
        """One claim with its Sandbox's state, as a row of `list_sandboxes` (ours); two GETs whatever the
        namespace holds. `SandboxNotFoundError` if the claim does not exist."""
        return await self._driver.run(_inventory.get_sandbox_info(namespace, claim_name))

    async def list_warm_pools(self, namespace: str | None = "default") -> list[WarmPoolInfo]:
        """Every SandboxWarmPool in `namespace` with desired and ready members (ours).

        `namespace` None: every namespace (needs the right to list pools cluster-wide)."""
        return await self._driver.run(_inventory.list_warm_pools(namespace))

    async def get_sandbox_claim_warmpool_name(self, claim_name: str, namespace: str) -> str:
        """The claim's `spec.warmPoolRef.name`."""
        claim = await self._driver.run(_kube.get(_kube.CLAIMS, namespace, claim_name))
        if claim is None:
            raise SandboxNotFoundError(f"SandboxClaim {namespace}/{claim_name} not found")
        pool = ((claim.get("spec") or {}).get("warmPoolRef") or {}).get("name")
        if not pool:
            raise SandboxMetadataError(f"SandboxClaim {namespace}/{claim_name} has no spec.warmPoolRef.name")
        return str(pool)

    # ------------------------------------------------------------------------------------ delete

    async def delete_sandbox(self, claim_name: str, namespace: str = "default") -> None:
        """Terminate the tracked handle (its claim, by UID), else delete the claim by name; errors are logged,
        not raised."""
        # Tracked until its claim is deleted (`terminate()` then drops it): a DELETE that fails or is cancelled
        # leaves it to cleanup. Until December 7 it was dropped first, and such a claim outlived the process.
        handle = self._registry.get(namespace, claim_name)
        try:
            if handle is not None:
                await handle.terminate()
            else:
                await self._driver.run(_lifecycle.delete_claim(namespace, claim_name))
        except SandboxError as err:
            log.error("deleting SandboxClaim %s/%s failed: %s", namespace, claim_name, err)

    async def delete_claim(self, claim_name: str, namespace: str = "default") -> bool:
        """Delete a claim by name (ours): True if it existed, False if not; other errors raise.

        A tracked handle for it is disconnected first. Unlike `delete_sandbox`, errors are not swallowed.
        """
        handle = self._registry.get(namespace, claim_name)
        if handle is not None:
            await handle.close_connection()
        existed: bool = await self._driver.run(_lifecycle.delete_claim(namespace, claim_name))
        if handle is not None:  # only now: a DELETE that failed or was interrupted leaves it to cleanup
            self._registry.forget(namespace, claim_name, handle)
        return existed

    async def delete_all(self) -> None:
        """`delete_sandbox` for every tracked handle."""
        for (namespace, claim), _handle in self._registry.snapshot():
            await self.delete_sandbox(claim, namespace)
