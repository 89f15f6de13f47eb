"""What `agent-sandbox cp`'s upload and download of a tree share: the tally of what was copied, the transfers
run a few at a time, the paths and names the sandbox's file APIs take, and the mode bits a copy keeps."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from agent_sandbox_sdk._paths import reject_control_characters

_PARALLEL = 8  # files in flight at once in a directory copy


#: The bits a copy keeps, as `cp -r` without `-p`: a file's permission bits, a directory's and its sticky bit
#: (mkdir keeps S_ISVTX); a set-user-ID or set-group-ID bit never.
_FILE_BITS = 0o777
_DIRECTORY_BITS = 0o1777


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


@dataclass
class _Tally:
    files: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)  # listed, then not there to read
    refused: list[str] = field(default_factory=list)  # error lines: what was not copied, and why
    unset: list[str] = field(default_factory=list)  # error lines: a local directory whose mode was not set

    def summary(self) -> str:
        noun = "file" if self.files == 1 else "files"
        return f"{self.files} {noun}, {self.bytes} bytes"


def _api_path(path: str) -> str:
    """`path` as the SDK's file calls take it: a top-level name of only spaces (` `) as `./ `.

    `sanitize_path` refuses a path of only whitespace, as upstream's SDK does (a caller's empty argument,
    9abf078), but here it is a file name from a listing or a local tree: `./ ` names the same file and is
    normalised to ` `. A copy to or from the sandbox's root stopped at such a name (ValueError).
    """
    return f"./{path}" if path and not path.strip() else path


def _sendable(name: str) -> bool:
    """Whether a file API can carry `name`: none takes a control character (a newline cannot be in a
    header or a legacy path; the SDK refuses it)."""
    try:
        reject_control_characters(name)
    except ValueError:
        return False
    return True


def _run_all(jobs: list[Callable[[], int]]) -> list[int]:
    """Run transfers a few at a time (small files cost a round trip each, not bandwidth); the first failure
    stops those not started and is raised."""
    if len(jobs) <= 1:
        return [job() for job in jobs]
    with ThreadPoolExecutor(max_workers=min(_PARALLEL, len(jobs))) as pool:
        futures = [pool.submit(job) for job in jobs]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise
