"""CLI rendering and argument parsing of the sandbox commands (no cluster)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from agent_sandbox.cli.claim_commands import SANDBOX_COLUMNS
from agent_sandbox.cli.copy import split_remote
from agent_sandbox.cli.main import build_parser
from agent_sandbox.cli.option_values import _pairs
from agent_sandbox.cli.output import age, progress, render
from agent_sandbox_sdk import SandboxInfo

pytestmark = pytest.mark.unit

INFO = SandboxInfo(
    claim_name="c1", namespace="ns", warm_pool="pool", sandbox_id="c1", ready=True, pod_ip="127.10.0.4",
    created=datetime(2026, 1, 1, tzinfo=UTC),
)  # fmt: skip


def test_table_aligns_columns_and_marks_empty_cells() -> None:
    out = io.StringIO()
    render([INFO, INFO.model_copy(update={"claim_name": "longer-claim", "pod_ip": None})], "table",
           columns=SANDBOX_COLUMNS, out=out)  # fmt: skip
    lines = out.getvalue().splitlines()
    assert lines[0].split() == [
        "CLAIM",
        "POOL",
        "SANDBOX",
        "READY",
        "REASON",
        "POD",
        "IP",
        "SUSPENDED",
        "AGE",
    ]
    assert lines[1].split()[:3] == ["c1", "pool", "c1"]
    assert lines[1].index("pool") == lines[0].index("POOL")
    assert "127.10.0.4" in lines[1]
    assert lines[2].split()[5] == "-"
    render([], "table", columns=SANDBOX_COLUMNS, out=(table := io.StringIO()), err=(note := io.StringIO()))
    assert (table.getvalue(), note.getvalue()) == ("", "No resources found.\n")
    render([], "table", columns=SANDBOX_COLUMNS, namespace="team-a", out=table, err=(note := io.StringIO()))
    assert (table.getvalue(), note.getvalue()) == ("", "No resources found in team-a namespace.\n")


def test_json_and_yaml_keep_model_field_names() -> None:
    out = io.StringIO()
    render([INFO], "json", out=out)
    assert json.loads(out.getvalue())[0]["claim_name"] == "c1"
    out = io.StringIO()
    render(INFO, "yaml", out=out)
    assert yaml.safe_load(out.getvalue())["pod_ip"] == "127.10.0.4"


def test_age_is_kubectl_style() -> None:
    now = datetime(2026, 1, 2, tzinfo=UTC)
    assert age(now - timedelta(seconds=5), now) == "5s"
    assert age(now - timedelta(minutes=3), now) == "3m"
    assert age(now - timedelta(hours=5), now) == "5h"
    assert age(now - timedelta(days=2), now) == "2d"
    assert age(None) == "-"


def test_progress_is_silent_when_not_a_terminal() -> None:
    stream = io.StringIO()
    with progress("waiting", stream=stream):
        pass
    assert stream.getvalue() == ""


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [("sb:dir/a.txt", ("sb", "dir/a.txt")), ("sb:", ("sb", "")), ("./local:x", None), ("local.txt", None),
     ("/abs/path", None), ("sandboxclaim/sb:a.txt", ("sb", "a.txt")),
     ("sandboxclaim.extensions.agents.x-k8s.io/sb:/etc/x", ("sb", "/etc/x")), ("dir/sb:a.txt", None)],
)  # fmt: skip
def test_remote_paths(spec: str, parsed: tuple[str, str] | None) -> None:
    assert split_remote(spec) == parsed


def test_key_value_pairs() -> None:
    assert _pairs(["A=1", "B=x=y", "C="], "--env") == [("A", "1"), ("B", "x=y"), ("C", "")]
    with pytest.raises(ValueError, match="--env 'A': expected KEY=VALUE"):
        _pairs(["A"], "--env")


def test_parser_accepts_the_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(["exec", "-n", "demo", "sb", "--", "ls", "-la"])
    assert (args.claim, args.namespace, args.argv) == ("sb", "demo", ["ls", "-la"])
    args = parser.parse_args(["exec", "sb", "-n", "demo", "--timeout", "5", "--", "ls", "-la"])
    assert args.argv == ["-n", "demo", "--timeout", "5", "--", "ls", "-la"]  # _exec re-parses the options
    args = parser.parse_args(["create", "--template", "tmpl", "-o", "json"])
    assert (args.template, args.pool, args.output) == ("tmpl", None, "json")
    with pytest.raises(SystemExit):
        parser.parse_args(["create", "pool", "--template", "t"])
    with pytest.raises(SystemExit):
        parser.parse_args(["list", "-o", "xml"])


@pytest.mark.parametrize(
    "argv",
    [["cp", "a", "sb:b"], ["delete", "sb"], ["proxy", "sb", "8888"], ["logs", "sb"]],
    ids=["cp", "delete", "proxy", "logs"],
)
def test_commands_that_print_text_refuse_structured_output(argv: list[str]) -> None:
    """Until December 6 `-o json` was accepted and ignored: `jq` got empty or non-JSON input."""
    parser = build_parser()
    assert parser.parse_args(argv).output == "table"
    with pytest.raises(SystemExit):
        parser.parse_args([*argv, "-o", "json"])


def test_name_output_is_kubectls_and_is_accepted_back() -> None:
    """`-o name` prints `resource.group/name` lines (what `kubectl get -o name` prints, so kubectl and xargs
    take them), and every command that takes a claim takes that form back; a command that prints no objects
    refuses it, and another kind's `TYPE/NAME` is a usage error naming the argument."""
    out = io.StringIO()
    render(
        [INFO, INFO.model_copy(update={"claim_name": "c2"})],
        "name",
        name=lambda i: f"x.y/{i.claim_name}",
        out=out,
    )
    assert out.getvalue() == "x.y/c1\nx.y/c2\n"
    with pytest.raises(ValueError, match="-o name"):
        render(INFO, "name")
    parser = build_parser()
    for form in ("c1", "sandboxclaim/c1", "sandboxclaims/c1", "sandboxclaim.extensions.agents.x-k8s.io/c1"):
        assert parser.parse_args(["get", form]).claim == "c1"
        assert parser.parse_args(["delete", form, "x"]).claims == ["c1", "x"]
    assert parser.parse_args(["list", "-o", "name"]).output == "name"
    with pytest.raises(SystemExit):
        parser.parse_args(["exec", "-o", "name", "c1", "--", "true"])
    with pytest.raises(SystemExit):
        parser.parse_args(["get", "pod/c1"])
