"""The v1alpha1<->v1beta1 conversion webhook: TLS server, serving certificate, CRD caBundle.

Usage from the controller process::

    webhook = ConversionWebhook(client, WebhookOptions(port=9443))
    await webhook.start()   # Secret -> cert files -> HTTPS listener -> CRD patch
    ...
    await webhook.stop()

Dev mode (local control plane, no kube-proxy): ``WebhookOptions(host="127.0.0.1",
webhook_url="https://127.0.0.1:{port}/convert")`` makes the CRDs call the URL directly; the
controller process takes it from ``$AGENT_SANDBOX_WEBHOOK_URL`` (see ``setup``).

The names below load on first use (PEP 562): the listener child process
(``python -m agent_sandbox.controllers.webhook.listener``) imports this package first and needs none
of the certificate, CRD or Kubernetes client code they bring in.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_sandbox.controllers.webhook.app import (
        build_app,
    )
    from agent_sandbox.controllers.webhook.certs import (
        CertBundle,
        CertificateError,
        bundle_problem,
        ensure_certificates,
        generate_bundle,
        service_hosts,
    )
    from agent_sandbox.controllers.webhook.crds import (
        ALL_CRD_NAMES,
        client_config,
        conversion_patch,
        patch_crds,
    )
    from agent_sandbox.controllers.webhook.runnable import (
        WEBHOOK_URL_ENV,
        WebhookRunnable,
        options_from,
        setup,
    )
    from agent_sandbox.controllers.webhook.server import (
        ConversionWebhook,
        WebhookError,
        WebhookOptions,
    )

_MODULE_OF = {
    "CertBundle": "certs",
    "CertificateError": "certs",
    "bundle_problem": "certs",
    "ensure_certificates": "certs",
    "generate_bundle": "certs",
    "service_hosts": "certs",
    "ALL_CRD_NAMES": "crds",
    "client_config": "crds",
    "conversion_patch": "crds",
    "patch_crds": "crds",
    "WEBHOOK_URL_ENV": "runnable",
    "WebhookRunnable": "runnable",
    "options_from": "runnable",
    "setup": "runnable",
    "ConversionWebhook": "server",
    "WebhookError": "server",
    "WebhookOptions": "server",
    "build_app": "app",
}

__all__ = [
    "ALL_CRD_NAMES",
    "WEBHOOK_URL_ENV",
    "CertBundle",
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


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
