"""`agent-sandbox create|list|get|pools|suspend|resume|delete` against the real control plane + controller:
output shapes (`-o json|yaml|table`) and exit codes. `exec`/`cp` are in test_exec_cp.py (they need runtimes).
"""

from __future__ import annotations

import json

import pytest
import yaml

from agent_sandbox.cli.main import main
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from tests.integration.sdk.conftest import apply_pool

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

    code, out, _ = run(capsys, cluster, "list", *ns, "-o", "json")
    assert code == 0
    assert [i["claim_name"] for i in json.loads(out)] == ["cli-sb"]
    code, out, _ = run(capsys, cluster, "list", *ns, "-l", "team=nobody", "-o", "json")
    assert json.loads(out) == []

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


def test_waiting_too_long_exits_4_naming_the_condition(
    cluster: DevCluster, namespace: str, controller: Started, capsys: pytest.CaptureFixture[str]
) -> None:
    apply_pool(cluster, namespace, replicas=0, nodeSelector={"no-such-node-label": "x"})
    code, _, err = run(capsys, cluster, "create", "pool", "-n", namespace, "--timeout", "5")
    assert code == 4
    assert "not Ready within 5 s" in err
    assert "reason" in err
