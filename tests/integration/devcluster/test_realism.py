"""The dev cluster behaves like a real one where the controllers need it (issue 3: storage, pod completion,
graceful termination, scheduling pressure). See docs/devcluster.md for how each behaviour is simulated."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.devcluster import ClusterError, DevCluster
from agent_sandbox.devcluster.config import (
    EXIT_AFTER_ANNOTATION,
    EXIT_CODE_ANNOTATION,
    POD_DELETION_INSTANT,
    READINESS_ANNOTATION,
    READINESS_EXTERNAL,
    START_AFTER_ANNOTATION,
    STORAGE_CLASS_IMMEDIATE,
    STORAGE_CLASS_WFFC,
    TERMINATE_AT_ANNOTATION,
    ClusterConfig,
)
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


# -- helpers -------------------------------------------------------------------------------------------------
def _get(cluster: DevCluster, path: str) -> Any:
    status, body = cluster.admin().request("GET", path)
    return body if status == 200 else None


def _create(cluster: DevCluster, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    status, body = cluster.admin().request("POST", path, obj)
    assert status == 201, body
    created: dict[str, Any] = body
    return created


def _pod(
    name: str,
    *,
    command: list[str] | None = None,
    restart: str = "Always",
    annotations: dict[str, str] | None = None,
    claims: tuple[str, ...] = (),
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if command:
        container["command"] = command
    if claims:
        container["volumeMounts"] = [{"name": c, "mountPath": f"/data/{c}"} for c in claims]
        spec["volumes"] = [{"name": c, "persistentVolumeClaim": {"claimName": c}} for c in claims]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"restartPolicy": restart, "containers": [container], **spec},
    }


def _pod_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "")


def _ready(pod: dict[str, Any] | None) -> bool:
    if not pod or pod["status"].get("phase") != "Running":
        return False
    conds = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return conds.get("Ready") == "True"


def _wait_ready(cluster: DevCluster, namespace: str, name: str, timeout: float = 30.0) -> dict[str, Any]:
    def ready() -> Any:
        pod = _get(cluster, _pod_path(namespace, name))
        return pod if _ready(pod) else None

    got: dict[str, Any] = wait_for(ready, timeout=timeout, what=f"pod {name} Running and Ready")
    return got


def _wait_gone(cluster: DevCluster, path: str, timeout: float = 30.0) -> None:
    wait_for(lambda: cluster.admin().request("GET", path)[0] == 404, timeout=timeout, what=f"{path} gone")


def _scheduled_condition(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    for cond in (pod or {}).get("status", {}).get("conditions", []):
        if cond["type"] == "PodScheduled":
            return dict(cond)
    return None


def _refused(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    """The pod's PodScheduled condition when the scheduler refused it (reason Unschedulable), else None."""
    cond = _scheduled_condition(pod)
    return cond if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable" else None


