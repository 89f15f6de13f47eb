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
