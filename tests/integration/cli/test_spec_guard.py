"""examples/rbac/sandbox-spec-guard.yaml with the team-user Role of examples/rbac/sandbox-user.yaml: the user's
`patch sandboxes`/`patch sandboxarchives` (suspend, resume, restore) no longer rewrites what the controller
runs (spec.podTemplate, an archive's spec.sandbox), while the SDK's and the CLI's suspend/resume and the
controllers' own writes (claim adoption with env injection, warm pool refill, lifecycle restore) go on.
Until December 7 the Role alone let its user run any Pod spec - any ServiceAccount, privileged, hostPath, no
runtimeClassName - through the next resume (docs/security/threat-model.md)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.cli.main import main
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import SANDBOX
from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig
from tests.helpers import wait_for
from tests.integration.cli.conftest import role_kubeconfig
from tests.integration.sdk.conftest import EXT, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "rbac"
ROLE = EXAMPLES / "sandbox-user.yaml"
GUARD = EXAMPLES / "sandbox-spec-guard.yaml"
# Nothing listens here: suspend/resume only talk to the Kubernetes API.
UNUSED_ROUTER = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    """The controller with the lifecycle controller on (the SandboxArchive CRD; hibernate and restore)."""
    started = start_controller(cluster, extra=("--sandbox-lifecycle",))
    try:
        yield started
    finally:
        stop(started)


@pytest.fixture(scope="module")
def guard(cluster: DevCluster, controller: Started) -> Iterator[None]:
    """The shipped policies, applied as shipped (`kubectl apply -f`); cluster-wide, so removed after the module."""
    cluster.kubectl("apply", "-f", str(GUARD), check=True)
    try:
        yield
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", str(GUARD), check=True)


def _user(cluster: DevCluster, namespace: str, tmp_path: Path) -> Path:
    """A ServiceAccount bound to the shipped Role; the shipped Role and RoleBinding apply as they are."""
    cluster.kubectl("apply", "-n", namespace, "-f", str(ROLE), check=True)
    role = next(d for d in yaml.safe_load_all(ROLE.read_text()) if d["kind"] == "Role")
    user = role_kubeconfig(cluster, namespace, "user", role["rules"], tmp_path)
    can = ("auth", "can-i", "-n", namespace)
    wait_for(
        lambda: _kubectl(cluster, user, *can, "patch", "sandboxes").returncode == 0, what="the role to apply"
    )
    assert _kubectl(cluster, user, *can, "create", "pods").stdout.strip() == "no"
    return user


def _kubectl(
    cluster: DevCluster, kubeconfig: Path, *args: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The cluster's kubectl as the holder of `kubeconfig` (`cluster.kubectl` is the admin)."""
    argv = [str(cluster.binaries.path("kubectl")), f"--kubeconfig={kubeconfig}", *args]
    return subprocess.run(argv, input=input, capture_output=True, text=True, check=False)


def _refusal(namespace: str, field: str) -> str:
    return f"denied request: {field} may be changed only by principals that may create Pods in {namespace}"


def _policy_in_force(cluster: DevCluster, user: Path, namespace: str, sandbox: str) -> str:
    """Wait until the policy refuses a podTemplate patch (a dry run: nothing is written while it is not yet
    in force - the API server learns of policies from an informer); its error."""
    patch = json.dumps(
        [{"op": "add", "path": "/spec/podTemplate/spec/serviceAccountName", "value": "default"}]
    )

    def refused() -> str:
        out = _kubectl(
            cluster,
            user,
            "-n",
            namespace,
            "patch",
            "sandbox",
            sandbox,
            "--dry-run=server",
            "--type=json",
            "-p",
            patch,
        )
        return out.stderr if out.returncode != 0 else ""

    return str(wait_for(refused, what="the ValidatingAdmissionPolicy to refuse a podTemplate patch"))


