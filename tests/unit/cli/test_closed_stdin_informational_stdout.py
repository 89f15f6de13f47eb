"""A closed standard input is an empty one (`cp -` and `exec -i` with `<&-`); a closed standard output is fatal
only where the output is the result (the URL `proxy` prints, and the progress lines of `demo` and `release`,
are not); `cp - CLAIM:DIR` onto a directory is exit 2; every `--timeout` over 30 days is a usage error.
Reviewer's findings on the December 7 fixes (commit 4f0bf5e)."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers import signals_as_from_a_shell

pytestmark = pytest.mark.unit


def _run(script: str, redirect: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`script` (Python, argv after it) under bash with `redirect` (`<&-`, `>&-`, ...)."""
    line = f'"$0" -c "$1" {" ".join(argv)} {redirect}'
    return subprocess.run(
        ["bash", "-c", line, sys.executable, textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        preexec_fn=signals_as_from_a_shell,
    )


#: `cp - c1:x`: the upload reads what it is given; says what fd 0 is while it does.
_CP_STDIN = """
import os, sys
from types import SimpleNamespace
from agent_sandbox.cli import sandboxes
from agent_sandbox.cli.main import main

class Files:
    def write(self, path, data, **kw):
        sys.stderr.write(f"fd0={os.readlink('/proc/self/fd/0')} read={data.read()!r}\\n")

client = SimpleNamespace(get_sandbox=lambda claim, namespace: SimpleNamespace(files=Files()))
sandboxes.make_client = lambda *a, **k: client
sys.exit(main(sys.argv[1:]))
"""


def test_cp_from_a_closed_stdin_uploads_an_empty_file() -> None:
    """`cp - c1:x <&-` was an AttributeError traceback (`sys.stdin` is None)."""
    done = _run(_CP_STDIN, "<&-", "cp", "-", "c1:x", "-n", "demo")
    assert (done.returncode, done.stderr) == (0, "fd0=/dev/null read=b''\n- -> c1:x (0 bytes)\n")


#: `exec -i c1 -- cat`: the command ends (exit 0) once its stdin is closed; exit 99 if it never is.
_EXEC_STDIN = """
import sys, threading
from types import SimpleNamespace
from agent_sandbox.cli import exec_command
from agent_sandbox.cli.main import main
from agent_sandbox_sdk.models import CommandEvent

closed = threading.Event()

class Stream:
    def wait_started(self): pass
    def close_stdin(self): closed.set()
    def send_stdin(self, data): raise AssertionError(data)
    def __enter__(self): return self
    def __exit__(self, *a): pass
    def __iter__(self):
        yield CommandEvent(type="exit", exit_code=0 if closed.wait(10) else 99)

exec_command.make_client = lambda *a, **k: None
exec_command._handle = lambda *a: SimpleNamespace(commands=SimpleNamespace(stream=lambda command, **kw: Stream()))
sys.exit(main(sys.argv[1:]))
"""


def test_exec_with_stdin_from_a_closed_stdin_ends_the_commands_input() -> None:
    """`exec -i c1 -- cat <&-`: the stdin thread died with an AttributeError and the command never got the end
    of its input (a hang)."""
    done = _run(_EXEC_STDIN, "<&-", "exec", "-i", "c1", "-n", "demo", "--", "cat")
    assert (done.returncode, done.stderr) == (0, "")


#: `proxy c1 8080`: stopped by a SIGINT (Ctrl-C) after 2 s.
_PROXY = """
import os, signal, sys, threading
from types import SimpleNamespace
from agent_sandbox.cli import sandboxes
from agent_sandbox.cli.main import main
from agent_sandbox_sdk.models import SandboxInfo

info = SandboxInfo(claim_name="c1", namespace="demo", ready=True, suspended=False, sandbox_id="sb-1")
sandboxes.make_client = lambda *a, **k: SimpleNamespace(get_sandbox_info=lambda *a: info)
ctrl_c = threading.Timer(2, lambda: os.kill(os.getpid(), signal.SIGINT))
ctrl_c.daemon = True
ctrl_c.start()
sys.exit(main(["proxy", "c1", "8080", "-n", "demo", "--router-url", "http://127.0.0.1:9"]))
"""


def test_proxy_with_a_closed_stdout_serves_until_ctrl_c() -> None:
    """`proxy ... >&- &` exited 1 right after listening (its URL line could not be written); the URL is
    information, so it goes to stderr instead, and the proxy serves until Ctrl-C (130)."""
    done = _run(_PROXY, ">&-")
    assert done.returncode == 130, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("http://127.0.0.1:")
    assert lines[1].startswith("forwarding to port 8080")


#: `proxy`, with SIGINT blocked in the main thread once the Ctrl-C thread exists: the signal is taken by that
#: thread, as kill(2) may give a process-directed signal to any thread.
_PROXY_SIGNAL_ELSEWHERE = _PROXY.replace(
    "ctrl_c.start()\n", "ctrl_c.start()\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
)


def test_proxy_stops_on_a_ctrl_c_another_thread_took() -> None:
    """A fresh-clone CI run saw `proxy` ignore Ctrl-C for 60 s: a SIGINT taken by a thread other than the main
    one does not wake the event loop out of epoll, and Python runs the handler only in the main thread - the
    proxy waited on an event that never came. It now wakes every second."""
    done = _run(_PROXY_SIGNAL_ELSEWHERE, ">&-", timeout=20)
    assert done.returncode == 130, done.stderr


#: `demo` with the cluster, controller, router, pool and SDK journey stood in for.
_DEMO = """
import sys
from types import SimpleNamespace
from agent_sandbox.cli import demo
from agent_sandbox.cli.main import main

cluster = SimpleNamespace(state=SimpleNamespace(nodes=[1], pod_cidr="10.0.0.0/16"), kubeconfig="/k")
demo.ensure_cluster = lambda name: cluster
demo.ensure_controller = demo.ensure_router = demo.ensure_pool = lambda cluster: "ok"
demo.sdk_journey = lambda cluster, router: None
sys.exit(main(["demo"]))
"""

#: `release`: `--check`, or the assets rendered without kubectl.
_RELEASE = """
import sys
from types import SimpleNamespace
from agent_sandbox.cli import release

release.check_drift = lambda k8s: None
release.ensure_binaries = lambda: SimpleNamespace(path=lambda name: "kubectl")
release.render_assets = lambda k8s, **kw: SimpleNamespace(files={"install.yaml": "x"})
from agent_sandbox.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("script", "argv"),
    [(_DEMO, []), (_RELEASE, ["release", "--check"]), (_RELEASE, ["release", "--tag", "v1", "--out", "OUT"])],
    ids=["demo", "release-check", "release"],
)
def test_progress_lines_are_dropped_with_a_closed_stdout(script: str, argv: list[str], tmp_path: Any) -> None:
    """`demo >&-` and `release >&-` stopped at their first progress line (exit 1)."""
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    done = _run(script, ">&-", *argv)
    assert (done.returncode, done.stderr) == (0, "")
    if "--out" in argv:
        assert (tmp_path / "out" / "install.yaml").read_text() == "x"


def test_cp_from_stdin_onto_a_directory_in_the_sandbox_says_so_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`echo hi | cp - c1:dd` with a directory dd printed the runtime's raw `POST ...: HTTP 400: ...`, exit 1."""
    from agent_sandbox.cli import sandboxes
    from agent_sandbox.cli.main import main
    from agent_sandbox_sdk import SandboxRequestError

    class Files:
        def write(self, path: str, data: Any, **kw: object) -> None:
            data.read()
            raise SandboxRequestError(
                "POST http://router.test/upload: HTTP 400: File upload failed: target path is a directory",
                400,
            )

    client = SimpleNamespace(get_sandbox=lambda claim, namespace: SimpleNamespace(files=Files()))
    monkeypatch.setattr(sandboxes, "make_client", lambda *a, **k: client)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hi\n")))
    assert main(["cp", "-", "c1:dd", "-n", "demo"]) == 2
    assert capsys.readouterr().err == "error: c1:dd: is a directory\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["create", "pool", "-n", "demo"],
        ["exec", "c1", "-n", "demo", "--timeout", "1e10", "--", "true"],
        ["cp", "f", "c1:f", "-n", "demo"],
        ["suspend", "c1", "-n", "demo"],
        ["resume", "c1", "-n", "demo"],
        ["lifecycle", "resume", "sb", "-n", "demo"],
    ],
    ids=["create", "exec", "cp", "suspend", "resume", "lifecycle-resume"],
)
def test_every_timeout_over_30_days_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--timeout 1e10` was accepted on the command line by `exec`, `cp` and `lifecycle resume` (which then
    failed later); as docs/sdk/python.md says, it is refused as bad usage (exit 2) before anything is sent."""
    from agent_sandbox.cli.main import main

    if "--timeout" not in argv:
        argv = [*argv, "--timeout", "1e10"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert (
        "argument --timeout: must be a positive number of seconds up to 2592000 (30 days), got '1e10'" in err
    )


def test_a_timeout_of_30_days_is_accepted() -> None:
    from agent_sandbox.cli.arguments import seconds_arg

    assert seconds_arg("2592000") == 2592000
