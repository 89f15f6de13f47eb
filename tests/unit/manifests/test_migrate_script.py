"""`helm/files/migrate.sh --phase=bootstrap` before an upgrade: the API server serves only v1alpha1.

That is an upstream v0.4.x cluster, which the local control plane cannot be (our controller needs v1beta1),
so the script's decision logic runs here against a stub kubectl that answers from a fixed list of
v1alpha1 claims and records what would be written. The v1beta1 path and every write against a real API
server: tests/integration/controllers/claim/test_migration_bootstrap.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_sandbox.manifests import REPO_ROOT

pytestmark = pytest.mark.unit

SCRIPT = REPO_ROOT / "helm" / "files" / "migrate.sh"

STUB = r"""
import json, sys
state = json.load(open(sys.argv[1]))
args = [a for a in sys.argv[2:] if not a.startswith("--kubeconfig=")]
log = open(state["log"], "a")
log.write(json.dumps(args) + "\n")
if args[0] == "api-versions":
    print("\n".join(state["versions"]))
elif args[0] == "get" and args[1].startswith("sandboxclaims."):
    for c in state["claims"]:
        print("|".join(c))  # the script's jsonpath separator
elif args[0] == "get" and args[1].startswith("sandboxwarmpools.") and args[3].startswith("-"):
    print("\n".join(state["pools"]))
elif args[0] == "get" and args[1].startswith("sandboxwarmpools."):
    name = args[3]
    ns = args[2].split("=", 1)[1]
    if f"{ns}/{name}" in state["pools"]:
        print(state["pools"][f"{ns}/{name}"])
elif args[0] == "get" and args[1].startswith("sandboxtemplates."):
    print("sandboxtemplate/" + args[3])
elif args[0] == "create":
    log.write("CREATE " + json.dumps(sys.stdin.read()) + "\n")
    print("created")
else:
    sys.exit("unexpected: " + " ".join(args))