def _cli(capsys: pytest.CaptureFixture[str], kubeconfig: Path, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--kubeconfig", str(kubeconfig)])
    out, err = capsys.readouterr()
    return code, out, err


def _sandbox(cluster: DevCluster, namespace: str, name: str) -> dict[str, Any]:
    status, obj = cluster.admin().request("GET", SANDBOX.path(namespace, name))
    assert status == 200, obj
    return dict(obj)


def _ready(obj: dict[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_the_user_suspends_and_resumes_but_cannot_change_what_runs(
    cluster: DevCluster,
    namespace: str,
    guard: None,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    apply_pool(cluster, namespace, replicas=1)
    user = _user(cluster, namespace, tmp_path)
    ns = ("-n", namespace)
    with SandboxClient(UNUSED_ROUTER, kubeconfig=user) as client:
        sandbox = wait_for(
            lambda: client.create_sandbox("pool", namespace, sandbox_ready_timeout=90),
            what="the role to apply",
        )
        name = sandbox.sandbox_id
        assert _refusal(namespace, "spec.podTemplate") in _policy_in_force(cluster, user, namespace, name)
        before = _sandbox(cluster, namespace, name)["spec"]["podTemplate"]

        # The finding's patch: another ServiceAccount with a token, privileged, the host's root, no runtimeClass.
        escalate = [
            {"op": "add", "path": "/spec/podTemplate/spec/serviceAccountName", "value": "default"},
            {"op": "add", "path": "/spec/podTemplate/spec/automountServiceAccountToken", "value": True},
            {
                "op": "add",
                "path": "/spec/podTemplate/spec/containers/0/securityContext",
                "value": {"privileged": True},
            },
            {
                "op": "add",
                "path": "/spec/podTemplate/spec/volumes",
                "value": [{"name": "h", "hostPath": {"path": "/"}}],
            },
        ]
        for kind, ops in (
            ("sandbox", escalate),
            # v1alpha1 (upstream's clients) is converted and checked the same way.
            ("sandboxes.v1alpha1.agents.x-k8s.io", escalate[:1]),
        ):
            out = _kubectl(cluster, user, *ns, "patch", kind, name, "--type=json", "-p", json.dumps(ops))
            assert out.returncode == 1, out.stdout
            assert _refusal(namespace, "spec.podTemplate") in out.stderr, out.stderr
        for field, patch in (
            (
                "metadata.labels",
                {"metadata": {"labels": {"agents.x-k8s.io/sandbox-template-ref-hash": None}}},
            ),
            ("metadata.ownerReferences", {"metadata": {"ownerReferences": None}}),
            ("spec.shutdownPolicy", {"spec": {"shutdownPolicy": "Delete"}}),
            ("spec.service", {"spec": {"service": True}}),
        ):
            out = _kubectl(
                cluster, user, *ns, "patch", "sandbox", name, "--type=merge", "-p", json.dumps(patch)
            )
            assert (out.returncode, _refusal(namespace, field) in out.stderr) == (1, True), (
                field,
                out.stderr,
            )
        assert _sandbox(cluster, namespace, name)["spec"]["podTemplate"] == before

        # What the SDK writes (spec.operatingMode and its annotations) still goes through.
        sandbox.suspend(timeout=60)
        assert sandbox.get_pod_ip() is None
        sandbox.resume(timeout=60)
        assert sandbox.status()[0] == "SandboxReady"
        # And what the CLI writes, by claim and by Sandbox name.
        claim = sandbox.claim_name or ""
        for argv in (
            ("suspend", claim, "--timeout", "60"),
            ("resume", claim, "--timeout", "60"),
            ("lifecycle", "suspend", name),
            ("lifecycle", "resume", name, "--timeout", "60"),
        ):
            code, _, err = _cli(capsys, user, *argv, *ns)
            assert code == 0, (argv, err)
        assert _sandbox(cluster, namespace, name)["spec"]["podTemplate"] == before
        sandbox.terminate()


def test_the_controllers_still_bind_claims_with_env_and_refill_the_pool(
    cluster: DevCluster, namespace: str, guard: None, tmp_path: Path
) -> None:
    """Claim adoption (labels, owner references), a cold claim's env injected into the podTemplate and the
    warm pool's new members are the controller's writes: it may create Pods, so the policy does not check them
    (the user's claim is what starts them)."""
    admin = cluster.admin()
    template = {
        "apiVersion": EXT,
        "kind": "SandboxTemplate",
        "metadata": {"name": "tmpl"},
        "spec": {
            "podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
            "envVarsInjectionPolicy": "Allowed",
        },
    }
    assert admin.request("POST", f"/apis/{EXT}/namespaces/{namespace}/sandboxtemplates", template)[0] == 201
    apply_pool(cluster, namespace, replicas=1)
    user = _user(cluster, namespace, tmp_path)
    members = f"/apis/agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxes"

    def member() -> str:
        """The pool's one Ready member (a Sandbox the warm pool controls), or ""."""
        items = admin.request("GET", members)[1]["items"]
        ready = [
            i["metadata"]["name"]
            for i in items
            if _ready(i)
            and any(
                r.get("controller") and r["kind"] == "SandboxWarmPool"
                for r in i["metadata"].get("ownerReferences") or []
            )
        ]
        return str(ready[0]) if len(ready) == 1 else ""

    first = wait_for(member, timeout=60, what="a Ready warm pool member")
    _policy_in_force(cluster, user, namespace, first)

    def claim(name: str, **spec: object) -> str:
        """The Sandbox claim `name` (the user's) is bound to, once it is Ready."""
        body = {"apiVersion": EXT, "kind": "SandboxClaim", "metadata": {"name": name}, "spec": spec}
        out = _kubectl(cluster, user, "-n", namespace, "create", "-f", "-", input=json.dumps(body))
        assert out.returncode == 0, out.stderr
        path = f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims/{name}"

        def bound() -> str:
            obj = admin.request("GET", path)[1]
            return (
                str(((obj.get("status") or {}).get("sandbox") or {}).get("name") or "") if _ready(obj) else ""
            )

        return str(wait_for(bound, timeout=90, what=f"claim {name} bound and Ready"))

    # Adoption of the warm member (labels, owner reference: the controller's patch), and the pool's refill.
    assert claim("w", warmPoolRef={"name": "pool"}) == first
    wait_for(lambda: member() not in ("", first), timeout=90, what="a new Ready warm pool member")
    # env forces a cold start (upstream): the controller creates the Sandbox with env injected into its podTemplate.
    cold = claim("c", warmPoolRef={"name": "pool"}, env=[{"name": "GREETING", "value": "hi"}])
    containers = _sandbox(cluster, namespace, cold)["spec"]["podTemplate"]["spec"]["containers"]
    assert {"name": "GREETING", "value": "hi"} in containers[0].get("env", [])


def test_an_archive_is_restored_but_not_rewritten(
    cluster: DevCluster,
    namespace: str,
    guard: None,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """`patch sandboxarchives` (the restore request) does not rewrite the archived Sandbox the restore recreates."""
    admin = cluster.kubeconfig
    ns = ("-n", namespace)
    apply_pool(cluster, namespace, replicas=1)
    user = _user(cluster, namespace, tmp_path)
    code, out, err = _cli(capsys, admin, "create", "pool", *ns, "--name", "u", "-o", "json")
    assert code == 0, err
    sandbox = json.loads(out)["sandbox_id"]
    _policy_in_force(cluster, user, namespace, sandbox)
    assert _cli(capsys, admin, "lifecycle", "hibernate", sandbox, *ns)[0] == 0
    archive = lc.ARCHIVE.path(namespace, sandbox)
    wait_for(
        lambda: cluster.admin().request("GET", archive)[0] == 200, timeout=60, what=f"{sandbox} archived"
    )

    patch = [
        {"op": "add", "path": "/spec/sandbox/spec/podTemplate/spec/serviceAccountName", "value": "default"}
    ]
    refused = _kubectl(
        cluster, user, *ns, "patch", "sandboxarchives", sandbox, "--type=json", "-p", json.dumps(patch)
    )
    assert refused.returncode == 1, refused.stdout
    assert _refusal(namespace, "spec.sandbox") in refused.stderr, refused.stderr

    code, out, err = _cli(capsys, user, "resume", "u", *ns, "--timeout", "90", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["ready"] is True
    assert "serviceAccountName" not in _sandbox(cluster, namespace, sandbox)["spec"]["podTemplate"]["spec"]


def test_the_user_cannot_orphan_a_claims_sandbox(
    cluster: DevCluster, namespace: str, guard: None, tmp_path: Path
) -> None:
    """`delete sandboxclaims` with propagationPolicy Orphan (or a claim created with the `orphan` finalizer) left
    the claim's Sandbox running without its controller reference: the controller then took the template-reference
    label off its Pod, out of the template's NetworkPolicy (egress to private addresses, ingress from anyone).
    Until December 7 the policies refused neither (the garbage collector's orphaning write passes them)."""
    admin = cluster.admin()
    apply_pool(cluster, namespace, replicas=1)
    user = _user(cluster, namespace, tmp_path)
    ns = ("-n", namespace)
    path = f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims"

    def create(name: str, **meta: object) -> subprocess.CompletedProcess[str]:
        body = {
            "apiVersion": EXT,
            "kind": "SandboxClaim",
            "metadata": {"name": name, **meta},
            "spec": {"warmPoolRef": {"name": "pool"}},
        }
        return _kubectl(cluster, user, *ns, "create", "-f", "-", input=json.dumps(body))

    def bound(name: str) -> str:
        obj = admin.request("GET", f"{path}/{name}")[1]
        return str(((obj.get("status") or {}).get("sandbox") or {}).get("name") or "") if _ready(obj) else ""

    assert create("w").returncode == 0
    sandbox = str(wait_for(lambda: bound("w"), timeout=90, what="claim w bound and Ready"))
    _policy_in_force(cluster, user, namespace, sandbox)

    orphan = _kubectl(cluster, user, *ns, "delete", "sandboxclaim", "w", "--cascade=orphan", "--wait=false")
    assert orphan.returncode == 1, orphan.stdout
    assert "denied request: propagationPolicy Orphan may be used only by principals that may create Pods" in (
        orphan.stderr
    ), orphan.stderr
    refs = _sandbox(cluster, namespace, sandbox)["metadata"].get("ownerReferences") or []
    assert [r["kind"] for r in refs if r.get("controller")] == ["SandboxClaim"]

    finalized = create("f", finalizers=["orphan"])
    assert finalized.returncode == 1, finalized.stdout
    assert (
        "denied request: metadata.finalizers: orphan may be set only by principals that may create Pods"
        in (finalized.stderr)
    ), finalized.stderr

    # A plain delete (the SDK's, the CLI's, kubectl's default) still goes, and takes the Sandbox with it.
    assert _kubectl(cluster, user, *ns, "delete", "sandboxclaim", "w", "--wait=false").returncode == 0
    wait_for(
        lambda: admin.request("GET", SANDBOX.path(namespace, sandbox))[0] == 404,
        timeout=60,
        what=f"{sandbox} deleted with its claim",
    )
