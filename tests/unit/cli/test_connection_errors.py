"""What the CLI says when it cannot reach the cluster: one `error:` line and the module docstring's exit codes
(cli/sandboxes.py: 1 an error from the cluster, router or sandbox; 2 invalid usage or input; 3 not found).

Until December 6 the `lifecycle` commands printed a traceback for a missing or wrong kubeconfig (and
`error: RuntimeError: ...` for an unknown --dev-cluster), and an API server that could not be reached was
reported by `exec`, `cp`, `suspend`, `resume` and `logs` as "not found" (exit 3), where `get` said 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_sandbox.cli.exit_codes import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_USAGE, _guard
from agent_sandbox.cli.main import main
from agent_sandbox.invocation import cli_command
from agent_sandbox_sdk import (
    SandboxConnectionError,
    SandboxDeletedError,
    SandboxNotFoundError,
    SandboxRequestError,
)

pytestmark = pytest.mark.unit

#: A kubeconfig whose API server refuses connections (nothing listens on port 1).
UNREACHABLE = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: u
  user: {token: abc}
contexts:
- name: ctx
  context: {cluster: c, user: u, namespace: ns1}
current-context: ctx
"""


@pytest.fixture
def no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No $KUBECONFIG, no ~/.kube/config, not in a cluster, no dev clusters."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AGENT_SANDBOX_CACHE", str(tmp_path / "cache"))


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("command", ["suspend", "resume", "hibernate"])
@pytest.mark.usefixtures("no_kubeconfig")
def test_lifecycle_without_any_kubeconfig_is_one_line(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lifecycle", command, "x"]) == EXIT_USAGE
    line = _one_error_line(capsys.readouterr().err)
    assert "no Kubernetes configuration" in line


@pytest.mark.usefixtures("no_kubeconfig")
def test_lifecycle_with_a_missing_kubeconfig_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nonexist"
    assert main(["--kubeconfig", str(missing), "lifecycle", "suspend", "x"]) == EXIT_USAGE
    assert str(missing) in _one_error_line(capsys.readouterr().err)
    # as the sandbox commands say it (exit 2 there too)
    assert main(["--kubeconfig", str(missing), "list"]) == EXIT_USAGE
    assert str(missing) in _one_error_line(capsys.readouterr().err)


@pytest.mark.usefixtures("no_kubeconfig")
def test_lifecycle_with_an_unknown_context_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE)
    assert (
        main(["--kubeconfig", str(kubeconfig), "--context", "nope", "lifecycle", "resume", "x"]) == EXIT_USAGE
    )
    assert "Context 'nope' not found" in _one_error_line(capsys.readouterr().err)


