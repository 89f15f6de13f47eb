{{/*
The controller's arguments (operations spec §5.2): a named flag is emitted only when its key exists in
.Values.controller and is not null (null is how a values file unsets a key; Helm keeps a null given for a key
the chart's values.yaml leaves commented out); then --webhook-service-name (when non-empty),
--webhook-namespace, --sandbox-lifecycle (lifecycle.enabled), --manage-webhook-certs=false
(controller.webhookCertSecret), then extraArgs.
*/}}
{{- define "agent-sandbox.controllerArgs" -}}
{{- $c := .Values.controller -}}
{{- $named := list
  (list "leaderElect" "leader-elect")
  (list "extensions" "extensions")
  (list "clusterDomain" "cluster-domain")
  (list "leaderElectionNamespace" "leader-election-namespace")
  (list "enableTracing" "enable-tracing")
  (list "enablePprof" "enable-pprof")
  (list "enablePprofDebug" "enable-pprof-debug")
  (list "pprofBlockProfileRate" "pprof-block-profile-rate")
  (list "pprofMutexProfileFraction" "pprof-mutex-profile-fraction")
  (list "kubeApiQps" "kube-api-qps")
  (list "kubeApiBurst" "kube-api-burst")
  (list "sandboxConcurrentWorkers" "sandbox-concurrent-workers")
  (list "sandboxClaimConcurrentWorkers" "sandbox-claim-concurrent-workers")
  (list "sandboxWarmPoolConcurrentWorkers" "sandbox-warm-pool-concurrent-workers")
  (list "sandboxTemplateConcurrentWorkers" "sandbox-template-concurrent-workers")
  (list "sandboxWarmPoolMaxBatchSize" "sandbox-warm-pool-max-batch-size")
  (list "sandboxWarmPoolReadinessGracePeriod" "sandbox-warm-pool-readiness-grace-period")
  (list "sandboxWarmPoolUnschedulableRecheckInterval" "sandbox-warm-pool-unschedulable-recheck-interval")
  (list "enableWarmPoolEviction" "enable-warm-pool-eviction")
-}}
{{- range $named }}
{{- if and (hasKey $c (index . 0)) (not (kindIs "invalid" (index $c (index . 0)))) }}
- {{ printf "--%s=%s" (index . 1) (include "agent-sandbox.flagValue" (index $c (index . 0))) | quote }}
{{- end }}
{{- end }}
{{- with .Values.webhookServiceName }}
- {{ printf "--webhook-service-name=%s" . | quote }}
{{- end }}
- {{ printf "--webhook-namespace=%s" (include "agent-sandbox.namespace" .) | quote }}
{{- if include "agent-sandbox.lifecycle.enabled" . }}
- "--sandbox-lifecycle"
{{- end }}
{{- if $c.webhookCertSecret }}
- "--manage-webhook-certs=false"
{{- end }}
{{- range $c.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
