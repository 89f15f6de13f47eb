"""The v1alpha1<->v1beta1 conversion webhook: TLS server, serving certificate, CRD caBundle.

Usage from the controller process::

    webhook = ConversionWebhook(client, WebhookOptions(port=9443))
    await webhook.start()   # Secret -> cert files -> HTTPS listener -> CRD patch
    ...
    await webhook.stop()

Dev mode (local control plane, no kube-proxy): ``WebhookOptions(host="127.0.0.1",
webhook_url="https://127.0.0.1:{port}/convert")`` makes the CRDs call the URL directly; the
controller process takes it from ``$AGENT_SANDBOX_WEBHOOK_URL`` (see ``setup``).
"""

from __future__ import annotations

from agent_sandbox.controllers.webhook.app import build_app
from agent_sandbox.controllers.webhook.certs import (
    CertBundle,
    CertificateError,
    bundle_problem,
    ensure_certificates,
    generate_bundle,
    service_hosts,
)
from agent_sandbox.controllers.webhook.certwatch import CertWatcher
from agent_sandbox.controllers.webhook.crds import ALL_CRD_NAMES, client_config, conversion_patch, patch_crds
from agent_sandbox.controllers.webhook.errors import WebhookError
from agent_sandbox.controllers.webhook.runnable import WEBHOOK_URL_ENV, WebhookRunnable, options_from, setup
from agent_sandbox.controllers.webhook.server import ConversionWebhook, WebhookOptions

__all__ = [
    "ALL_CRD_NAMES",
    "WEBHOOK_URL_ENV",
    "CertBundle",
    "CertWatcher",
    "CertificateError",
    "ConversionWebhook",
    "WebhookError",
    "WebhookOptions",
    "WebhookRunnable",
    "build_app",
    "bundle_problem",
    "client_config",
    "conversion_patch",
    "ensure_certificates",
    "generate_bundle",
    "options_from",
    "patch_crds",
    "service_hosts",
    "setup",
]
