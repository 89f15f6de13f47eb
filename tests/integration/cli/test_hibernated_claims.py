"""The CLI with the lifecycle controller (`--sandbox-lifecycle`): a hibernated claim as its user meets it
(`resume` with the documented Role, `logs`, `suspend`) and the exit codes of `agent-sandbox lifecycle ...`,
which are the sandbox commands' (docs/sdk/python.md "Exit codes")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.cli.main import main
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.invocation import cli_command
from agent_sandbox.kube import SANDBOX
from tests.helpers import wait_for
from tests.integration.cli.conftest import role_kubeconfig
from tests.integration.sdk.conftest import apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLE_ROLE = Path(__file__).resolve().parents[3] / "examples" / "rbac" / "sandbox-user.yaml"


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    """The controller with the lifecycle controller on (installs the SandboxArchive CRD and its grants)."""
    started = start_controller(cluster, extra=("--sandbox-lifecycle",))
    try:
        yield started
    finally:
        stop(started)


def _cli(capsys: pytest.CaptureFixture[str], kubeconfig: Path, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--kubeconfig", str(kubeconfig)])
    out, err = capsys.readouterr()
    return code, out, err


def _hibernated(cluster: DevCluster, namespace: str, sandbox: str) -> bool:
    admin = cluster.admin()
    gone = admin.request("GET", SANDBOX.path(namespace, sandbox))[0] == 404
    return gone and admin.request("GET", lc.ARCHIVE.path(namespace, sandbox))[0] == 200


def test_a_hibernated_claim_is_resumed_by_the_documented_user_role(
    cluster: DevCluster,
    namespace: str,
    controller: Started,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """examples/rbac/sandbox-user.yaml says its user may "suspend and resume" sandboxes; a hibernated one's
    resume was refused (403 on `get sandboxarchives`: the restore request is a patch of the archive). The
    claim-level commands say what a hibernated sandbox is: `logs` said `HTTP 404: pods "..." not found` and
    exited 1; `lifecycle suspend` of it exited 1 where `suspend` exits 3 (until December 6)."""
    admin = cluster.kubeconfig
    ns = ("-n", namespace)
    apply_pool(cluster, namespace, replicas=1)
    code, out, err = _cli(capsys, admin, "create", "pool", *ns, "--name", "u", "-o", "json")
    assert code == 0, err
    sandbox = json.loads(out)["sandbox_id"]
    assert _cli(capsys, admin, "lifecycle", "hibernate", sandbox, *ns)[0] == 0
    wait_for(lambda: _hibernated(cluster, namespace, sandbox), timeout=60, what=f"{sandbox} hibernated")

    code, out, err = _cli(capsys, admin, "logs", "u", *ns)
    assert (code, out) == (3, ""), err
    assert (
        err
        == f"error: sandbox {namespace}/u is hibernated: it has no pod, so no log; `{cli_command('resume u')}` first\n"
    )
    assert _cli(capsys, admin, "suspend", "u", *ns)[0] == 3
    for command in ("suspend", "hibernate"):
        code, _, err = _cli(capsys, admin, "lifecycle", command, sandbox, *ns)
        assert (code, "is hibernated already" in err) == (3, True), (command, err)

    role = next(d for d in yaml.safe_load_all(EXAMPLE_ROLE.read_text()) if d["kind"] == "Role")
    user = role_kubeconfig(cluster, namespace, "user", role["rules"], tmp_path)
    wait_for(lambda: _cli(capsys, user, "get", "u", *ns)[0] == 0, what="the role to apply")
    code, out, err = _cli(capsys, user, "resume", "u", *ns, "--timeout", "90", "-o", "json")
    assert code == 0, err
    resumed = json.loads(out)
    assert (resumed["sandbox_id"], resumed["ready"], resumed["suspended"]) == (sandbox, True, False)
    assert not _hibernated(cluster, namespace, sandbox)


def test_lifecycle_exit_codes_are_the_sandbox_commands(
    cluster: DevCluster, namespace: str, controller: Started, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not found is 3 and a wait that ran out 4, as for `get`, `resume` and the others: `lifecycle` said 1
    for both (until December 6)."""
    admin = cluster.kubeconfig
    ns = ("-n", namespace)
    code, _, err = _cli(capsys, admin, "lifecycle", "resume", "nope", *ns)
    assert (code, err) == (3, f"error: no Sandbox or hibernated Sandbox named {namespace}/nope\n")
    for command in ("suspend", "hibernate"):
        code, _, err = _cli(capsys, admin, "lifecycle", command, "nope", *ns)
        assert (code, err) == (3, f"error: no Sandbox named {namespace}/nope\n"), command

    # A Sandbox whose pod can never be scheduled: never Ready.
    stuck = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "stuck"},
        "spec": {
            "podTemplate": {
                "spec": {
                    "containers": [{"name": "main", "image": "busybox"}],
                    "nodeSelector": {"no-such-node-label": "x"},
                }
            }
        },
    }
    status, body = cluster.admin().request("POST", SANDBOX.path(namespace), stuck)
    assert status == 201, body
    code, _, err = _cli(capsys, admin, "lifecycle", "resume", "stuck", *ns, "--timeout", "2")
    assert (code, err) == (4, f"error: Sandbox {namespace}/stuck not Ready within 2s\n")
