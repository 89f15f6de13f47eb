{{/* Names, namespace, labels and image of the chart (operations spec §5.3). */}}

{{- define "agent-sandbox.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "agent-sandbox.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* namespace.name, or the release namespace when it is empty. */}}
{{- define "agent-sandbox.namespace" -}}
{{- default .Release.Namespace .Values.namespace.name -}}
{{- end -}}

{{- define "agent-sandbox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agent-sandbox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agent-sandbox.labels" -}}
helm.sh/chart: {{ include "agent-sandbox.chart" . }}
{{ include "agent-sandbox.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.image.tag }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The controller image; the tag is required (upstream's chart has no appVersion to fall back on). */}}
{{- define "agent-sandbox.image" -}}
{{- if not .Values.image.tag -}}
{{- fail "image.tag is required: set it with --set image.tag=<version>" -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{/* A flag value as the user wrote it: whole numbers read from YAML (float64) print without exponent. */}}
{{- define "agent-sandbox.flagValue" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* Router (beyond upstream's chart). */}}
{{- define "agent-sandbox.router.selectorLabels" -}}
app.kubernetes.io/name: sandbox-router
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: sandbox-router
{{- end -}}

{{- define "agent-sandbox.router.labels" -}}
helm.sh/chart: {{ include "agent-sandbox.chart" . }}
{{ include "agent-sandbox.router.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.image.tag }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "agent-sandbox.router.image" -}}
{{- $tag := default .Values.image.tag .Values.router.image.tag -}}
{{- if not $tag -}}
{{- fail "router.image.tag (or image.tag) is required when router.enabled=true" -}}
{{- end -}}
{{- printf "%s:%s" .Values.router.image.repository $tag -}}
{{- end -}}

{{/*
Switches of the parts beyond upstream's chart: "true" or empty. An upgrade with --reuse-values renders with
the defaults of the chart that made the release, so a release first installed from upstream's chart (or an
older copy of this one) has no `router` or `lifecycle` map at all: a missing map means off, its default,
instead of a nil-pointer error. Turning the router on in such an upgrade would render with none of its other
defaults, so that is refused, naming the way out.
*/}}
{{- define "agent-sandbox.router.enabled" -}}
{{- $r := .Values.router | default dict -}}
{{- if $r.enabled -}}
{{- if not (hasKey $r "image") -}}
{{- fail "router.enabled=true, but this release's stored values have none of the router's defaults (they come from a chart without the router, and --reuse-values keeps that chart's defaults): upgrade with --reset-then-reuse-values instead of --reuse-values" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{- define "agent-sandbox.lifecycle.enabled" -}}
{{- if (.Values.lifecycle | default dict).enabled -}}
true
{{- end -}}
{{- end -}}

{{- define "agent-sandbox.router.lifecycle.enabled" -}}
{{- if and (include "agent-sandbox.router.enabled" .) (.Values.router.lifecycle | default dict).enabled -}}
true
{{- end -}}
{{- end -}}
