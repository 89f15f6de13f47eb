"""Wire the conversion webhook into the controller process (controllers spec §5.3, §5.7).

``setup(mgr, ctx)`` maps the process flags to :class:`WebhookOptions` and registers a runnable
that runs on every replica (no leader election). It is in ``controllers.main.SETUPS`` behind
``--enable-webhook``.

Dev mode: upstream has no flag for it and the controller's flag set is pinned to upstream's,
so the loopback URL comes from the environment variable ``AGENT_SANDBOX_WEBHOOK_URL``
(e.g. ``https://127.0.0.1:{port}/convert``; ``{port}`` is filled with ``--webhook-port``).
When set, the server binds to the URL's host and the CRDs get ``clientConfig.url`` instead of
the Service reference, because Endpoints reject loopback addresses.

``AGENT_SANDBOX_WEBHOOK_HOST`` only chooses the address the server binds (default: every interface, as
upstream). The dev cluster's stand-in kubelet (``devcluster.podprocess``) sets it to the pod's 127.x IP
when it runs an installed controller pod, which keeps the Service reference.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from agent_sandbox.controllers.context import ControllerContext
from agent_sandbox.controllers.options import Options
from agent_sandbox.controllers.webhook.server import ConversionWebhook, WebhookOptions
from agent_sandbox.kube import Manager

WEBHOOK_URL_ENV = "AGENT_SANDBOX_WEBHOOK_URL"
WEBHOOK_HOST_ENV = "AGENT_SANDBOX_WEBHOOK_HOST"


def options_from(opts: Options, environ: Mapping[str, str] = os.environ) -> WebhookOptions:
    """Webhook settings from the process flags (and the dev-mode URL from ``environ``)."""
    url = environ.get(WEBHOOK_URL_ENV) or None
    if url:
        url = url.replace("{port}", str(opts.webhook_port))
    return WebhookOptions(
        host=(urlsplit(url).hostname or "") if url else environ.get(WEBHOOK_HOST_ENV, ""),
        port=opts.webhook_port,
        namespace=opts.webhook_namespace,
        service_name=opts.webhook_service_name,
        cluster_domain=opts.cluster_domain,
        cert_dir=Path(opts.webhook_cert_dir),
        cert_name=opts.webhook_cert_name,
        key_name=opts.webhook_key_name,
        manage_certs=opts.manage_webhook_certs,
        webhook_url=url,
    )


class WebhookRunnable:
    """Manager runnable: start the webhook, serve until cancelled, then stop it."""

    need_leader_election = False
    name = "conversion-webhook"

    def __init__(self, webhook: ConversionWebhook) -> None:
        """Args: webhook: the (not yet started) webhook to run."""
        self.webhook = webhook

    async def start(self) -> None:
        """Block until cancelled; start-up errors propagate (the process exits 1, as upstream)."""
        await self.webhook.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.webhook.stop()


def setup(mgr: Manager, ctx: ControllerContext) -> None:
    """Register the conversion webhook with the manager."""
    mgr.add(WebhookRunnable(ConversionWebhook(mgr.api, options_from(ctx.options))))
