"""Controller process options: every flag of operations spec §7.2 / controllers spec §5.1, and §7.3 checks.

Owns: the flag table (same names and defaults as upstream, plus the framework flags `--kubeconfig` and
`--zap-*`), the typed `Options` value built from it, start-up validation (`validate` returns the fatal
errors - each naming its flag - and the warnings), and reading the allowed-label-domains file (§5.2).
Does not own what the options do (main wires them into the manager and controllers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..kube._servers import parse_bind_address
from ..kube.flags import ZAP_FLAGS, Flag, FlagSet

__all__ = [
    "ALLOWED_LABEL_DOMAINS_FILE",
    "FLAGS",
    "PROGRAM",
    "Options",
    "parse_options",
    "read_allowed_label_domains",
    "validate",
]

PROGRAM = "agent-sandbox-controller"
ALLOWED_LABEL_DOMAINS_FILE = Path("/etc/sandbox-config/allowed-label-domains")

FLAGS: tuple[Flag, ...] = (
    Flag("version", "bool", False, "Print version information and exit."),
    Flag(
        "extensions",
        "bool",
        False,
        "Also run the SandboxClaim, SandboxTemplate and SandboxWarmPool controllers.",
    ),
    Flag("cluster-domain", "string", "cluster.local", "Kubernetes cluster domain used for service FQDNs."),
    Flag("metrics-bind-address", "string", ":8080", "The address the metric endpoint binds to."),
    Flag("health-probe-bind-address", "string", ":8081", "The address the probe endpoint binds to."),
    Flag("leader-elect", "bool", True, "Enable leader election for controller manager."),
    Flag(
        "leader-election-namespace",
        "string",
        "",
        "Namespace of the leader election Lease (empty: auto-detect).",
    ),
    Flag("enable-tracing", "bool", False, "Enable OpenTelemetry tracing via OTLP."),
    Flag("enable-pprof", "bool", False, "Expose /debug/pprof/profile on the metrics server."),
    Flag(
        "enable-pprof-debug", "bool", False, "Expose all pprof endpoints and /debug/fgprof (implies pprof)."
    ),
    Flag("pprof-block-profile-rate", "int", 1000000, "Block profile sampling rate in ns (debug pprof only)."),
    Flag("pprof-mutex-profile-fraction", "int", 10, "Mutex profile sampling 1/N (debug pprof only)."),
    Flag(
        "kube-api-qps",
        "float",
        -1.0,
        "Client QPS to the API server; <= 0 disables client-side throttling.",
    ),
    Flag("kube-api-burst", "int", 10, "Client burst to the API server; must be > 0."),
    Flag("api-connections", "int", 1, "Independent API connections used round-robin for non-watch traffic."),
    Flag("separate-watch-connection", "bool", False, "Give informer list/watch traffic its own connection."),
    Flag("sandbox-concurrent-workers", "int", 100, "Concurrent reconciles of the Sandbox controller."),
    Flag(
        "sandbox-claim-concurrent-workers", "int", 50, "Concurrent reconciles of the SandboxClaim controller."
    ),
    Flag(
        "sandbox-warm-pool-concurrent-workers",
        "int",
        1,
        "Concurrent reconciles of the SandboxWarmPool controller.",
    ),
    Flag(
        "sandbox-template-concurrent-workers",
        "int",
        1,
        "Concurrent reconciles of the SandboxTemplate controller.",
    ),
    Flag(
        "sandbox-warm-pool-max-batch-size",
        "int",
        300,
        "Max sandboxes a warm pool creates or deletes per pass.",
    ),
    Flag("sandbox-warm-pool-replenish-delay", "duration", 0.0, "Hold refill after members leave a pool."),
    Flag(
        "sandbox-warm-pool-max-refill-rate", "float", 0.0, "Per-pool refill creates per second; 0 = unpaced."
    ),
    Flag(
        "sandbox-warm-pool-readiness-grace-period",
        "duration",
        300.0,
        "Time a pool sandbox may stay non-Ready.",
    ),
    Flag(
        "sandbox-warm-pool-unschedulable-recheck-interval",
        "duration",
        60.0,
        "Requeue period while holding unschedulable pool sandboxes.",
    ),
    Flag(
        "enable-warm-pool-eviction",
        "bool",
        True,
        "Mark warm-pool pods safe to evict for the cluster autoscaler.",
    ),
    Flag(
        "cache-label-selectors",
        "bool",
        False,
        "Cache only Pods/Services carrying the sandbox tracking label.",
    ),
    Flag("disable-claim-events", "bool", False, "The SandboxClaim controller emits no Events."),
    Flag(
        "disable-claim-observability-annotations",
        "bool",
        False,
        "Do not persist claim first-observed / trace-context annotations.",
    ),
    Flag(
        "sandbox-write-behind-window",
        "duration",
        0.0,
        "Write-behind window for Sandbox Pod metadata patches.",
    ),
    # Ours, not upstream's (docs/design/claim-priority.md).
    Flag(
        "sandbox-claim-priority-hold",
        "duration",
        15.0,
        "While claims arrive, writes that do not make a claim Ready wait up to this long; 0 = never.",
    ),
    # Ours, not upstream's (docs/lifecycle.md): off unless asked for.
    Flag(
        "sandbox-lifecycle",
        "bool",
        False,
        "Idle auto-suspend, hibernation and restore of Sandboxes that ask for it (needs the SandboxArchive CRD).",
    ),
    Flag(
        "sandbox-lifecycle-concurrent-workers",
        "int",
        10,
        "Concurrent reconciles of the lifecycle controller.",
    ),
    Flag(
        "sandbox-lifecycle-runtime-port",
        "int",
        8080,
        "Port of the runtime's GET /v1/activity, asked before an idle suspend; 0 = never ask.",
    ),
    Flag("enable-webhook", "bool", True, "Run the webhook server and register conversion webhooks."),
    Flag("webhook-port", "int", 9443, "Webhook server port."),
    Flag(
        "webhook-cert-dir",
        "string",
        "/tmp/k8s-webhook-server/serving-certs",
        "Directory of serving cert/key.",
    ),
    Flag(
        "webhook-cert-name", "string", "tls.crt", "Cert file name (only with --manage-webhook-certs=false)."
    ),
    Flag("webhook-key-name", "string", "tls.key", "Key file name (only with --manage-webhook-certs=false)."),
    Flag(
        "webhook-service-name",
        "string",
        "agent-sandbox-webhook-service",
        "Service of the conversion webhook.",
    ),
    Flag(
        "webhook-namespace",
        "string",
        "agent-sandbox-system",
        "Namespace of the webhook Service and cert Secret.",
    ),
    Flag(
        "manage-webhook-certs",
        "bool",
        True,
        "Generate/load serving certs and patch CRD caBundles at startup.",
    ),
    Flag("kubeconfig", "string", "", "Paths to a kubeconfig. Only required if out-of-cluster."),
    *ZAP_FLAGS,
)


@dataclass
class Options:
    """Parsed flags; attribute = flag name with '-' -> '_'. Durations are seconds (float)."""

    version: bool = False
    extensions: bool = False
    cluster_domain: str = "cluster.local"
    metrics_bind_address: str = ":8080"
    health_probe_bind_address: str = ":8081"
    leader_elect: bool = True
    leader_election_namespace: str = ""
    enable_tracing: bool = False
    enable_pprof: bool = False
    enable_pprof_debug: bool = False
    pprof_block_profile_rate: int = 1000000
    pprof_mutex_profile_fraction: int = 10
    kube_api_qps: float = -1.0
    kube_api_burst: int = 10
    api_connections: int = 1
    separate_watch_connection: bool = False
    sandbox_concurrent_workers: int = 100
    sandbox_claim_concurrent_workers: int = 50
    sandbox_warm_pool_concurrent_workers: int = 1
    sandbox_template_concurrent_workers: int = 1
    sandbox_warm_pool_max_batch_size: int = 300
    sandbox_warm_pool_replenish_delay: float = 0.0
    sandbox_warm_pool_max_refill_rate: float = 0.0
    sandbox_warm_pool_readiness_grace_period: float = 300.0
    sandbox_warm_pool_unschedulable_recheck_interval: float = 60.0
    enable_warm_pool_eviction: bool = True
    cache_label_selectors: bool = False
    disable_claim_events: bool = False
    disable_claim_observability_annotations: bool = False
    sandbox_write_behind_window: float = 0.0
    sandbox_claim_priority_hold: float = 15.0
    sandbox_lifecycle: bool = False
    sandbox_lifecycle_concurrent_workers: int = 10
    sandbox_lifecycle_runtime_port: int = 8080
    enable_webhook: bool = True
    webhook_port: int = 9443
    webhook_cert_dir: str = "/tmp/k8s-webhook-server/serving-certs"
    webhook_cert_name: str = "tls.crt"
    webhook_key_name: str = "tls.key"
    webhook_service_name: str = "agent-sandbox-webhook-service"
    webhook_namespace: str = "agent-sandbox-system"
    manage_webhook_certs: bool = True
    kubeconfig: str = ""
    zap_devel: bool = False
    zap_encoder: str = ""
    zap_log_level: str = ""
    zap_stacktrace_level: str = ""
    zap_time_encoding: str = ""
    explicitly_set: frozenset[str] = field(default_factory=frozenset)
    """Flag names given on the command line (for "flag given while ..." warnings)."""

    @property
    def total_workers(self) -> int:
        return (
            self.sandbox_concurrent_workers
            + self.sandbox_claim_concurrent_workers
            + self.sandbox_warm_pool_concurrent_workers
            + self.sandbox_template_concurrent_workers
        )

    @property
    def pprof_enabled(self) -> bool:
        """`--enable-pprof-debug` implies `--enable-pprof`."""
        return self.enable_pprof or self.enable_pprof_debug


def flag_set() -> FlagSet:
    return FlagSet(PROGRAM, FLAGS)


def parse_options(argv: Sequence[str]) -> tuple[Options, list[str]]:
    """Parse the command line into `Options` (+ positional arguments).

    Raises:
        FlagError, HelpRequested: see `flags.FlagSet.parse`.
    """
    values, seen, rest = flag_set().parse(argv)
    opts = Options(**{name.replace("-", "_"): value for name, value in values.items()})
    opts.explicitly_set = frozenset(seen)
    # Negative profile rates are clamped to 0 (off), as upstream does.
    opts.pprof_block_profile_rate = max(0, opts.pprof_block_profile_rate)
    opts.pprof_mutex_profile_fraction = max(0, opts.pprof_mutex_profile_fraction)
    return opts, rest


def validate(opts: Options) -> tuple[list[str], list[str]]:
    """Start-up validation (operations spec §7.3, controllers spec §5.1).

    Returns:
        (fatal errors, warnings); every message names the flag it is about.
    """
    errors: list[str] = []
    warnings: list[str] = []
    for flag in ("webhook-cert-name", "webhook-key-name"):
        if not getattr(opts, flag.replace("-", "_")).strip():
            errors.append(f"--{flag} must not be empty")
    for flag in (
        "sandbox-warm-pool-readiness-grace-period",
        "sandbox-warm-pool-unschedulable-recheck-interval",
    ):
        if getattr(opts, flag.replace("-", "_")) <= 0:
            errors.append(f"--{flag} must be > 0")
    for flag in (
        "sandbox-concurrent-workers",
        "sandbox-claim-concurrent-workers",
        "sandbox-warm-pool-concurrent-workers",
    ):
        if getattr(opts, flag.replace("-", "_")) <= 0:
            errors.append(f"--{flag} must be > 0")
    if opts.sandbox_warm_pool_max_batch_size <= 0:
        errors.append("--sandbox-warm-pool-max-batch-size must be > 0")
    rate = opts.sandbox_warm_pool_max_refill_rate
    if math.isnan(rate) or math.isinf(rate) or rate < 0:
        errors.append("--sandbox-warm-pool-max-refill-rate must be finite and >= 0")
    if opts.sandbox_write_behind_window < 0:
        errors.append("--sandbox-write-behind-window must be >= 0")
    if opts.sandbox_claim_priority_hold < 0:
        errors.append("--sandbox-claim-priority-hold must be >= 0")
    if opts.sandbox_lifecycle_concurrent_workers <= 0:
        errors.append("--sandbox-lifecycle-concurrent-workers must be > 0")
    if not 0 <= opts.sandbox_lifecycle_runtime_port <= 65535:
        errors.append("--sandbox-lifecycle-runtime-port must be within 0-65535")
    if not 1 <= opts.webhook_port <= 65535:
        # Checked here rather than at bind time: the listener wrapped 99999 to 34463 and took -1 for a crash.
        errors.append("--webhook-port must be within 1-65535")
    for flag in ("metrics-bind-address", "health-probe-bind-address"):
        value = getattr(opts, flag.replace("-", "_"))
        try:
            parse_bind_address(value)
        except ValueError:
            # The manager would fail on it when it starts its server; say so up front, naming the flag.
            errors.append(f'--{flag} must be [host]:port, "0" or empty (disabled); got {value!r}')
    if math.isnan(opts.kube_api_qps) or opts.kube_api_qps == math.inf:
        # Go's ParseFloat takes both; NaN only happened to disable the limiter, +Inf did so behind a warning
        # that workers would queue on it. -Inf stays what any value <= 0 is: no client-side limit.
        errors.append("--kube-api-qps must be a finite number (<= 0: no client-side limit)")
    if opts.kube_api_burst <= 0:
        errors.append("--kube-api-burst must be > 0")
    if opts.api_connections < 1:
        errors.append("--api-connections must be >= 1")

    if opts.total_workers > 1000:
        warnings.append(
            f"total concurrent workers ({opts.total_workers}) > 1000 (sum of the --*-concurrent-workers)"
        )
    if 0 < opts.kube_api_qps < math.inf and opts.total_workers > opts.kube_api_burst:
        warnings.append(
            f"--kube-api-qps={opts.kube_api_qps:g} with total workers ({opts.total_workers}) > "
            f"--kube-api-burst={opts.kube_api_burst}: workers will queue on the client rate limiter"
        )
    if opts.leader_elect and not opts.leader_election_namespace:
        warnings.append("--leader-election-namespace is empty: auto-detecting the in-cluster namespace")
    if not opts.enable_webhook:
        warnings.append("--enable-webhook=false: the CRDs must use conversion strategy None")
        if "manage-webhook-certs" in opts.explicitly_set:
            warnings.append("--manage-webhook-certs has no effect with --enable-webhook=false")
    if opts.manage_webhook_certs and ({"webhook-cert-name", "webhook-key-name"} & opts.explicitly_set):
        warnings.append(
            "--webhook-cert-name/--webhook-key-name are ignored with --manage-webhook-certs=true "
            "(tls.crt/tls.key are used)"
        )
    return errors, warnings


def read_allowed_label_domains(path: Path = ALLOWED_LABEL_DOMAINS_FILE) -> list[str]:
    """Read the allowed label domains (controllers spec §5.2): split on ',', LF, CR; trim; lower-case.

    A missing file yields [] (the built-in default applies).

    Raises:
        OSError: any read error other than "not found" (fatal at start-up).
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    parts = text.replace("\r", ",").replace("\n", ",").split(",")
    return [p.strip().lower() for p in parts if p.strip()]
