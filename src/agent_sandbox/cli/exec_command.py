"""`agent-sandbox exec`: a command run in a sandbox - its output streamed, collected for `-o json|yaml`, or a
terminal session with -i / -t - and its exit status as a shell reports it (124: timed out)."""

from __future__ import annotations

import argparse
import shlex
import sys

from agent_sandbox_sdk import (
    CommandEvent,
    CommandExecutor,
    CommandStream,
    ExecutionResult,
    SandboxError,
    SandboxRequestError,
)

from .connection import _handle, make_client
from .exit_codes import EXIT_ERROR
from .interruptible import interruptible
from .option_values import _pairs
from .output import relay_output, render


def _exec(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0].startswith("-"):  # `exec CLAIM -n ns -- cmd`: options after the claim
        if "--" not in argv:
            # `exec CLAIM -n ns ls` ran `-n ns ls` in CLAIM of the *default* namespace (or failed naming it),
            # until December 6; kubectl too wants `--` before the command
            raise ValueError(
                f"options after the claim need -- before the command: agent-sandbox exec CLAIM "
                f"{' '.join(argv[:2])} -- COMMAND [ARGS...]"
            )
        cut = argv.index("--")
        args.exec_parser.parse_args([*argv[:cut], args.claim], namespace=args)
        argv = argv[cut + 1 :]
    if not argv:
        raise ValueError("exec needs a command: agent-sandbox exec CLAIM -- COMMAND [ARGS...]")
    # Each word reaches the program as given, with and without -i/-t, as kubectl exec passes them: the runtimes
    # take one string that a shell splits, so the words are quoted for it - a lone word too (a plain `ls` is
    # unchanged). Until December 7 a lone word was sent as it was: `exec sb -- "./my prog.sh"` ran `./my`, and
    # with -i `exec sb -- "$FILE"` ran a name holding `;` as shell code.
    command = shlex.join(argv)
    env = dict(_pairs(args.env, "--env"))
    if args.stdin or args.tty:
        if args.output != "table":
            raise ValueError(
                "-o json|yaml cannot be combined with -i / -t (their output is the command's own)"
            )
        from .interactive import run_interactive

        commands = _handle(make_client(args, sandboxd=True), args).commands
        assert commands is not None
        return _exit_of(
            run_interactive(
                lambda pty: commands.stream(
                    command, timeout=args.timeout, env=env or None, cwd=args.cwd, pty=pty
                ),
                stdin=args.stdin,
                want_tty=args.tty,
            ),
            args.timeout,
        )
    # In a worker thread, so that a signal stops it within a second; closing the client ends the stream, and the
    # runtime kills the command (interruptible.py).
    return interruptible(lambda a: _streamed(a, command, env))(args)


def _streamed(args: argparse.Namespace, command: str, env: dict[str, str]) -> int:
    """exec without -i/-t: the output relayed (or collected for -o json|yaml), and the exit status."""
    sandbox = _handle(make_client(args), args)
    assert sandbox.commands is not None
    # Without --timeout the runtime's own limit ends the command (300 s by default), as kubectl exec waits for
    # as long as it runs; a router or sandbox that stops answering is given up after the SDK's idle limit for
    # streams (90 s: the runtime writes a keep-alive line after 30 s of silence).
    stream = sandbox.commands.stream(command, timeout=args.timeout, env=env or None, cwd=args.cwd)
    if args.output != "table":
        result = _collected(stream, sandbox.commands, command, args, env)
        if result.timed_out:
            print(_timed_out(args.timeout), file=sys.stderr)
        render(result, args.output)
        return _exit_code(result)
    return _exit_of(relay_output(stream), args.timeout)


def _collected(
    stream: CommandStream,
    commands: CommandExecutor,
    command: str,
    args: argparse.Namespace,
    env: dict[str, str],
) -> ExecutionResult:
    """`exec -o json|yaml`'s result: the stream, collected, else (upstream's runtime) one `/execute`.

    The stream, not `run`: one request answered only when the command ends could not tell a quiet command from a
    router that stopped answering (it waited up to a day for one, until December 6) and met a router's
    --proxy-timeout (180 s) however long the command was let run. A timed-out command's exit code is 124, as
    sandboxd's `run` and the table output report it (the stream says how it was killed: -9). Upstream's
    python-runtime has no `/execute/stream` (404): there the command runs through `/execute` as before.
    """
    try:
        with stream:
            result: ExecutionResult = stream.result()
    except SandboxRequestError as err:
        if err.status_code != 404:
            raise
        return commands.run(
            command,
            # Without --timeout the runtime's own limit ends the command (300 s by default); a router bounds
            # the wait by its --proxy-timeout, and says so.
            timeout=args.timeout + 10 if args.timeout else _WAIT_FOR_THE_RUNTIME,
            command_timeout=args.timeout,
            env=env or None,
            cwd=args.cwd,
        )
    if result.timed_out:
        result = result.model_copy(update={"exit_code": TIMED_OUT_EXIT_CODE})
    return result


#: How long `exec -o json` waits for upstream's runtime's answer (`/execute`, no stream) without --timeout: the
#: runtime's own limit ends the command first (its largest is a day).
_WAIT_FOR_THE_RUNTIME = 24 * 3600.0
#: What a command the runtime killed for its time limit exits with (GNU timeout's, sandboxd's).
TIMED_OUT_EXIT_CODE = 124


def _exit_of(exit_event: CommandEvent | None, timeout: float | None) -> int:
    """exec's exit status: the command's, 124 when it timed out."""
    if exit_event is None:
        raise SandboxError("the command stream ended without an exit code")
    if exit_event.timed_out:
        print(_timed_out(timeout), file=sys.stderr)
    return _exit_code(ExecutionResult(exit_code=exit_event.exit_code or 0, timed_out=exit_event.timed_out))


def _timed_out(timeout: float | None) -> str:
    """What exec says of a command killed for its time limit: --timeout's, else the runtime's own (until
    December 6 that case formatted the missing --timeout: a TypeError traceback and exit 1, not 124)."""
    if timeout is None:
        return (
            "error: the command timed out: the runtime's time limit ended it (300 s unless the runtime sets "
            "another; --timeout N sets one)"
        )
    return f"error: the command timed out after {timeout:g} s"


def _exit_code(result: ExecutionResult) -> int:
    """The command's exit status as a shell reports it: 124 for a timeout, 128 + N for a death by signal N
    (runtimes report -N, Python's convention), anything else out of range EXIT_ERROR."""
    if result.timed_out:
        return 124
    if -127 <= result.exit_code < 0:
        return 128 - result.exit_code
    return result.exit_code if 0 <= result.exit_code <= 255 else EXIT_ERROR
