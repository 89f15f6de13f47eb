"""The SDK client the sandbox commands' common options describe: the kubeconfig and the router of
`--kubeconfig`, `--dev-cluster`, `--router-url` or `$AGENT_SANDBOX_ROUTER_URL`, the router's bearer token, the
namespace kubectl would use; and the sandbox a command's claim names."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from pydantic import ValidationError

from agent_sandbox.invocation import cli_command
from agent_sandbox_sdk import (
    Sandbox,
    SandboxClient,
    SandboxdDirectConnectionConfig,
    SandboxDirectConnectionConfig,
    SandboxdPodTunnelConnectionConfig,
)
from agent_sandbox_sdk._shared import router_token_headers
from agent_sandbox_sdk.constants import ROUTER_URL_ENV
from agent_sandbox_sdk.models import SandboxConnectionConfig

from .interruptible import add_closer


def _dev_cluster(name: str) -> tuple[str, str | None]:
    """(kubeconfig, router URL or None) of a local dev cluster."""
    from agent_sandbox.devcluster import DevCluster

    cluster = DevCluster.load(name)
    if cluster is None:
        raise ValueError(
            f"no dev cluster named {name!r}; start one with `{cli_command(f'dev up --name {shlex.quote(name)}')}`"
        )
    from agent_sandbox.devcluster.router import router_url

    url = router_url(cluster)
    return str(cluster.kubeconfig), url


def _router_url(args: argparse.Namespace) -> str | None:
    """--router-url, else the --dev-cluster's router, else $AGENT_SANDBOX_ROUTER_URL.

    `--dev-cluster NAME` is NAME's kubeconfig and router: until December 6 the environment's router (set for
    another cluster, say) took NAME's sandboxes. The environment's serves a dev cluster that runs none."""
    url = args.router_url
    if not url and args.dev_cluster:
        url = _dev_cluster(args.dev_cluster)[1]
    url = url or os.environ.get(ROUTER_URL_ENV)
    return str(url) if url else None


def make_client(args: argparse.Namespace, *, sandboxd: bool = False) -> SandboxClient:
    """The SDK client the common options describe.

    `sandboxd`: reach the sandbox's sandboxd API (gRPC process service: stdin, PTY) - through the router
    (which needs `--enable-h2c`) when there is one, else by a port-forward to the pod - instead of the legacy
    runtime's HTTP API.
    """
    kubeconfig = args.kubeconfig
    if args.dev_cluster:  # looked up even when --kubeconfig is given: a cluster that is not up is an error
        dev_kubeconfig = _dev_cluster(args.dev_cluster)[0]
        kubeconfig = kubeconfig or dev_kubeconfig
    router_url = _router_url(args)
    if not router_url and getattr(args, "router_token_file", None):
        # Without a URL the tunnel to `sandbox-router-svc` carries no headers (upstream's config has none):
        # the token would be dropped and the router answer 401 without a hint.
        raise ValueError(
            "--router-token-file needs the router's URL (--router-url or $AGENT_SANDBOX_ROUTER_URL)"
        )
    config: SandboxConnectionConfig | None = (
        _router_config(router_url, sandboxd, _router_headers(args)) if router_url else None
    )
    if config is None and sandboxd:
        config = SandboxdPodTunnelConnectionConfig()
    client = SandboxClient(config, kubeconfig=kubeconfig, context=args.context)
    # A Ctrl-C wakes the command's blocked reads by closing it (interruptible.py).
    add_closer(args, client.close)
    if args.namespace is None:  # as kubectl: the context's namespace when -n is not given
        args.namespace = client.context_namespace
    return client


def _router_headers(args: argparse.Namespace) -> dict[str, str]:
    """`Authorization: Bearer <token>` from --router-token-file, else $AGENT_SANDBOX_ROUTER_TOKEN, else none.

    The file is read at each start, so a projected service-account token kubelet rotates keeps working. A
    value written with its scheme (`Bearer v1....`) is taken without it, as the SDK does (`router_token_headers`).
    """
    path = getattr(args, "router_token_file", None)
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as err:
            raise ValueError(f"--router-token-file {path}: {err.strerror or err}") from None
        if not token:
            raise ValueError(f"--router-token-file {path} is empty")
        return router_token_headers(token)
    return router_token_headers(None)


def _router_config(
    url: str, sandboxd: bool = False, headers: dict[str, str] | None = None
) -> SandboxConnectionConfig:
    """The router connection; an unusable URL is a one-line usage error, not pydantic's report."""
    try:
        if sandboxd:
            return SandboxdDirectConnectionConfig(api_url=url, extra_headers=headers or {})
        return SandboxDirectConnectionConfig(api_url=url, extra_headers=headers or {})
    except ValidationError as err:
        reason = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())
        raise ValueError(f"--router-url / ${ROUTER_URL_ENV} {url!r}: {reason}") from None


def _handle(client: SandboxClient, args: argparse.Namespace) -> Sandbox:
    return client.get_sandbox(args.claim, args.namespace)
