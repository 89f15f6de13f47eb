"""`SandboxClient`: create, find, list and delete sandboxes (spec §3.3), synchronously.

Same constructor, methods, keywords and defaults as upstream's 1.0.8 client; the additions
(`create_sandbox_from_template`, `list_sandboxes`, `list_warm_pools`, `close`, `kubeconfig=`) are ours.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, NoReturn

from . import _inventory, _kube, _lifecycle, metrics
from ._claims import validate_create_args
from ._closewatch import closed_error
from ._driver import SyncDriver
from ._shared import Interruptions, Registry, default_connection_config, kube_endpoint, log
from ._tracing import tracing_for
from .exceptions import SandboxError, SandboxMetadataError, SandboxNotFoundError
from .models import SandboxConnectionConfig, SandboxInfo, SandboxTracerConfig, WarmPoolInfo
from .sandbox import Sandbox

__all__ = ["SandboxClient"]


class SandboxClient:
    """Creates sandboxes from warm pools and tracks their handles.

    `connection_config`: how handles reach sandboxes (default: the router at `$AGENT_SANDBOX_ROUTER_URL`,
    else a kubectl tunnel to the router Service). `api_client`: Kubernetes access (a kubeconfig path, a
    lightkube `KubeConfig`, or a `kubernetes` `ApiClient`); default `$KUBECONFIG`, in-cluster, `~/.kube/config`.
    `transport`: an httpx2 transport for every HTTP request (tests, custom networking).
    `cleanup=True`: at interpreter exit, delete auto-named claims this client created (explicit names are
    only disconnected).
    """

    sandbox_class: ClassVar[type[Sandbox]] = Sandbox

    def __init__(
        self,
        connection_config: SandboxConnectionConfig | None = None,
        tracer_config: SandboxTracerConfig | None = None,
        cleanup: bool = False,
        api_client: Any = None,
        *,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        transport: Any = None,
    ) -> None:
        self.connection_config = connection_config or default_connection_config(async_client=False)
        self.tracer_config = tracer_config or SandboxTracerConfig()
        self._driver = SyncDriver(
            kube_endpoint(api_client, kubeconfig, context),
            transport=transport,
            tracing=tracing_for(self.tracer_config),
        )
        self._registry = Registry()
        if cleanup:
            atexit.register(self._cleanup)

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        # A block ended by a Ctrl-C: that one is the first, and one more during the cleanup stops it at once
        # (until December 7 the cleanup absorbed another one, and stopping it took three).
        ended_by = exc_val if isinstance(exc_val, (KeyboardInterrupt, SystemExit)) else None
        self._cleanup(ended_by)

    @property
    def context_namespace(self) -> str:
        """The namespace the Kubernetes configuration names: the kubeconfig context's, or the pod's service
        account's in a cluster; "default" when it names none. What kubectl uses without `-n`; the methods
        themselves keep upstream's explicit `namespace="default"` default."""
        return self._driver.kube.namespace if self._driver.kube is not None else "default"

    def close(self) -> None:
        """Disconnect every handle and close pooled connections (claims stay). Calls in flight meanwhile
        (other threads) fail with `SandboxClientClosedError`; a create among them deletes its auto-named claim."""
        self._driver.closing()  # before the registry is read: a create completing from now on undoes itself
        for _key, handle in self._registry.snapshot():
            handle.close_connection()
        self._driver.close()

    def _cleanup(self, ended_by: KeyboardInterrupt | SystemExit | None = None) -> None:
        """The end of a `with` block (and, with `cleanup=True`, interpreter exit): delete the claims this
        client created, disconnect the others.

        The first Ctrl-C meanwhile stops none of it: the DELETE it cut is sent again, the remaining claims are
        deleted too, and then the `KeyboardInterrupt` is raised. A second one stops the cleanup at once; the
        claims not yet deleted stay tracked (with `cleanup=True`, the exit hook tries again). Until December 7
        the first Ctrl-C ended the cleanup at once, and the claim whose DELETE it cut - already dropped from
        the registry - outlived the process, even with `cleanup=True`; then, for a while, no number of
        Ctrl-Cs stopped it (each claim absorbed two).

        `ended_by`: the Ctrl-C that ended the `with` block, counted as the first (not raised here: the `with`
        statement goes on raising it). The count is shared with the `terminate()`s called - a `sandbox_class`
        whose terminate() calls `super().terminate()` included (see `Interruptions`)."""
        interruptions = Interruptions(ended_by)
        # Before the registry is read: a create of another thread completing from now on deletes its own claim
        # (`_undo_closed_create`) rather than track a handle this cleanup no longer sees.
        self._driver.closing()
        try:
            with interruptions.shared():
                for (namespace, claim), handle in self._registry.tracked_here():
                    try:
                        if handle._state.auto_named:
                            self._delete_created(namespace, claim, handle, interruptions)
                        else:
                            handle.close_connection()
                    except (KeyboardInterrupt, SystemExit) as interruption:
                        if interruptions.first is not None:
                            raise  # the second: stop here, the rest stays tracked
                        interruptions.first = interruption
        finally:
            self._driver.close()
        if interruptions.first is not None and interruptions.first is not ended_by:
            raise interruptions.first

    def _delete_created(
        self, namespace: str, claim: str, handle: Sandbox, interruptions: Interruptions
    ) -> None:
        """Cleanup's delete of a claim this client created: that claim, by its UID. One made again under its
        name since (by someone else) is refused by the API server and left alone, quietly; until December 6
        cleanup deleted it by name. Errors are logged, as `delete_sandbox` logs them.

        The handle stays tracked until its claim is deleted (`terminate()` then drops it): a DELETE that
        failed or was interrupted leaves it to the exit cleanup (`cleanup=True`), as upstream's registry does.
        A Ctrl-C is recorded in `interruptions` (see `Interruptions`)."""
        try:
            # The bound method, not the class's: a terminate() replaced on the instance (`mock.patch.object`)
            # is called too (until December 7 cleanup went around it).
            if getattr(handle.terminate, "__func__", None) is Sandbox.terminate:
                handle._terminate(interruptions)
            else:  # its own terminate(): called; a Ctrl-C out of it counts as one (`super()` shares the count)
                handle.terminate()
        except SandboxError as err:
            log.error("deleting SandboxClaim %s/%s failed: %s", namespace, claim, err)

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
    ) -> Sandbox:
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

    def create_sandbox(
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
    ) -> Sandbox:
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
        closes = self._driver.closes
        with metrics.timed("sandbox_client_create_latency_ms"):
            created = self._driver.run(
                _lifecycle.create_and_wait(
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
            )
        view = created.view
        try:
            handle = self._track(
                view.name,
                view.sandbox_name or view.name,
                namespace,
                pod_ip=view.pod_ip,
                auto_named=created.auto_named,
                uid=view.uid,
            )
        except BaseException:
            # No handle (a `sandbox_class` whose constructor raises): no registry holds the claim, so no
            # cleanup would delete it. An explicit name is the caller's claim and stays, as on a failed create.
            if created.auto_named:
                try:
                    self._driver.run(_lifecycle.delete_claim(namespace, view.name))
                except Exception as err:  # the caller gets the error that left the claim untracked
                    log.error(
                        "deleting SandboxClaim %s/%s after its handle failed: %s", namespace, view.name, err
                    )
            raise
        # Checked after tracking: a `close()` counted before this read may have read the registry before the
        # handle was in it (undone here); one counted after it reads the registry later and finds this one.
        if self._driver.closes != closes:
            self._undo_closed_create(namespace, handle)
        return handle

    def _undo_closed_create(self, namespace: str, handle: Sandbox) -> NoReturn:
        """A create that `close()` (or the `with` exit's cleanup, in another thread) overlapped: it fails with
        `SandboxClientClosedError` like any call in flight across a `close()`, and its auto-named claim is
        deleted (by UID), as an interrupted create's is. Until December 7 such a create returned after the
        `with` block's cleanup had run, and its claim - tracked too late - was never deleted."""
        claim = handle.claim_name or ""
        error = closed_error(f"create_sandbox {namespace}/{claim}")
        self._registry.forget(namespace, claim, handle)
        handle.close_connection()
        if handle._state.auto_named:
            try:
                self._driver.run(_lifecycle.delete_claim(namespace, claim, uid=handle._state.claim_uid))
            except SandboxError as err:
                left = f"SandboxClaim {namespace}/{claim} was left behind: deleting it failed: {err}"
                error.add_note(left)
                log.warning("%s", left)
        raise error

    def create_sandbox_from_template(
        self,
        template: str,
        namespace: str = "default",
        sandbox_ready_timeout: int | float = 180,
        **kwargs: Any,
    ) -> Sandbox:
        """Cold-start a sandbox from a SandboxTemplate (ours): claims from a `replicas: 0` warm pool
        `<template>-cold`, created on first use. Keywords as `create_sandbox`."""
        pool = self._driver.run(_inventory.ensure_cold_pool(namespace, template))
        return self.create_sandbox(pool, namespace, sandbox_ready_timeout, **kwargs)

    # ------------------------------------------------------------------------------------ find

    def get_sandbox(
        self,
        claim_name: str,
        namespace: str = "default",
        resolve_timeout: int | float = 30,
        warmpool_name: str | None = None,
    ) -> Sandbox:
        """A handle on an existing claim (this process's tracked one if still active); `SandboxNotFoundError`.

        A claim that is not bound and failed for good raises at once what `create_sandbox` raises for it (also
        a `SandboxNotFoundError`, upstream's contract):
        `SandboxClaimFailedError` (e.g. `EnvVarsInjectionRejected`, `ClaimExpired`),
        `SandboxTemplateNotFoundError`, `SandboxWarmPoolNotFoundError` (ours: upstream waits out
        `resolve_timeout`, then raises `SandboxNotFoundError`).
        `warmpool_name`: refuse (`ValueError`) a claim that draws from another warm pool.
        """
        try:
            claim, sandbox = self._driver.run(
                _lifecycle.resolve_claim(
                    namespace, claim_name, timeout=resolve_timeout, warmpool=warmpool_name
                )
            )
        except SandboxNotFoundError:  # a failed claim's error is one too (`resolve_claim`)
            if (stale := self._registry.get_active(namespace, claim_name)) is not None:
                stale.close_connection()
            raise
        tracked = self._registry.get_active(namespace, claim_name)
        if tracked is not None:
            if tracked.sandbox_id == sandbox.name and tracked._state.claim_uid in (None, claim.uid):
                return tracked  # type: ignore[no-any-return]
            # Its Sandbox changed, or its claim was made again under the name (a cold start's Sandbox is named
            # after its claim, so the name alone matched): a handle on another claim, whose `terminate()` (by
            # UID) would leave this one alone. Until December 6 it was returned as this claim's handle.
            tracked.close_connection()
        return self._track(
            claim_name,
            sandbox.name,
            namespace,
            pod_ip=sandbox.pod_ip or claim.pod_ip,
            uid=claim.uid,
            inherit=True,
        )

    def list_active_sandboxes(self) -> list[tuple[str, str]]:
        """(namespace, claim name) of this client's handles that are still connected."""
        return self._registry.active_keys()

    def list_all_sandboxes(self, namespace: str = "default", label_selector: str | None = None) -> list[str]:
        """Names of every SandboxClaim in `namespace` (optionally filtered by labels)."""
        claims = self._driver.run(_kube.list_objects(_kube.CLAIMS, namespace, label_selector=label_selector))
        return [str(c["metadata"]["name"]) for c in claims]

    def list_sandboxes(
        self, namespace: str | None = "default", label_selector: str | None = None
    ) -> list[SandboxInfo]:
        """Every claim in `namespace` with its Sandbox's state (ours).

        `namespace` None: every namespace (needs the right to list claims cluster-wide)."""
        return self._driver.run(_inventory.list_sandboxes(namespace, label_selector))

    def get_sandbox_info(self, claim_name: str, namespace: str = "default") -> SandboxInfo:
        """One claim with its Sandbox's state, as a row of `list_sandboxes` (ours); two GETs whatever the
        namespace holds. `SandboxNotFoundError` if the claim does not exist."""
        return self._driver.run(_inventory.get_sandbox_info(namespace, claim_name))

    def list_warm_pools(self, namespace: str | None = "default") -> list[WarmPoolInfo]:
        """Every SandboxWarmPool in `namespace` with desired and ready members (ours).

        `namespace` None: every namespace (needs the right to list pools cluster-wide)."""
        return self._driver.run(_inventory.list_warm_pools(namespace))

    def get_sandbox_claim_warmpool_name(self, claim_name: str, namespace: str) -> str:
        """The claim's `spec.warmPoolRef.name`."""
        claim = self._driver.run(_kube.get(_kube.CLAIMS, namespace, claim_name))
        if claim is None:
            raise SandboxNotFoundError(f"SandboxClaim {namespace}/{claim_name} not found")
        pool = ((claim.get("spec") or {}).get("warmPoolRef") or {}).get("name")
        if not pool:
            raise SandboxMetadataError(f"SandboxClaim {namespace}/{claim_name} has no spec.warmPoolRef.name")
        return str(pool)

    # ------------------------------------------------------------------------------------ delete

    def delete_sandbox(self, claim_name: str, namespace: str = "default") -> None:
        """Terminate the tracked handle (its claim, by UID), else delete the claim by name; errors are logged,
        not raised."""
        # Tracked until its claim is deleted (`terminate()` then drops it): a DELETE that fails or is
        # interrupted leaves it to cleanup. Until December 7 it was dropped first, and such a claim outlived
        # the process.
        handle = self._registry.get(namespace, claim_name)
        try:
            if handle is not None:
                handle.terminate()
            else:
                self._driver.run(_lifecycle.delete_claim(namespace, claim_name))
        except SandboxError as err:
            log.error("deleting SandboxClaim %s/%s failed: %s", namespace, claim_name, err)

    def delete_claim(self, claim_name: str, namespace: str = "default") -> bool:
        """Delete a claim by name (ours): True if it existed, False if not; other errors raise.

        A tracked handle for it is disconnected first. Unlike `delete_sandbox`, errors are not swallowed.
        """
        handle = self._registry.get(namespace, claim_name)
        if handle is not None:
            handle.close_connection()
        existed: bool = self._driver.run(_lifecycle.delete_claim(namespace, claim_name))
        if handle is not None:  # only now: a DELETE that failed or was interrupted leaves it to cleanup
            self._registry.forget(namespace, claim_name, handle)
        return existed

    def delete_all(self) -> None:
        """`delete_sandbox` for every tracked handle."""
        for (namespace, claim), _handle in self._registry.snapshot():
            self.delete_sandbox(claim, namespace)