def _unschedulable(cluster: DevCluster, namespace: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = wait_for(
        lambda: _refused(_get(cluster, _pod_path(namespace, name))), what=f"pod {name} Unschedulable"
    )
    return got


# -- pod start and readiness ---------------------------------------------------------------------------------
def _conditions(pod: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}


def _scheduled_then_ready(cluster: DevCluster, namespace: str, name: str) -> tuple[float, dict[str, Any]]:
    """Seconds from first seeing the pod scheduled (still not started) to first seeing it Ready."""
    scheduled = wait_for(
        lambda: (lambda p: p if p and p["spec"].get("nodeName") else None)(
            _get(cluster, _pod_path(namespace, name))
        ),
        what=f"pod {name} scheduled",
        interval=0.02,
    )
    seen_at = time.monotonic()
    assert scheduled["status"].get("phase") == "Pending"
    assert _conditions(scheduled).get("Ready") != "True"
    ready = _wait_ready(cluster, namespace, name)
    return time.monotonic() - seen_at, ready


def test_a_scheduled_pod_starts_after_its_start_delay(cluster: DevCluster, namespace: str) -> None:
    cfg = cluster.config
    assert cfg.pod_start_delay_ms > 0  # the test cluster keeps the ~1 s default
    # Timed from the first poll that saw the pod scheduled: at most ~0.3 s after it was.
    _create(cluster, _pod_path(namespace), _pod("default"))
    took, ready = _scheduled_then_ready(cluster, namespace, "default")
    assert took >= cfg.pod_start_delay_ms / 1000 - 0.3, f"Ready {took:.2f}s after scheduling"
    status = ready["status"]["containerStatuses"][0]
    assert (status["ready"], status["started"], "running" in status["state"]) == (True, True, True)
    # A pod's own start-after annotation replaces the configured delay (and its jitter).
    _create(cluster, _pod_path(namespace), _pod("slow", annotations={START_AFTER_ANNOTATION: "2500ms"}))
    slow_took, _ = _scheduled_then_ready(cluster, namespace, "slow")
    assert slow_took >= 2.5 - 0.3, f"the start-after pod was Ready {slow_took:.2f}s after scheduling"


def test_a_pod_with_external_readiness_runs_not_ready_until_reported(
    cluster: DevCluster, namespace: str
) -> None:
    annotations = {READINESS_ANNOTATION: READINESS_EXTERNAL, START_AFTER_ANNOTATION: "200ms"}
    _create(cluster, _pod_path(namespace), _pod("held", annotations=annotations))
    running = wait_for(
        lambda: (lambda p: p if p and p["status"].get("phase") == "Running" else None)(
            _get(cluster, _pod_path(namespace, "held"))
        ),
        what="held pod Running",
    )
    assert _conditions(running)["Ready"] == "False"
    assert _conditions(running)["ContainersReady"] == "False"
    ready_cond = next(c for c in running["status"]["conditions"] if c["type"] == "Ready")
    assert ready_cond["reason"] == "ContainersNotReady"
    assert ready_cond["message"] == "containers with unready status: [main]"
    container = running["status"]["containerStatuses"][0]
    assert (container["ready"], container["started"], "running" in container["state"]) == (False, True, True)
    assert running["status"]["podIP"].startswith("127.")
    # kwok leaves it alone: still not Ready well after the start delay.
    time.sleep(1.5)
    assert _conditions(_get(cluster, _pod_path(namespace, "held")))["Ready"] == "False"
    # The outside component (a local runner) reports readiness, then its loss.
    cluster.set_pod_ready(namespace, "held", True)
    assert _ready(_get(cluster, _pod_path(namespace, "held")))
    cluster.set_pod_ready(namespace, "held", False)
    again = _get(cluster, _pod_path(namespace, "held"))
    assert _conditions(again)["Ready"] == "False"
    assert again["status"]["containerStatuses"][0]["ready"] is False
    # A pod that is not running cannot be reported ready.
    _create(cluster, _pod_path(namespace), _pod("later", annotations={START_AFTER_ANNOTATION: "60s"}))
    wait_for(
        lambda: (_get(cluster, _pod_path(namespace, "later")) or {}).get("spec", {}).get("nodeName"),
        what="scheduled",
    )
    with pytest.raises(ClusterError, match="not Running"):
        cluster.set_pod_ready(namespace, "later", True)


# -- storage -------------------------------------------------------------------------------------------------
def _claim(name: str, storage_class: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def _pvc_waits_for_first_consumer(cluster: DevCluster, namespace: str, name: str) -> bool:
    events = _get(cluster, f"/api/v1/namespaces/{namespace}/events") or {"items": []}
    return any(
        e["involvedObject"].get("name") == name and e.get("reason") == "WaitForFirstConsumer"
        for e in events["items"]
    )


@pytest.mark.parametrize("storage_class", [None, STORAGE_CLASS_WFFC], ids=["default-immediate", "wffc"])
def test_claim_binds_to_a_host_directory_that_outlives_pods_and_goes_with_the_claim(
    cluster: DevCluster, namespace: str, storage_class: str | None
) -> None:
    admin = cluster.admin()
    claims = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    _create(cluster, claims, _claim("data", storage_class))
    if storage_class == STORAGE_CLASS_WFFC:
        # The PV controller decides to wait for a consumer; until a pod uses the claim it stays unbound.
        wait_for(
            lambda: _pvc_waits_for_first_consumer(cluster, namespace, "data"), what="WaitForFirstConsumer"
        )
        pvc = _get(cluster, f"{claims}/data")
        assert pvc["status"]["phase"] == "Pending"
        assert not pvc["spec"].get("volumeName")
        assert cluster.volume_path(namespace, "data") is None
    else:
        # No class named: the default StorageClass is filled in and the claim binds before any pod exists.
        assert _get(cluster, f"{claims}/data")["spec"]["storageClassName"] == STORAGE_CLASS_IMMEDIATE
        wait_for(
            lambda: (_get(cluster, f"{claims}/data") or {})["status"].get("phase") == "Bound", what="Bound"
        )

    _create(cluster, _pod_path(namespace), _pod("user", claims=("data",)))
    pod = _wait_ready(cluster, namespace, "user")
    pvc = wait_for(
        lambda: (lambda c: c if c and c["status"].get("phase") == "Bound" else None)(
            _get(cluster, f"{claims}/data")
        ),
        what="claim Bound",
    )
    volume = pvc["spec"]["volumeName"]
    pv = _get(cluster, f"/api/v1/persistentvolumes/{volume}")
    assert pv["spec"]["claimRef"]["uid"] == pvc["metadata"]["uid"]
    if storage_class == STORAGE_CLASS_WFFC:
        node = pod["spec"]["nodeName"]
        assert pvc["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == node
        terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["values"] == [node]

    directory = cluster.volume_path(namespace, "data")
    assert directory is not None
    assert directory.is_dir()
    assert directory.parent == cluster.volumes
    (directory / "state.txt").write_text("kept")

    # The pod goes away and comes back (suspend/resume): same volume, same directory, same file.
    assert admin.request("DELETE", _pod_path(namespace, "user"))[0] == 200
    _wait_gone(cluster, _pod_path(namespace, "user"))
    assert (directory / "state.txt").read_text() == "kept"
    _create(cluster, _pod_path(namespace), _pod("user", claims=("data",)))
    _wait_ready(cluster, namespace, "user")
    assert _get(cluster, f"{claims}/data")["spec"]["volumeName"] == volume
    assert cluster.volume_path(namespace, "data") == directory
    assert (directory / "state.txt").read_text() == "kept"

    # Deleting the claim (reclaim policy Delete) removes the PV and its directory.
    assert admin.request("DELETE", _pod_path(namespace, "user"))[0] == 200
    assert admin.request("DELETE", f"{claims}/data")[0] == 200
    _wait_gone(cluster, f"/api/v1/persistentvolumes/{volume}")
    assert not directory.exists()


def test_claim_with_retain_policy_keeps_its_directory(cluster: DevCluster, namespace: str) -> None:
    name = f"retain-{uuid.uuid4().hex[:6]}"
    storage = "/apis/storage.k8s.io/v1/storageclasses"
    _create(
        cluster,
        storage,
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": "devcluster.agents.x-k8s.io/hostpath",
            "reclaimPolicy": "Retain",
        },
    )
    admin = cluster.admin()
    claims = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    volume = ""
    try:
        _create(cluster, claims, _claim("kept", name))
        directory: Path = wait_for(lambda: cluster.volume_path(namespace, "kept"), what="claim bound")
        volume = _get(cluster, f"{claims}/kept")["spec"]["volumeName"]
        assert admin.request("DELETE", f"{claims}/kept")[0] == 200
        wait_for(
            lambda: (
                (_get(cluster, f"/api/v1/persistentvolumes/{volume}") or {}).get("status", {}).get("phase")
                == "Released"
            ),
            what="volume Released",
        )
        assert directory.is_dir()
    finally:
        admin.request("DELETE", f"{storage}/{name}")
        if volume:  # Retain: nobody else deletes it
            admin.request("DELETE", f"/api/v1/persistentvolumes/{volume}")


# -- pod completion ------------------------------------------------------------------------------------------
def _container_state(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s["state"] for s in pod["status"].get("containerStatuses", [])}


@pytest.mark.parametrize(
    ("command", "annotations", "phase", "exit_code"),
    [
        (["sh", "-c", "exit 0"], {}, "Succeeded", 0),
        (["sh", "-c", "exit 1"], {}, "Failed", 1),
        (["sh", "-c", "echo done; exit 7"], {}, "Failed", 7),
        (["/bin/true"], {}, "Succeeded", 0),
        (["false"], {}, "Failed", 1),
        (None, {EXIT_CODE_ANNOTATION: "0"}, "Succeeded", 0),
        (None, {EXIT_CODE_ANNOTATION: "42", EXIT_AFTER_ANNOTATION: "300ms"}, "Failed", 42),
    ],
    ids=["exit-0", "exit-1", "script-exit-7", "true", "false", "annotation-0", "annotation-42"],
)
def test_never_restarting_pod_runs_then_finishes_with_its_exit_code(
    cluster: DevCluster,
    namespace: str,
    command: list[str] | None,
    annotations: dict[str, str],
    phase: str,
    exit_code: int,
) -> None:
    _create(
        cluster, _pod_path(namespace), _pod("job", command=command, restart="Never", annotations=annotations)
    )
    running = _wait_ready(cluster, namespace, "job")
    assert running["status"]["podIP"].startswith("127.")

    def finished() -> Any:
        pod = _get(cluster, _pod_path(namespace, "job"))
        return pod if pod and pod["status"].get("phase") in ("Succeeded", "Failed") else None

    pod = wait_for(finished, what="pod finished")
    assert pod["status"]["phase"] == phase
    terminated = _container_state(pod)["main"]["terminated"]
    assert terminated["exitCode"] == exit_code
    assert terminated["reason"] == ("Completed" if exit_code == 0 else "Error")
    conds = {c["type"]: c for c in pod["status"]["conditions"]}
    assert conds["Ready"]["status"] == "False"
    assert conds["Ready"]["reason"] == "PodCompleted"


def test_pods_a_kubelet_would_restart_keep_running(cluster: DevCluster, namespace: str) -> None:
    fast = {EXIT_AFTER_ANNOTATION: "200ms"}
    _create(cluster, _pod_path(namespace), _pod("always", command=["sh", "-c", "exit 0"], annotations=fast))
    _create(
        cluster,
        _pod_path(namespace),
        _pod("onfailure", command=["sh", "-c", "exit 1"], restart="OnFailure", annotations=fast),
    )
    _create(cluster, _pod_path(namespace), _pod("server", command=["sleep", "infinity"], restart="Never"))
    # A sentinel with the same delay shows when the exit stage would have fired.
    _create(
        cluster,
        _pod_path(namespace),
        _pod("sentinel", command=["sh", "-c", "exit 0"], restart="Never", annotations=fast),
    )
    for name in ("always", "onfailure", "server"):
        _wait_ready(cluster, namespace, name)
    wait_for(
        lambda: (_get(cluster, _pod_path(namespace, "sentinel")) or {})["status"].get("phase") == "Succeeded",
        what="sentinel Succeeded",
    )
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        for name in ("always", "onfailure", "server"):
            assert _ready(_get(cluster, _pod_path(namespace, name))), name
        time.sleep(0.1)


# -- graceful deletion ---------------------------------------------------------------------------------------
def test_deleted_pod_stays_terminating_for_its_capped_grace_period(
    cluster: DevCluster, namespace: str
) -> None:
    cap = cluster.config.pod_grace_period_cap_ms / 1000
    _create(cluster, _pod_path(namespace), _pod("web"))
    _wait_ready(cluster, namespace, "web")
    start = time.monotonic()
    status, body = cluster.admin().request("DELETE", _pod_path(namespace, "web"))
    assert status == 200, body
    terminating = _get(cluster, _pod_path(namespace, "web"))
    assert terminating is not None
    assert terminating["metadata"]["deletionTimestamp"]
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    # The pod's 30 s grace period is capped by the cluster's knob: gone well before 30 s.
    _wait_gone(cluster, _pod_path(namespace, "web"), timeout=cap + 15)
    assert time.monotonic() - start >= cap * 0.8


def test_a_deleted_ready_pod_turns_not_ready_at_once_then_finishes_its_grace_period(
    cluster: DevCluster, namespace: str
) -> None:
    _create(cluster, _pod_path(namespace), _pod("web"))
    _wait_ready(cluster, namespace, "web")
    assert cluster.admin().request("DELETE", _pod_path(namespace, "web"))[0] == 200
    # Sample until the pod is gone: (phase, Ready, ContainersReady, containers ready, containers running).
    states: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pod = _get(cluster, _pod_path(namespace, "web"))
        if pod is None:
            break
        conds = _conditions(pod)
        containers = pod["status"].get("containerStatuses", [])
        state = (
            pod["status"].get("phase"),
            conds.get("Ready"),
            conds.get("ContainersReady"),
            tuple(c["ready"] for c in containers),
            tuple("running" in c["state"] for c in containers),
        )
        if not states or states[-1] != state:
            states.append(state)
        time.sleep(0.02)
    else:
        pytest.fail(f"pod not gone after 30s: {states}")
    not_ready = ("Running", "False", "False", (False,), (True,))
    # NotReady while its containers still run, then killed at the end of the grace period, then gone.
    assert not_ready in states, states
    assert all(
        s == ("Running", "True", "True", (True,), (True,)) for s in states[: states.index(not_ready)]
    ), states
    assert all(s[0] == "Failed" for s in states[states.index(not_ready) + 1 :]), states


def test_finalizer_keeps_a_deleted_pod_until_it_is_removed(cluster: DevCluster, namespace: str) -> None:
    admin = cluster.admin()
    pod = _pod("guarded")
    pod["metadata"]["finalizers"] = ["example.com/keep"]
    _create(cluster, _pod_path(namespace), pod)
    _wait_ready(cluster, namespace, "guarded")
    assert admin.request("DELETE", _pod_path(namespace, "guarded"))[0] == 200

    # After the grace period the containers are killed (terminal phase) but the finalizer keeps the pod.
    def terminated() -> Any:
        got = _get(cluster, _pod_path(namespace, "guarded"))
        return got if got and got["status"].get("phase") == "Failed" else None

    got = wait_for(terminated, what="containers killed after the grace period")
    assert got["metadata"]["finalizers"] == ["example.com/keep"]
    assert _container_state(got)["main"]["terminated"]["exitCode"] == 137
    still = _get(cluster, _pod_path(namespace, "guarded"))
    assert still is not None
    assert still["metadata"]["finalizers"] == ["example.com/keep"]

    status, body = admin.request("PATCH", _pod_path(namespace, "guarded"), {"metadata": {"finalizers": None}})
    assert status == 200, body
    _wait_gone(cluster, _pod_path(namespace, "guarded"))


def test_force_delete_is_immediate(cluster: DevCluster, namespace: str) -> None:
    _create(cluster, _pod_path(namespace), _pod("doomed"))
    _wait_ready(cluster, namespace, "doomed")
    out = cluster.kubectl("delete", "pod", "doomed", "-n", namespace, "--grace-period=0", "--force")
    assert out.returncode == 0, out.stderr
    assert cluster.admin().request("GET", _pod_path(namespace, "doomed"))[0] == 404


def test_instant_pod_deletion_removes_a_ready_pod_at_once_without_a_status_write() -> None:
    """`pod_deletion="instant"` (benchmarks that match upstream's KWOK gate): kwok's fast pod-delete, no
    NotReady step, no grace period, no terminated status; a finalizer still keeps the pod."""
    cluster = DevCluster.up(
        ClusterConfig(name=f"instant-{uuid.uuid4().hex[:6]}", nodes=1, pod_deletion=POD_DELETION_INSTANT)
    )
    try:
        admin, namespace = cluster.admin(), "default"
        _create(cluster, _pod_path(namespace), _pod("quick"))
        guarded = _pod("guarded")
        guarded["metadata"]["finalizers"] = ["example.com/keep"]
        _create(cluster, _pod_path(namespace), guarded)
        _wait_ready(cluster, namespace, "quick")
        _wait_ready(cluster, namespace, "guarded")
        start = time.monotonic()
        assert admin.request("DELETE", _pod_path(namespace, "quick"))[0] == 200
        seen: list[dict[str, Any]] = []
        while (pod := _get(cluster, _pod_path(namespace, "quick"))) is not None:
            seen.append(pod)
            assert time.monotonic() - start < 10, "a deleted pod outlived 10 s"
            time.sleep(0.01)
        # Its 30 s grace period (capped at 1 s in graceful mode) is not waited for, and every version seen
        # until it was gone is the Ready one: nothing wrote its status or a terminate-at stamp.
        assert time.monotonic() - start < cluster.config.pod_grace_period_cap_ms / 1000
        assert all(_ready(p) for p in seen), [p["status"] for p in seen if not _ready(p)]
        assert not any(TERMINATE_AT_ANNOTATION in (p["metadata"].get("annotations") or {}) for p in seen)

        assert admin.request("DELETE", _pod_path(namespace, "guarded"))[0] == 200
        time.sleep(2)
        still = _get(cluster, _pod_path(namespace, "guarded"))
        assert still is not None
        assert still["metadata"]["finalizers"] == ["example.com/keep"]
        assert (
            admin.request("PATCH", _pod_path(namespace, "guarded"), {"metadata": {"finalizers": None}})[0]
            == 200
        )
        _wait_gone(cluster, _pod_path(namespace, "guarded"))
    finally:
        cluster.down(quiet=True)


# -- scheduling pressure -------------------------------------------------------------------------------------
def test_pod_larger_than_any_node_stays_pending_unschedulable(cluster: DevCluster, namespace: str) -> None:
    pod = _pod("huge")
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1000"}}
    _create(cluster, _pod_path(namespace), pod)
    cond = _unschedulable(cluster, namespace, "huge")
    assert "Insufficient cpu" in cond["message"]
    got = _get(cluster, _pod_path(namespace, "huge"))
    assert got["status"]["phase"] == "Pending"
    assert not got["spec"].get("nodeName")


@pytest.fixture
def spare_node(cluster: DevCluster) -> Any:
    """A node of its own, so tainting or failing it never disturbs other tests on the session cluster."""
    name = f"spare-{uuid.uuid4().hex[:6]}"
    cluster.add_node(name)
    try:
        yield name
    finally:
        cluster.delete_node(name)


def _pinned(name: str, node: str) -> dict[str, Any]:
    return _pod(name, nodeSelector={"kubernetes.io/hostname": node})


def _pin_until_refused(
    cluster: DevCluster, namespace: str, node: str, attempts: int = 5
) -> tuple[str, dict[str, Any]]:
    """Create pods pinned to `node` until the scheduler refuses one; its name and PodScheduled condition.

    The scheduler acts on its own informer cache: a taint or cordon the API already shows can reach it after a
    pod created right after it (seen on a loaded machine: bound 50 ms after the not-ready taint was written), and
    a real cluster binds that pod too. So a pod bound in that window is deleted and a new one tried; a scheduler
    that ignored the node's state would bind every attempt, and the test fails.
    """
    bound: list[str] = []
    for attempt in range(attempts):
        name = f"pinned-{attempt}"
        _create(cluster, _pod_path(namespace), _pinned(name, node))

        def outcome(name: str = name) -> Any:
            pod = _get(cluster, _pod_path(namespace, name))
            return "bound" if pod and pod["spec"].get("nodeName") else _refused(pod)

        got = wait_for(outcome, what=f"pod {name} bound or Unschedulable")
        if got != "bound":
            return name, dict(got)
        bound.append(name)
        cluster.admin().request("DELETE", _pod_path(namespace, name) + "?gracePeriodSeconds=0")
        time.sleep(0.5)
    pytest.fail(f"the scheduler bound every pod pinned to {node}: {bound}")


def test_tainted_node_gets_no_new_pods_until_untainted(
    cluster: DevCluster, namespace: str, spare_node: str
) -> None:
    cluster.taint_node(spare_node, "example.com/dedicated", "gpu", "NoSchedule")
    pinned, cond = _pin_until_refused(cluster, namespace, spare_node)
    assert "untolerated taint" in cond["message"]
    cluster.untaint_node(spare_node, "example.com/dedicated")
    assert _wait_ready(cluster, namespace, pinned)["spec"]["nodeName"] == spare_node


def test_cordoned_node_gets_no_new_pods_until_uncordoned(
    cluster: DevCluster, namespace: str, spare_node: str
) -> None:
    cluster.cordon_node(spare_node)
    pinned, _ = _pin_until_refused(cluster, namespace, spare_node)
    cluster.cordon_node(spare_node, False)
    assert _wait_ready(cluster, namespace, pinned)["spec"]["nodeName"] == spare_node


def test_not_ready_node_stays_not_ready_and_is_tainted_until_it_recovers(
    cluster: DevCluster, namespace: str, spare_node: str
) -> None:
    path = f"/api/v1/nodes/{spare_node}"
    cluster.set_node_ready(spare_node, False)

    def not_ready_taint() -> Any:
        node = _get(cluster, path)
        taints = {(t["key"], t["effect"]) for t in node["spec"].get("taints", [])}
        return ("node.kubernetes.io/not-ready", "NoSchedule") in taints

    # kube-controller-manager treats it as a NotReady node: it taints it, so no new pod lands there.
    wait_for(not_ready_taint, what="node.kubernetes.io/not-ready taint")
    pinned, _ = _pin_until_refused(cluster, namespace, spare_node)
    # It sticks: kwok's initialize/heartbeat stages would flip a plain Ready=False back within milliseconds.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        conds = {c["type"]: c["status"] for c in _get(cluster, path)["status"]["conditions"]}
        assert conds["Ready"] == "False"
        time.sleep(0.2)

    cluster.set_node_ready(spare_node, True)
    assert _wait_ready(cluster, namespace, pinned)["spec"]["nodeName"] == spare_node
