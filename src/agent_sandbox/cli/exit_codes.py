"""The sandbox commands' exit codes, and the guard that turns an error into one `error:` line and its code.

0 success (`exec`: the command's own code, 124 when it timed out); 1 an error from the cluster, router or
sandbox (one that cannot be reached too); 2 invalid usage or input; 3 not found (said by the SDK, or answered
404); 4 timed out waiting.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from agent_sandbox_sdk import (
    SandboxClaimFailedError,
    SandboxError,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxTemplateNotFoundError,
    SandboxTimeoutError,
    SandboxWarmPoolNotFoundError,
)
from agent_sandbox_sdk._kube import object_not_found

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_TIMEOUT = 4

Handler = Callable[[argparse.Namespace], int]


def _guard(handler: Handler) -> Handler:
    """Errors -> one `error:` line and the exit codes of the module docstring."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except SandboxClaimFailedError as err:
            # Before "not found": what `get_sandbox` raises for a claim that failed is also a
            # `SandboxNotFoundError` (upstream's contract), but it exists - exit 1, as `create`'s.
            _report(err)
            return EXIT_ERROR
        except (SandboxNotFoundError, SandboxWarmPoolNotFoundError, SandboxTemplateNotFoundError) as err:
            _report(err)
            # `get_sandbox` reports every failure as not found (upstream's contract): it is one only when the
            # SDK said so itself or something answered 404. A refusal is not one, nor a request that got no
            # answer (status None: an unreachable API server was exit 3 until December 6, where `get` said 1).
            cause = err.__cause__
            missing = not isinstance(cause, SandboxRequestError) or cause.status_code == 404
            return EXIT_NOT_FOUND if missing else EXIT_ERROR
        except SandboxTimeoutError as err:
            _report(err)
            return EXIT_TIMEOUT
        except SandboxRequestError as err:
            # The API server's own "not there" (a namespace `create -n` names, a pod that is gone): not found,
            # as the docstring says; until December 6 exit 1. Not a 404 for an API it does not serve (no CRDs),
            # nor a router's or runtime's own 404 (cp and exec say those themselves).
            _report(err)
            return EXIT_NOT_FOUND if _object_missing(err) else EXIT_ERROR
        except SandboxError as err:
            _report(err)
            return EXIT_ERROR
        except (ValueError, FileNotFoundError, IsADirectoryError, NotImplementedError) as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_USAGE
        except BrokenPipeError:
            raise  # stdout closed by a reader (`| head`): the entry point's exit 141, as a shell's SIGPIPE
        except OSError as err:
            # The local file system (`cp`: a file where the tree has a directory, one the user cannot read,
            # a full disk): exit 1 as cp's, one line (until December 7 a traceback).
            print(f"error: {err}", file=sys.stderr)
            return EXIT_ERROR

    return run


def _object_missing(err: SandboxRequestError) -> bool:
    """The Kubernetes API server answered 404 for an object (a `Status` body)."""
    return err.status_code == 404 and err.response is not None and object_not_found(err.response)


def _report(err: SandboxError) -> None:
    """The error, and what the SDK noted on it (a claim a failed create could not delete)."""
    print(f"error: {err}", file=sys.stderr)
    for note in getattr(err, "__notes__", ()):
        print(f"note: {note}", file=sys.stderr)
