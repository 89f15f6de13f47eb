"""Wire names the SDK uses: API groups, plurals, labels, annotations, claim reasons (spec §0).

The SDK is installable on its own, so it does not import the main project's `agent_sandbox.api`; a unit
test of the main project checks that every value here equals its counterpart there.
"""

from __future__ import annotations

from typing import Final

CLAIM_API_GROUP: Final = "extensions.agents.x-k8s.io"
CLAIM_API_VERSION: Final = "v1beta1"
CLAIM_PLURAL_NAME: Final = "sandboxclaims"
CLAIM_KIND: Final = "SandboxClaim"

SANDBOX_API_GROUP: Final = "agents.x-k8s.io"
SANDBOX_API_VERSION: Final = "v1beta1"
SANDBOX_PLURAL_NAME: Final = "sandboxes"

WARM_POOL_PLURAL_NAME: Final = "sandboxwarmpools"
TEMPLATE_PLURAL_NAME: Final = "sandboxtemplates"

GATEWAY_API_GROUP: Final = "gateway.networking.k8s.io"
GATEWAY_API_VERSION: Final = "v1"
GATEWAY_PLURAL: Final = "gateways"

CLIENT_REQUEST_TIME_ANNOTATION: Final = "agents.x-k8s.io/client-first-requested-at"
POD_NAME_ANNOTATION: Final = "agents.x-k8s.io/pod-name"
#: JSON {"traceparent": ..., "tracestate": ...} of the create span, only when tracing is on (spec §3.12).
TRACE_CONTEXT_ANNOTATION: Final = "opentelemetry.io/trace-context"
CREATED_BY_LABEL: Final = "agents.x-k8s.io/created-by"
CREATED_BY_VALUE: Final = "python-client"
SANDBOX_NAME_HASH_LABEL: Final = "agents.x-k8s.io/sandbox-name-hash"
WARM_POOL_SANDBOX_LABEL: Final = "agents.x-k8s.io/warm-pool-sandbox"
LAUNCH_TYPE_LABEL: Final = "agents.x-k8s.io/launch-type"

#: Claim `Ready=False` reasons the claim controller does not recover from (spec §0.2, 1.0.8 set).
TERMINAL_CLAIM_READY_REASONS: Final = frozenset(
    {
        "InvalidMetadata",
        "EnvVarsInjectionRejected",
        "VolumeClaimTemplatesError",
        "ClaimExpired",
        "SandboxExpired",
        "InvalidConfiguration",
        "PodFailed",
        "PodSucceeded",
    }
)
REASON_TEMPLATE_NOT_FOUND: Final = "TemplateNotFound"
REASON_WARM_POOL_NOT_FOUND: Final = "WarmPoolNotFound"
REASON_SANDBOX_SUSPENDED: Final = "SandboxSuspended"
REASON_RECONCILER_ERROR: Final = "ReconcilerError"

OPERATING_MODE_RUNNING: Final = "Running"
OPERATING_MODE_SUSPENDED: Final = "Suspended"

# Ours (docs/lifecycle.md): hibernated Sandboxes live in a SandboxArchive until restored.
LIFECYCLE_API_GROUP: Final = "lifecycle.agents.x-k8s.io"
LIFECYCLE_API_VERSION: Final = "v1alpha1"
ARCHIVE_PLURAL_NAME: Final = "sandboxarchives"
HIBERNATED_SANDBOX_ANNOTATION: Final = "lifecycle.agents.x-k8s.io/hibernated-sandbox"
RESUME_REASON_ANNOTATION: Final = "lifecycle.agents.x-k8s.io/resume-reason"
RESUMED_AT_ANNOTATION: Final = "lifecycle.agents.x-k8s.io/resumed-at"
#: A Sandbox's (or its SandboxTemplate's) opt-in to resume on request through a lifecycle router; the
#: Sandbox's own value wins over its template's.
AUTO_RESUME_ANNOTATION: Final = "lifecycle.agents.x-k8s.io/auto-resume"
#: On Sandboxes made from a SandboxTemplate (warm pools, claims): the template's name (its namespace's).
SANDBOX_TEMPLATE_REF_ANNOTATION: Final = "agents.x-k8s.io/sandbox-template-ref"

#: Router request headers (spec §1.2).
HEADER_SANDBOX_ID: Final = "X-Sandbox-ID"
HEADER_SANDBOX_NAMESPACE: Final = "X-Sandbox-Namespace"
HEADER_SANDBOX_PORT: Final = "X-Sandbox-Port"
HEADER_SANDBOX_POD_IP: Final = "X-Sandbox-Pod-IP"
HEADER_SANDBOX_TIMEOUT: Final = "X-Sandbox-Timeout"
RESERVED_HEADER_PREFIX: Final = "x-sandbox-"

#: Environment variable naming the router URL when no connection config is given (ours; `agent-sandbox
#: dev router-url` prints the dev cluster's).
ROUTER_URL_ENV: Final = "AGENT_SANDBOX_ROUTER_URL"
#: With `ROUTER_URL_ENV`: a bearer token sent to that router (`Authorization`), for its authz modes.
ROUTER_TOKEN_ENV: Final = "AGENT_SANDBOX_ROUTER_TOKEN"