@pytest.mark.usefixtures("no_kubeconfig")
def test_lifecycle_with_an_unknown_dev_cluster_says_it_as_the_sandbox_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--dev-cluster", "nope", "list"]) == EXIT_USAGE
    said = _one_error_line(capsys.readouterr().err)
    assert main(["--dev-cluster", "nope", "lifecycle", "resume", "x"]) == EXIT_USAGE
    line = _one_error_line(capsys.readouterr().err)
    assert (
        line
        == said
        == f"error: no dev cluster named 'nope'; start one with `{cli_command('dev up --name nope')}`"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["exec", "x", "--", "true"],
        ["exec", "x", "-o", "json", "--", "true"],
        ["cp", "x:a.txt", "-"],
        ["suspend", "x"],
        ["resume", "x"],
        ["logs", "x"],
        ["get", "x"],
        ["delete", "x"],
        ["lifecycle", "suspend", "x"],
    ],
    ids=lambda argv: " ".join(argv[:3]),
)
@pytest.mark.usefixtures("no_kubeconfig")
def test_an_unreachable_api_server_is_an_error_not_a_missing_sandbox(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE)
    assert main(["--kubeconfig", str(kubeconfig), *argv]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "127.0.0.1:1" in err, err
    assert "Connection refused" in err or "Connect call failed" in err, err


def _raising(err: BaseException) -> int:
    def handler(_args: object) -> int:
        raise err

    return _guard(handler)(None)  # type: ignore[arg-type]


def _not_found(cause: BaseException | None) -> SandboxNotFoundError:
    err = SandboxNotFoundError("SandboxClaim ns/x: ...")
    err.__cause__ = cause
    return err


@pytest.mark.parametrize(
    ("cause", "code"),
    [
        (None, EXIT_NOT_FOUND),  # said by the SDK itself (a claim that does not exist, one being deleted)
        (SandboxRequestError("404", 404), EXIT_NOT_FOUND),
        (SandboxConnectionError("no response (ConnectError)"), EXIT_ERROR),  # no status: never reached
        (SandboxRequestError("forbidden", 403), EXIT_ERROR),
        (SandboxRequestError("unavailable", 503), EXIT_ERROR),
    ],
    ids=["none", "404", "transport", "403", "503"],
)
def test_not_found_only_when_something_answered_that_it_is_not_there(
    cause: BaseException | None, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _raising(_not_found(cause)) == code
    _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("status", [502, None])
def test_a_sandbox_deleted_under_a_call_is_not_found(
    status: int | None, capsys: pytest.CaptureFixture[str]
) -> None:
    # `exec`/`cp` on a sandbox whose Sandbox is gone (the SDK read it: "... no longer exists"): exit 3, as the
    # exit codes say of "something answered that it is not there" - exit 1 until December 7, when it was a
    # plain `SandboxRequestError` with the router's 502 (or no status).
    err = SandboxDeletedError("POST ...: HTTP 502 - the Sandbox ns/x no longer exists", status)
    err.request_sent = status is not None
    assert _raising(err) == EXIT_NOT_FOUND
    assert "no longer exists" in _one_error_line(capsys.readouterr().err)


class _Answer:
    """An HTTP answer as the SDK keeps it on a `SandboxRequestError` (`.response`)."""

    def __init__(self, status: int, body: object) -> None:
        self.status_code, self.body = status, body

    def json(self) -> object:
        if isinstance(self.body, str):
            raise ValueError("not JSON")
        return self.body


@pytest.mark.parametrize(
    ("response", "code"),
    [
        # The API server: that object (a namespace, a pod) is not there.
        (_Answer(404, {"kind": "Status", "reason": "NotFound", "code": 404}), EXIT_NOT_FOUND),
        (_Answer(404, "404 page not found"), EXIT_ERROR),  # an API the server does not serve (no CRDs)
        (_Answer(404, {"error": "no route"}), EXIT_ERROR),  # a router's or runtime's own 404
        (_Answer(403, {"kind": "Status", "reason": "Forbidden", "code": 403}), EXIT_ERROR),
        (None, EXIT_ERROR),
    ],
    ids=["object", "api-not-served", "router", "forbidden", "no-response"],
)
def test_an_object_the_api_server_says_is_not_there_is_not_found(
    response: _Answer | None, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """`create -n nons` (`namespaces "nons" not found`) and `logs` of a claim whose pod is gone exited 1 where
    the module docstring and docs/sdk/python.md say 3: something answered that it is not there."""
    status = response.status_code if response is not None else 404
    err = SandboxRequestError(f"Kubernetes API ...: HTTP {status}: ...", status, response)
    assert _raising(err) == code
    _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    "err",
    [
        FileExistsError(17, "File exists", "out/d2/b"),  # a local file where the copied tree has a directory
        PermissionError(13, "Permission denied", "secret.txt"),  # a local file the user cannot read
        OSError(28, "No space left on device"),
    ],
    ids=["exists", "permission", "no-space"],
)
def test_a_local_file_system_error_is_one_line_and_exit_1(
    err: OSError, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cp` writing or reading local files: until December 7 these ended the CLI with a traceback."""
    assert _raising(err) == EXIT_ERROR
    line = capsys.readouterr().err
    _one_error_line(line)
    assert err.strerror is not None
    assert err.strerror in line


def test_a_closed_stdout_is_left_to_the_entry_point() -> None:
    """`| head` closing the pipe is not a file-system error: the entry point makes it exit 141 (SIGPIPE)."""
    with pytest.raises(BrokenPipeError):
        _raising(BrokenPipeError(32, "Broken pipe"))
