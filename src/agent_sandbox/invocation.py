"""How to spell an `agent-sandbox` command in a hint printed to the user, so that it runs when pasted.

Why: `make install` puts the CLI in `.venv/bin/`, not on PATH; `dev up` ended with
`stop it: agent-sandbox dev down --name X`, which a shell answers with "command not found" (until December 7).

The program is `agent-sandbox` when that name finds this very CLI on PATH; otherwise the CLI as this process
was started (`sys.argv[0]` as the user typed it, e.g. `.venv/bin/agent-sandbox`); otherwise (a
`python -m ...` run: the benchmarks, the tests) the `agent-sandbox` script installed next to this Python.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

__all__ = ["PROGRAM", "cli_command", "cli_program"]

PROGRAM = "agent-sandbox"


def _running_cli() -> tuple[str, Path] | None:
    """(how to name it, its file) of the CLI this process runs or installed next to this Python."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == PROGRAM and os.path.isfile(argv0):
        return argv0, Path(argv0)
    sibling = Path(sys.executable).parent / PROGRAM
    if sibling.is_file():
        return str(sibling), sibling
    return None


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def cli_program() -> str:
    """The `agent-sandbox` program as a shell word that runs this CLI (quoted when it needs to be)."""
    found = shutil.which(PROGRAM)
    running = _running_cli()
    if running is None:
        return PROGRAM
    spelled, path = running
    if found is not None and _same_file(found, path):
        return PROGRAM
    # A path without a slash would be looked up on PATH, where it is not (or is another install).
    if os.sep not in spelled:
        spelled = os.path.join(os.curdir, spelled)
    return shlex.quote(spelled)


def cli_command(args: str) -> str:
    """`<program> <args>`: a command line to print in a hint; `args` is already shell text."""
    return f"{cli_program()} {args}"