"""


def run(
    tmp_path: Path, claims: list[list[str]], pools: dict[str, str], *args: str, rc: int = 0
) -> tuple[str, list[str]]:
    state = tmp_path / "state.json"
    log = tmp_path / "calls.log"
    log.write_text("")
    state.write_text(
        json.dumps(
            {
                "versions": ["agents.x-k8s.io/v1alpha1", "extensions.agents.x-k8s.io/v1alpha1"],
                "claims": claims,
                "pools": pools,
                "log": str(log),
            }
        )
    )
    stub = tmp_path / "kubectl"
    stub.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "stub.py"} {state} "$@"\n')
    stub.chmod(0o755)
    (tmp_path / "stub.py").write_text(STUB)
    out = subprocess.run(
        ["bash", str(SCRIPT), "--phase=bootstrap", f"--kubectl={stub}", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == rc, out.stdout + out.stderr
    return out.stdout + out.stderr, log.read_text().splitlines()


def test_v1alpha1_cold_start_claims_get_one_shadow_pool_per_namespace_and_template(tmp_path: Path) -> None:
    claims = [
        # namespace, name, template, warmpool, assignment record (annotation)
        ["a", "cold", "py", "", ""],
        ["a", "cold-default", "py", "default", ""],
        ["a", "cold-none", "py", "none", "cold-none"],  # a cold Sandbox is named like its claim
        ["a", "warm", "py", "default", "py-pool-x7k2q"],  # warm-started: its pool exists
        ["a", "specific", "py", "mine", ""],  # names its pool: no shadow
        ["b", "other-ns", "py", "", ""],
        ["b", "other-template", "go", "none", ""],
    ]
    text, calls = run(tmp_path, claims, {"a/mine": "sandboxwarmpool/mine"})
    creates = [json.loads(line.removeprefix("CREATE ")) for line in calls if line.startswith("CREATE ")]
    made = sorted(
        (doc.split('namespace: "')[1].split('"')[0], doc.split('name: "')[1].split('"')[0]) for doc in creates
    )
    assert made == [("a", "shadow-pool-py"), ("b", "shadow-pool-go"), ("b", "shadow-pool-py")]
    assert all("apiVersion: extensions.agents.x-k8s.io/v1alpha1" in doc for doc in creates)
    assert all(
        "  replicas: 0" in doc and 'agents.x-k8s.io/migration-shadow: "true"' in doc for doc in creates
    )
    assert (
        'agents.x-k8s.io/migration-source-template: "go"'
        in creates[[m[1] for m in made].index("shadow-pool-go")]
    )
    assert "created=3 exists=0" in text
    assert "warm-started" in text


def test_a_missing_specific_pool_is_reported_not_created(tmp_path: Path) -> None:
    text, calls = run(tmp_path, [["a", "specific", "py", "gone", ""]], {})
    assert not [line for line in calls if line.startswith("CREATE ")]
    assert 'names SandboxWarmPool "gone", which does not exist' in text


def test_an_existing_shadow_or_foreign_pool_is_left_alone(tmp_path: Path) -> None:
    pools = {"a/shadow-pool-py": "true:found", "a/shadow-pool-go": "<no value>:found"}
    text, calls = run(tmp_path, [["a", "x", "py", "", ""], ["a", "y", "go", "", ""]], pools)
    assert not [line for line in calls if line.startswith("CREATE ")]
    assert "created=0 exists=1 not-a-shadow=1 errors=0" in text


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    text, calls = run(tmp_path, [["a", "x", "py", "", ""]], {}, "--dry-run")
    assert not [line for line in calls if line.startswith("CREATE ") or '"create"' in line]
    assert "would create=1" in text


def test_empty_fields_keep_their_place(tmp_path: Path) -> None:
    """An empty `warmpool` with a bound Sandbox is a warm start (not a claim on a pool named like the Sandbox),
    and a claim naming no template is an error: with tab-separated fields bash's `read` folded the empty ones."""
    text, calls = run(tmp_path, [["a", "x", "py", "", "py-pool-abcde"]], {})
    assert "warm-started" in text
    assert "does not exist" not in text
    assert not [line for line in calls if line.startswith("CREATE ")]
    text, _ = run(tmp_path, [["a", "y", "", "", ""]], {}, rc=1)
    assert "names no template" in text


def test_an_empty_namespace_is_a_usage_error(tmp_path: Path) -> None:
    out = subprocess.run(
        ["bash", str(SCRIPT), "--phase=bootstrap", "--namespace="],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--all-namespaces" in out.stderr


def test_a_warm_start_is_read_from_the_assignment_record_as_the_conversion_reads_it(tmp_path: Path) -> None:
    """Rule (b) reads the claim's assignment record (annotation, else the legacy label), not status.sandbox.name
    (docs/design/api-quirks.md): a claim whose record is empty converts to its shadow pool, so bootstrap must
    create that pool (it decided from status.sandbox.name until December 6)."""
    claims = [
        # namespace, name, template, warmpool, record annotation, record label
        ["a", "by-annotation", "py", "", "py-pool-x7k2q", ""],
        ["a", "by-label", "go", "default", "", "go-pool-abcde"],
        ["a", "no-record", "rb", "", "", ""],
    ]
    text, calls = run(tmp_path, claims, {})
    creates = [json.loads(line.removeprefix("CREATE ")) for line in calls if line.startswith("CREATE ")]
    assert [doc.split('name: "')[1].split('"')[0] for doc in creates] == ["shadow-pool-rb"]
    assert text.count("warm-started") == 2
    (listing,) = [json.loads(line) for line in calls if line.startswith("[") and "sandboxclaims." in line]
    jsonpath = next(arg for arg in listing if "{range" in arg)
    assert r".metadata.annotations.agents\.x-k8s\.io/sandbox-name" in jsonpath
    assert r".metadata.labels.agents\.x-k8s\.io/sandbox-name" in jsonpath
    assert ".status." not in jsonpath
