"""Arguments the sandbox commands share: connection options (also before the command, as kubectl's global
flags), the output format, claims as kubectl names them, and durations."""

from __future__ import annotations

import argparse

from agent_sandbox_sdk._checks import MAX_TIMEOUT_SECONDS
from agent_sandbox_sdk.constants import ROUTER_TOKEN_ENV, ROUTER_URL_ENV

from .output import claim_of

__all__ = [
    "CONNECTION_OPTIONS",
    "add_connection_options",
    "claim_arg",
    "common_options",
    "seconds_arg",
    "tail_lines_arg",
]


def seconds_arg(value: str) -> float:
    """A `--timeout`: a positive number of seconds up to 30 days (the SDK's `MAX_TIMEOUT_SECONDS`).

    The cap is a usage error (exit 2) here, before anything is sent: until December 7 `exec`, `cp` and
    `lifecycle resume` took `--timeout 1e10` and failed later (an OverflowError, or the SDK's refusal, exit 1).
    """
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not 0 < seconds <= MAX_TIMEOUT_SECONDS:  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds up to {MAX_TIMEOUT_SECONDS} (30 days), got {value!r}"
        )
    return seconds


def tail_lines_arg(value: str) -> int | None:
    """`logs --tail N`: the last N lines; a negative N is all of them (None), as kubectl's `--tail=-1` (until
    December 7 sent as it was, and the API server's 422 was exit 1)."""
    try:
        lines = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of lines: {value!r}") from None
    return lines if lines >= 0 else None


def claim_arg(value: str) -> str:
    """A claim argument: its name, or kubectl's `TYPE/NAME` of a claim (what `-o name` prints)."""
    if "/" not in value:
        return value
    name = claim_of(value)
    if name is None:
        raise argparse.ArgumentTypeError(f"{value!r}: a SandboxClaim name, or sandboxclaim/NAME")
    return name


#: The options of `add_connection_options`: (flag, attribute).
CONNECTION_OPTIONS = (
    ("-n/--namespace", "namespace"),
    ("--kubeconfig", "kubeconfig"),
    ("--context", "context"),
    ("--router-url", "router_url"),
    ("--router-token-file", "router_token_file"),
    ("--dev-cluster", "dev_cluster"),
)


def add_connection_options(parser: argparse.ArgumentParser, *, before_the_command: bool = False) -> None:
    """`-n`, `--kubeconfig`, `--context`, `--router-url`, `--router-token-file`, `--dev-cluster`: accepted before the command as well
    as after it, as kubectl's global flags are (`agent-sandbox -n team-a list`).

    The top-level parser holds the defaults (None); a command's parser leaves an option it was not given
    unset (SUPPRESS), since argparse would otherwise let the command's default overwrite a value given
    before the command. A None namespace means the kubeconfig context's (`make_client`).
    """
    default = None if before_the_command else argparse.SUPPRESS
    parser.add_argument(
        "-n",
        "--namespace",
        default=default,
        help="namespace (default: the kubeconfig context's namespace, else default)",
    )
    parser.add_argument(
        "--kubeconfig",
        default=default,
        help="kubeconfig file (default: $KUBECONFIG, in-cluster, ~/.kube/config)",
    )
    parser.add_argument(
        "--context", default=default, help="kubeconfig context (default: its current-context)"
    )
    parser.add_argument(
        "--router-url",
        default=default,
        help=f"sandbox router URL (default: the --dev-cluster's router, else ${ROUTER_URL_ENV})",
    )
    parser.add_argument(
        "--router-token-file",
        metavar="PATH",
        default=default,
        help=f"bearer token for a router with authz (tokenreview or scoped-token), read from PATH "
        f"(default: ${ROUTER_TOKEN_ENV})",
    )
    parser.add_argument(
        "--dev-cluster",
        metavar="NAME",
        default=default,
        help="use the local dev cluster NAME (kubeconfig + router)",
    )


def common_options(formats: tuple[str, ...]) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-o", "--output", choices=formats, default="table", help="output format (default table)"
    )
    add_connection_options(common)
    common.set_defaults(connection_options=True)
    return common
