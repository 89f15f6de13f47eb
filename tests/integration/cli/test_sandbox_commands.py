"""`agent-sandbox create|list|get|pools|suspend|resume|delete` against the real control plane + controller:
output shapes (`-o json|yaml|table`) and exit codes. `exec`/`cp` are in test_exec_cp.py (they need runtimes).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from agent_sandbox.cli.main import main
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.invocation import cli_command
from tests.conftest import new_namespace
from tests.helpers import wait_for
from tests.integration.cli.conftest import role_kubeconfig
from tests.integration.sdk.conftest import EXT, apply_pool

pytestmark = pytest.mark.integration


def run(capsys: pytest.CaptureFixture[str], cluster: DevCluster, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--kubeconfig", str(cluster.kubeconfig), "--router-url", "http://127.0.0.1:9"])
    out, err = capsys.readouterr()
    return code, out, err


def test_commands_and_exit_codes(
    cluster: DevCluster, namespace: str, controller: Started, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = ("-n", namespace)
    apply_pool(cluster, namespace, replicas=1)

    code, out, _ = run(
        capsys, cluster, "create", "pool", *ns, "--name", "cli-sb", "--label", "team=cli", "-o", "json"
    )
    assert code == 0
    created = json.loads(out)
    assert (created["claim_name"], created["warm_pool"], created["ready"]) == ("cli-sb", "pool", True)
    assert created["pod_ip"].startswith("127.")
    code, _, err = run(capsys, cluster, "create", "pool", *ns, "--name", "cli-sb")
    assert code == 1
    assert f"SandboxClaim {namespace}/cli-sb already exists (`{cli_command('get cli-sb')}` shows it" in err

    code, out, _ = run(capsys, cluster, "list", *ns, "-o", "json")
    assert code == 0
    assert [i["claim_name"] for i in json.loads(out)] == ["cli-sb"]
    code, out, _ = run(capsys, cluster, "list", *ns, "-l", "team=nobody", "-o", "json")
    assert json.loads(out) == []
    # -A: every namespace (other tests' claims too), with a NAMESPACE column first, as `kubectl get -A`.
    code, out, _ = run(capsys, cluster, "list", "-A", "-l", "team=cli", "-o", "json")
    assert code == 0
    assert any(
        (i["namespace"], i["claim_name"], i["ready"], i["suspended"]) == (namespace, "cli-sb", True, False)
        for i in json.loads(out)
    )
    code, out, _ = run(capsys, cluster, "list", "--all-namespaces")
    assert out.splitlines()[0].split()[:3] == ["NAMESPACE", "CLAIM", "POOL"]
    assert [namespace, "cli-sb", "pool"] in [line.split()[:3] for line in out.splitlines()[1:]]

    # `-o name` is kubectl's: kubectl takes it back, and so do our commands take kubectl's.
    code, out, _ = run(capsys, cluster, "list", *ns, "-o", "name")
    assert (code, out) == (0, "sandboxclaim.extensions.agents.x-k8s.io/cli-sb\n")
    kubectl = [str(cluster.binaries.path("kubectl")), f"--kubeconfig={cluster.kubeconfig}", *ns]
    got = subprocess.run([*kubectl, "get", out.strip(), "-o", "name"], capture_output=True, text=True)
    assert (got.returncode, got.stdout) == (0, out), got.stderr
    assert run(capsys, cluster, "get", got.stdout.strip(), *ns, "-o", "name")[1] == out
    assert run(capsys, cluster, "get", "sandboxclaim/cli-sb", *ns, "-o", "name")[1] == out

    code, out, _ = run(capsys, cluster, "get", "cli-sb", *ns, "-o", "yaml")
    assert code == 0
    assert yaml.safe_load(out)["sandbox_id"] == created["sandbox_id"]
    code, out, _ = run(capsys, cluster, "get", "cli-sb", *ns)
    assert out.splitlines()[0].split()[:3] == ["CLAIM", "POOL", "SANDBOX"]
    assert out.splitlines()[1].split()[:2] == ["cli-sb", "pool"]

    code, out, _ = run(capsys, cluster, "pools", *ns, "-o", "json")
    assert code == 0
    (pool,) = json.loads(out)
    assert (pool["name"], pool["template"], pool["replicas"]) == ("pool", "tmpl", 1)

    code, out, _ = run(capsys, cluster, "suspend", "cli-sb", *ns, "-o", "json")
    assert code == 0
    assert json.loads(out)["suspended"] is True
    code, out, _ = run(capsys, cluster, "resume", "cli-sb", *ns, "-o", "json")
    assert code == 0
    assert json.loads(out)["suspended"] is False
    assert json.loads(out)["ready"] is True

    code, _, err = run(capsys, cluster, "delete", "cli-sb", *ns)
    assert code == 0
    assert "deleted" in err
    code, _, err = run(capsys, cluster, "delete", "cli-sb", *ns)
    assert code == 3
    assert "not found" in err
    assert run(capsys, cluster, "delete", "cli-sb", *ns, "--ignore-not-found")[0] == 0

    code, _, err = run(capsys, cluster, "get", "cli-sb", *ns)
    assert code == 3
    assert err.startswith("error: ")
    code, _, err = run(capsys, cluster, "create", "no-such-pool", *ns, "--timeout", "30")
    assert code == 3
    assert "WarmPoolNotFound" in err or "no-such-pool" in err
    code, _, err = run(capsys, cluster, "create", "pool", *ns, "--label", "no-equals-sign")
    assert code == 2
    assert "KEY=VALUE" in err
    # The API server's "not there" is not found, as the exit codes say (a namespace too: exit 1 until December 6).
    code, _, err = run(capsys, cluster, "create", "pool", "-n", f"{namespace}-none")
    assert code == 3, err
    assert f'namespaces "{namespace}-none" not found' in err


def test_waiting_too_long_exits_4_naming_the_condition(
    cluster: DevCluster, namespace: str, controller: Started, capsys: pytest.CaptureFixture[str]
) -> None:
    apply_pool(cluster, namespace, replicas=0, nodeSelector={"no-such-node-label": "x"})
    code, _, err = run(capsys, cluster, "create", "pool", "-n", namespace, "--timeout", "5")
    assert code == 4
    assert "not Ready within 5 s" in err
    assert "reason" in err


def _cli_as(
    cluster: DevCluster,
    namespace: str,
    account: str,
    rules: list[dict[str, object]],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> Callable[..., tuple[int, str, str]]:
    """A ServiceAccount `account` bound to a Role of `rules`, and a function running the CLI as it (with `-n`):
    (exit code, stdout, stderr)."""
    kubeconfig = role_kubeconfig(cluster, namespace, account, rules, tmp_path)

    def run_as(*argv: str) -> tuple[int, str, str]:
        code = main(
            [*argv, "-n", namespace, "--kubeconfig", str(kubeconfig), "--router-url", "http://127.0.0.1:9"]
        )
        out, err = capsys.readouterr()
        return code, out, err

    return run_as


def test_a_role_that_grants_claims_only_can_create_list_and_get(
    cluster: DevCluster,
    namespace: str,
    controller: Started,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Claims are all the SDK needs to create and use a sandbox, so a role may grant nothing else. `create`
    made the sandbox and then failed to show it (listing every Sandbox of the namespace: 403), so its user
    saw an error for a sandbox that existed; `list` and `get` failed outright. They now show the claim's
    state, say on stderr what is unknown, and `get` reads one claim and one Sandbox instead of listing all."""
    apply_pool(cluster, namespace, replicas=1)
    rule = {
        "apiGroups": ["extensions.agents.x-k8s.io"],
        "resources": ["sandboxclaims"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    }
    as_agent = _cli_as(cluster, namespace, "agent", [rule], capsys, tmp_path)
    unknown = "whether a sandbox is suspended is unknown"
    code, out, err = wait_for(
        lambda: (r := as_agent("create", "pool", "--name", "agent-sb", "-o", "json"))[0] != 1 and r,
        what="the role to apply",
    )
    assert code == 0, err
    created = json.loads(out)
    assert (created["claim_name"], created["ready"], created["suspended"]) == ("agent-sb", True, None)
    assert created["pod_ip"].startswith("127.")
    assert unknown in err

    code, out, err = as_agent("list", "-o", "json")
    assert (code, [i["claim_name"] for i in json.loads(out)]) == (0, ["agent-sb"])
    assert unknown in err
    code, out, err = as_agent("get", "agent-sb")
    assert code == 0
    assert out.splitlines()[1].split()[:4] == ["agent-sb", "pool", created["sandbox_id"], "true"]
    assert unknown in err

    # What needs the Sandbox itself is refused with the API server's reason, not reported as not found.
    code, _, err = as_agent("suspend", "agent-sb")
    assert code == 1
    assert "403" in err
    assert "forbidden" in err
    assert as_agent("get", "no-such-claim")[0] == 3
    # An admin sees the Sandbox's own state and no note.
    code, out, err = run(capsys, cluster, "get", "agent-sb", "-n", namespace, "-o", "json")
    assert (code, json.loads(out)["suspended"], err) == (0, False, "")
    assert as_agent("delete", "agent-sb")[0] == 0


def test_a_role_short_of_one_verb_gets_the_truth(
    cluster: DevCluster,
    namespace: str,
    controller: Started,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Each role lacks one thing; each outcome is said as it is. Until December 6: `create` without `get
    sandboxclaims` exited 1 for a Ready sandbox whose name it never printed; a failed create whose rollback
    was refused (no `delete`) left its claim without a word; `suspend` without `watch sandboxes` read as a
    failure after the Sandbox was suspended, and a refused watch said only `HTTP 403`."""
    apply_pool(cluster, namespace, replicas=1)
    claims = {"apiGroups": ["extensions.agents.x-k8s.io"], "resources": ["sandboxclaims"]}
    sandboxes = {"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"], "verbs": ["get", "list"]}
    no_get = _cli_as(
        cluster, namespace, "no-get", [{**claims, "verbs": ["create", "list", "watch", "delete"]}, sandboxes],
        capsys, tmp_path,
    )  # fmt: skip
    code, out, err = wait_for(
        lambda: (r := no_get("create", "pool", "-o", "json"))[0] != 1 and r, what="the role"
    )
    assert code == 0, err
    created = json.loads(out)  # what the create knows, in the format asked for
    assert (created["claim_name"].startswith("sandbox-claim-"), created["ready"]) == (True, True)
    assert "is Ready; reading it failed" in err

    no_delete = _cli_as(
        cluster, namespace, "no-delete", [{**claims, "verbs": ["create", "get", "list", "watch"]}, sandboxes],
        capsys, tmp_path,
    )  # fmt: skip
    code, _, err = wait_for(
        lambda: (r := no_delete("create", "no-such-pool", "--timeout", "20"))[0] != 1 and r, what="the role"
    )
    assert code == 3, err
    assert "note: SandboxClaim" in err
    assert "was left behind: deleting it failed" in err
    assert 'cannot delete resource "sandboxclaims"' in err

    no_watch = _cli_as(
        cluster, namespace, "no-watch",
        [{**claims, "verbs": ["create", "get", "list", "watch", "delete"]}, {**sandboxes, "verbs": ["get", "patch"]}],
        capsys, tmp_path,
    )  # fmt: skip
    code, out, err = wait_for(
        lambda: (r := no_watch("create", "pool", "--name", "w"))[0] != 1 and r, what="role"
    )
    assert code == 0, err
    code, _, err = no_watch("suspend", "w")
    assert code == 1
    assert "operatingMode is set to Suspended, but watching it take effect was refused" in err
    assert 'cannot watch resource "sandboxes"' in err


def test_the_documented_user_role_does_what_it_says(
    cluster: DevCluster,
    namespace: str,
    controller: Started,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """examples/rbac/sandbox-user.yaml, as docs/sdk/python.md "Permissions" describes it."""
    apply_pool(cluster, namespace, replicas=1)
    example = Path(__file__).resolve().parents[3] / "examples" / "rbac" / "sandbox-user.yaml"
    role = next(d for d in yaml.safe_load_all(example.read_text()) if d["kind"] == "Role")
    as_user = _cli_as(cluster, namespace, "user", role["rules"], capsys, tmp_path)
    code, out, err = wait_for(
        lambda: (r := as_user("create", "pool", "--name", "u", "-o", "json"))[0] != 1 and r, what="the role"
    )
    assert code == 0, err
    assert (json.loads(out)["ready"], err) == (True, "")
    assert as_user("pools")[0] == 0
    for command in ("suspend", "resume"):
        code, _, err = as_user(command, "u", "--timeout", "60")
        assert code == 0, (command, err)
    assert as_user("delete", "u")[0] == 0


def test_delete_by_selector_or_all(
    cluster: DevCluster, namespace: str, controller: Started, capsys: pytest.CaptureFixture[str]
) -> None:
    """`delete -l SELECTOR` and `delete --all`, as kubectl's: what matches now, each by name."""
    admin = cluster.admin()
    for name, team in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        body = {
            "apiVersion": EXT,
            "kind": "SandboxClaim",
            "metadata": {"name": name, "labels": {"team": team}},
            "spec": {"warmPoolRef": {"name": "pool"}},
        }
        status, out = admin.request("POST", f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims", body)
        assert status == 201, out
    ns = ("-n", namespace)

    def names() -> list[str]:
        status, body = admin.request("GET", f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims")
        assert status == 200, body
        return sorted(
            c["metadata"]["name"] for c in body["items"] if not c["metadata"].get("deletionTimestamp")
        )

    code, _, err = run(capsys, cluster, "delete", "-l", "team=a", *ns)
    assert code == 0
    assert sorted(err.splitlines()) == [
        f"sandboxclaim {namespace}/a1 deleted",
        f"sandboxclaim {namespace}/a2 deleted",
    ]
    assert names() == ["b1"]
    for argv in (("b1", "--all"), ("-l", "team=b", "--all"), ("-l", " "), ()):
        code, _, err = run(capsys, cluster, "delete", *argv, *ns)
        assert code == 2, argv
        assert err.startswith("error: "), argv
    assert names() == ["b1"]
    code, _, err = run(capsys, cluster, "delete", "--all", *ns)
    assert (code, err) == (0, f"sandboxclaim {namespace}/b1 deleted\n")
    code, _, err = run(capsys, cluster, "delete", "--all", *ns)
    assert (code, err) == (0, f"No sandbox claims found in {namespace}.\n")


def test_delete_reports_every_claim_when_one_is_refused(
    cluster: DevCluster,
    namespace: str,
    controller: Started,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """`delete --all` stopped at the first claim the API server refused: the claims after it were neither
    deleted nor mentioned. Now each claim's outcome is said (in order), the others deleted, and the exit
    code is 1."""
    admin = cluster.admin()
    claims_path = f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims"
    for name in ("x1", "x2", "x3"):
        body = {"apiVersion": EXT, "kind": "SandboxClaim", "metadata": {"name": name}, "spec": {"warmPoolRef": {"name": "pool"}}}  # fmt: skip
        assert admin.request("POST", claims_path, body)[0] == 201
    group = "extensions.agents.x-k8s.io"
    rules = [
        {"apiGroups": [group], "resources": ["sandboxclaims"], "verbs": ["get", "list"]},
        {"apiGroups": [group], "resources": ["sandboxclaims"], "verbs": ["delete"], "resourceNames": ["x1", "x3"]},
    ]  # fmt: skip
    as_cleaner = _cli_as(cluster, namespace, "cleaner", rules, capsys, tmp_path)
    wait_for(lambda: as_cleaner("list")[0] == 0, what="the role to apply")
    code, _, err = as_cleaner("delete", "--all")
    lines = err.splitlines()
    assert code == 1, err
    assert lines[0] == f"sandboxclaim {namespace}/x1 deleted"
    assert lines[1].startswith(f"error: sandboxclaim {namespace}/x2: "), err
    assert "403" in lines[1] or "forbidden" in lines[1].lower(), err
    assert lines[2:] == [f"sandboxclaim {namespace}/x3 deleted"]
    status, body = admin.request("GET", claims_path)
    assert status == 200, body
    assert sorted(
        c["metadata"]["name"] for c in body["items"] if not c["metadata"].get("deletionTimestamp")
    ) == ["x2"]


def test_pools_say_why_members_are_not_ready(
    cluster: DevCluster,
    namespace: str,
    controller: Started,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """A pool stuck at `0/2` used to say nothing more (a SandboxWarmPool has no conditions): its user had to
    find a member Sandbox and read its conditions. `pools` now names the reason its members are not Ready -
    the scheduler's message for an unschedulable pod, `TemplateNotFound` for a missing template - and leaves
    it out for a role that may not read Sandboxes, rather than failing."""
    apply_pool(cluster, namespace, pool="stuck", replicas=2, nodeSelector={"no-such-node-label": "x"})
    admin = cluster.admin()
    orphan = {
        "apiVersion": EXT,
        "kind": "SandboxWarmPool",
        "metadata": {"name": "orphan"},
        "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "no-such-template"}},
    }
    status, out = admin.request("POST", f"/apis/{EXT}/namespaces/{namespace}/sandboxwarmpools", orphan)
    assert status == 201, out

    def pools() -> dict[str, dict[str, object]] | None:
        code, out, _ = run(capsys, cluster, "pools", "-n", namespace, "-o", "json")
        assert code == 0
        by_name = {p["name"]: p for p in json.loads(out)}
        return by_name if by_name["stuck"]["reason"] == "Unschedulable" else None

    by_name = wait_for(pools, what="the members' reason")
    assert by_name["stuck"]["ready_replicas"] == 0
    assert "node" in str(by_name["stuck"]["message"])  # the scheduler's own words
    assert by_name["orphan"]["reason"] == "TemplateNotFound"
    assert "no-such-template" in str(by_name["orphan"]["message"])
    code, out, _ = run(capsys, cluster, "pools", "-n", namespace)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "TEMPLATE", "READY", "CURRENT", "REASON"]
    assert ["stuck", "tmpl", "0/2", "2", "Unschedulable"] in [r.split() for r in rows]

    rule = {
        "apiGroups": ["extensions.agents.x-k8s.io"],
        "resources": ["sandboxwarmpools"],
        "verbs": ["get", "list"],
    }
    as_viewer = _cli_as(cluster, namespace, "viewer", [rule], capsys, tmp_path)
    _, out, err = wait_for(
        lambda: (r := as_viewer("pools", "-o", "json"))[0] == 0 and r, what="the role to apply"
    )
    assert {p["name"]: p["reason"] for p in json.loads(out)} == {"orphan": None, "stuck": None}
    assert err == ""


def test_pools_of_every_namespace(
    cluster: DevCluster, namespace: str, controller: Started, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pools -A`, as `list -A` and `kubectl get swp -A` (probe fleet11: `-A` was refused, exit 2): a
    NAMESPACE column first; pools of one name in two namespaces are told apart, each judged against the
    templates of its own namespace."""
    other = new_namespace(cluster)
    try:
        apply_pool(cluster, namespace, replicas=0)
        status, out = cluster.admin().request(
            "POST",
            f"/apis/{EXT}/namespaces/{other}/sandboxwarmpools",
            {"apiVersion": EXT, "kind": "SandboxWarmPool", "metadata": {"name": "pool"},
             "spec": {"replicas": 0, "sandboxTemplateRef": {"name": "tmpl"}}},
        )  # fmt: skip
        assert status == 201, out
        code, out, _ = run(capsys, cluster, "pools", "-A", "-o", "json")
        assert code == 0
        mine = {p["namespace"]: p for p in json.loads(out) if p["namespace"] in (namespace, other)}
        assert (mine[namespace]["name"], mine[namespace]["reason"]) == ("pool", None)
        assert (mine[other]["name"], mine[other]["reason"]) == ("pool", "TemplateNotFound")
        assert mine[other]["message"] == f"SandboxTemplate {other}/tmpl not found"
        code, out, _ = run(capsys, cluster, "pools", "--all-namespaces")
        assert code == 0
        header, *rows = out.splitlines()
        assert header.split()[:3] == ["NAMESPACE", "NAME", "TEMPLATE"]
        assert [namespace, "pool", "tmpl", "0/0"] in [r.split()[:4] for r in rows]
        assert [other, "pool", "tmpl", "0/0", "0", "TemplateNotFound"] in [r.split() for r in rows]
    finally:
        cluster.admin().request("DELETE", f"/api/v1/namespaces/{other}")


def test_the_kubeconfig_contexts_namespace_and_flags_before_the_command_work_as_in_kubectl(
    cluster: DevCluster,
    namespace: str,
    controller: Started,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    """`kubectl config set-context --current --namespace=team-a` then `agent-sandbox pools` listed `default`
    (-n defaulted to it), and `agent-sandbox -n team-a list` was a usage error; kubectl takes both. A pool in
    another namespace is not listed (when `pools -A` came, `pools` without `-n` listed every namespace: it read
    the namespace before the context's was filled in)."""
    apply_pool(cluster, namespace, replicas=1)
    other = new_namespace(cluster)
    request.addfinalizer(lambda: cluster.admin().request("DELETE", f"/api/v1/namespaces/{other}"))
    status, body = cluster.admin().request(
        "POST",
        f"/apis/{EXT}/namespaces/{other}/sandboxwarmpools",
        {"apiVersion": EXT, "kind": "SandboxWarmPool", "metadata": {"name": "elsewhere"},
         "spec": {"replicas": 0, "sandboxTemplateRef": {"name": "tmpl"}}},
    )  # fmt: skip
    assert status == 201, body
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    doc["contexts"][0]["context"]["namespace"] = namespace
    kubeconfig = tmp_path / "team.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(doc))
    router = ("--router-url", "http://127.0.0.1:9")

    def cli(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    for argv in (
        ["pools", "--kubeconfig", str(kubeconfig), *router, "-o", "json"],
        ["--kubeconfig", str(kubeconfig), *router, "pools", "-o", "json"],
        ["-n", namespace, "--kubeconfig", str(cluster.kubeconfig), *router, "pools", "-o", "json"],
    ):
        code, out, err = cli(*argv)
        assert code == 0, err
        assert [p["name"] for p in json.loads(out)] == ["pool"], argv
    # after the command wins, as the last of kubectl's repeated flags does; an empty namespace says which
    code, out, err = cli("-n", namespace, "--kubeconfig", str(kubeconfig), *router, "pools", "-n", "default")
    assert (code, out, err) == (0, "", "No resources found in default namespace.\n")
    code, out, err = cli("--kubeconfig", str(kubeconfig), *router, "list")
    assert (code, out, err) == (0, "", f"No resources found in {namespace} namespace.\n")
    # `lifecycle` (the controller's own kubeconfig loader) takes the context's namespace too
    code, _, err = cli("--kubeconfig", str(kubeconfig), "lifecycle", "suspend", "nosuch")
    assert (code, err) == (3, f"error: no Sandbox named {namespace}/nosuch\n")
    # --context picks another context of the file (here the current one points nowhere), before or after
    doc["clusters"].append({"name": "elsewhere", "cluster": {"server": "https://127.0.0.1:9"}})
    team = doc["contexts"][0]
    doc["contexts"].append(
        {"name": "elsewhere", "context": {"cluster": "elsewhere", "user": team["context"]["user"]}}
    )
    doc["current-context"] = "elsewhere"
    kubeconfig.write_text(yaml.safe_dump(doc))
    for argv in (
        ["--context", team["name"], "pools", "--kubeconfig", str(kubeconfig), *router, "-o", "name"],
        ["pools", "--context", team["name"], "--kubeconfig", str(kubeconfig), *router, "-o", "name"],
    ):
        assert cli(*argv)[:2] == (0, "sandboxwarmpool.extensions.agents.x-k8s.io/pool\n"), argv
    code, out, err = cli("pools", "--kubeconfig", str(kubeconfig), *router)
    assert code == 1
    assert "GET https://127.0.0.1:9/apis/" in err  # which of the clusters did not answer
    code, _, err = cli(
        "--context", team["name"], "--kubeconfig", str(kubeconfig), "lifecycle", "suspend", "x"
    )
    assert (code, err) == (3, f"error: no Sandbox named {namespace}/x\n")
    # a connection flag before a command that has no use for it is an error, not ignored
    with pytest.raises(SystemExit) as usage:
        main(["-n", namespace, "dev", "status"])
    assert usage.value.code == 2
    assert (
        "-n/--namespace applies to the sandbox commands (list, exec, ...), not to dev"
        in capsys.readouterr().err
    )
