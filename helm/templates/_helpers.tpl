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

{{/* "true" or "false": with authzMode tokenreview, refuse a request without a token
(--authz-tokenreview-require-token). router.tokenReviewRequireToken; absent or null (values of an older chart,
--reuse-values) means true. Not `default`, which would turn an explicit false into true. The binary's own
default is upstream's transitional false (docs/router.md). */}}
{{- define "agent-sandbox.router.requireToken" -}}
{{- $r := .Values.router | default dict -}}
{{- if and (hasKey $r "tokenReviewRequireToken") (not (kindIs "invalid" $r.tokenReviewRequireToken)) -}}
{{- ternary "true" "false" (eq (toString $r.tokenReviewRequireToken) "true") -}}
{{- else -}}
true
{{- end -}}
{{- end -}}

{{/* Where the controller's Lease lives: the namespace the binary elects in, i.e. the last
--leader-election-namespace it is given - a controller.extraArgs one (`--flag=v`, `--flag v`, one dash or two,
as Go's flag package reads them; extraArgs come after the named flags, so it wins) over
controller.leaderElectionNamespace; empty or null: the binary auto-detects its own namespace, the chart's.
Until December 7 extraArgs were not read: the Role stayed in the chart's namespace while the controller
elected elsewhere, and got Forbidden on its Lease. Values from other chart versions may lack `controller`. */}}
{{- define "agent-sandbox.leaderElectionNamespace" -}}
{{- $c := .Values.controller | default dict -}}
{{- $ns := include "agent-sandbox.leaderElectionNamespace.lastIn" (dict "args" ($c.extraArgs | default list) "ns" ($c.leaderElectionNamespace | default "")) -}}
{{- $ns | default (include "agent-sandbox.namespace" .) -}}
{{- end -}}

{{/* The last --leader-election-namespace value in .args (any form Go's flag package reads), else .ns. */}}
{{- define "agent-sandbox.leaderElectionNamespace.lastIn" -}}
{{- $ns := .ns -}}
{{- $valueNext := false -}}
{{- range .args -}}
{{- $arg := toString . -}}
{{- if $valueNext -}}
{{- $ns = $arg -}}
{{- $valueNext = false -}}
{{- else if regexMatch "^--?leader-election-namespace$" $arg -}}
{{- $valueNext = true -}}
{{- else if regexMatch "^--?leader-election-namespace=" $arg -}}
{{- $ns = regexReplaceAll "^--?leader-election-namespace=" $arg "" -}}
{{- end -}}
{{- end -}}
{{- $ns -}}
{{- end -}}

{{/*
The namespaces that get the leader-election Role and RoleBinding, as a JSON list: the one this revision
elects in, and, in an upgrade that moves it, the one the live controller Deployment (this release's) still
elects in. Helm applies the new objects and deletes the ones that left the manifest before the old pods stop,
so without the second the old leader lost its grant while it still held its Lease: Forbidden on renew and on
release, and a Lease left held in the old namespace (inst12 finding 2). The live Deployment's arguments are
what the previous revision rendered, so the old grant stays for exactly one revision: the next upgrade finds
the new namespace in them and drops it. `lookup` answers nothing in `helm template` and --dry-run=client, and
`helm rollback` applies the stored manifest without rendering: neither keeps it (helm/README.md).
*/}}
{{- define "agent-sandbox.leaderElectionNamespaces" -}}
{{- $want := include "agent-sandbox.leaderElectionNamespace" . -}}
{{- $all := list $want -}}
{{- $dep := lookup "apps/v1" "Deployment" (include "agent-sandbox.namespace" .) "agent-sandbox-controller" -}}
{{- if $dep -}}
{{- $ann := $dep.metadata.annotations | default dict -}}
{{- $ours := and (eq (index $ann "meta.helm.sh/release-name" | default "") .Release.Name) (eq (index $ann "meta.helm.sh/release-namespace" | default "") .Release.Namespace) -}}
{{- range ((($dep.spec | default dict).template | default dict).spec | default dict).containers | default list -}}
{{- if and $ours (eq .name "agent-sandbox-controller") -}}
{{- $live := include "agent-sandbox.leaderElectionNamespace.lastIn" (dict "args" (.args | default list) "ns" "") | default (include "agent-sandbox.namespace" $) -}}
{{- $all = append $all $live | uniq -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $all -}}
{{- end -}}

{{- define "agent-sandbox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agent-sandbox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
image.tag as a label value. A valid image tag is not always a valid label value: a digest-pinned reference
(`v0.1.0@sha256:<64 hex>`) has `@` and `:` and is longer than 63 bytes, and the API server would refuse
every labelled object, failing the install half-way. Other characters become `_`, it is cut to 63 bytes and
non-alphanumeric ends are trimmed; empty when nothing is left (no label then).
*/}}
{{- define "agent-sandbox.versionLabel" -}}
{{- $v := regexReplaceAll "[^A-Za-z0-9._-]" (toString (.Values.image.tag | default "")) "_" -}}
{{- $v = regexReplaceAll "^[^A-Za-z0-9]+" $v "" | trunc 63 -}}
{{- regexReplaceAll "[^A-Za-z0-9]+$" $v "" -}}
{{- end -}}

{{- define "agent-sandbox.labels" -}}
helm.sh/chart: {{ include "agent-sandbox.chart" . }}
{{ include "agent-sandbox.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with include "agent-sandbox.versionLabel" . }}
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
{{- with include "agent-sandbox.versionLabel" . }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
The router image; its tag defaults to image.tag, except a digest-pinned one (`v0.1.0@sha256:<digest>`): the
digest is the controller image's, and `sandbox-router:v0.1.0@sha256:<controller digest>` cannot be pulled
(the pod would stay in ImagePullBackOff), so router.image.tag must be given.
*/}}
{{- define "agent-sandbox.router.image" -}}
{{- $tag := .Values.router.image.tag -}}
{{- if not $tag -}}
{{- $tag = .Values.image.tag -}}
{{- if contains "@" (toString ($tag | default "")) -}}
{{- fail "image.tag is digest-pinned, and a digest names one image: set router.image.tag (the router image's own tag or tag@digest) when router.enabled=true" -}}
{{- end -}}
{{- end -}}
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

{{/*
Whether `lookup` reads the cluster: "true" or empty. It answers nothing, as if nothing existed, in `helm
template` (with --validate too) and in an install or upgrade with --dry-run / --dry-run=client, although
those still run Helm's ownership check against the cluster. The probe is the `default` Namespace, which
every cluster has (the API server makes it and refuses to delete it); not the release namespace, which
`helm install --create-namespace` creates only after rendering.
*/}}
{{- define "agent-sandbox.lookup.live" -}}
{{- if lookup "v1" "Namespace" "" "default" -}}
true
{{- end -}}
{{- end -}}

{{/*
Whether this revision renders the SandboxArchive CRD: "true" or empty. With lifecycle on, always. With it off
too when it can be, so that the revision's manifest holds it: `helm rollback` applies the target revision's
manifest and does not adopt, so a rollback from a revision without the CRD to one with it fails (`no
CustomResourceDefinition with the name ... found`; the CRD, kept by its helm.sh/resource-policy: keep when it
left the manifest, is still there). With lifecycle off it is rendered when it does not exist or is this
release's, and left alone when it exists and is not (made by `k8s/lifecycle`, or kept from a release under
another name or namespace), so that it does not fail the install with Helm's ownership check; with lifecycle
on it is rendered and Helm's check says how it is owned (helm/README.md says how to hand it over). When
`lookup` cannot tell (`helm template`, --dry-run=client: see agent-sandbox.lookup.live) it is rendered with
lifecycle on only, as a dry run would otherwise fail on a CRD that the real install leaves alone.
*/}}
{{- define "agent-sandbox.lifecycle.crd" -}}
{{- if include "agent-sandbox.lifecycle.enabled" . -}}
true
{{- else if include "agent-sandbox.lookup.live" . -}}
{{- $crd := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "sandboxarchives.lifecycle.agents.x-k8s.io" -}}
{{- $ann := ($crd.metadata | default dict).annotations | default dict -}}
{{- $ours := and (eq (index $ann "meta.helm.sh/release-name" | default "") .Release.Name) (eq (index $ann "meta.helm.sh/release-namespace" | default "") .Release.Namespace) -}}
{{- if or (not $crd) $ours -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "agent-sandbox.router.lifecycle.enabled" -}}
{{- if and (include "agent-sandbox.router.enabled" .) (.Values.router.lifecycle | default dict).enabled -}}
true
{{- end -}}
{{- end -}}

{{/*
The chart's Services under their effective names (the ones the templates render): two under one name would
be one object, the later template's selector and ports winning, and the other Service's clients reaching the
wrong pods or port. Refused, naming both values. Included by service.yaml, which every install renders.
*/}}
{{- define "agent-sandbox.serviceNames.check" -}}
{{- $names := list (list "service.name" .Values.service.name) (list "webhookServiceName" (.Values.webhookServiceName | default "agent-sandbox-webhook-service")) -}}
{{- if include "agent-sandbox.router.enabled" . -}}
{{- $names = append $names (list "router.service.name" .Values.router.service.name) -}}
{{- end -}}
{{- range $i, $a := $names -}}
{{- range $b := slice $names (add1 $i) -}}
{{- if eq (index $a 1) (index $b 1) -}}
{{- fail (printf "%s and %s are both %q: two of the chart's Services would be one object (with one's selector and ports), so give them different names" (index $a 0) (index $b 0) (index $a 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Namespaces this release created that this revision would drop (namespace.create=false, or another
namespace.name): Helm deletes an object that leaves the manifest, and deleting a Namespace deletes everything
in it - the controller, its webhook Secret, the router, sandboxes there. Refused, unless the Namespace was
handed over first with helm.sh/resource-policy: keep (Helm then leaves it when it leaves the manifest). Only
in an upgrade against a cluster: `lookup` answers nothing in `helm template` and --dry-run=client.
*/}}
{{- define "agent-sandbox.namespace.check" -}}
{{- if .Release.IsUpgrade -}}
{{- $keep := "" -}}
{{- if .Values.namespace.create -}}
{{- $keep = include "agent-sandbox.namespace" . -}}
{{- end -}}
{{- range $ns := (lookup "v1" "Namespace" "" "").items | default list -}}
{{- $ann := $ns.metadata.annotations | default dict -}}
{{- $ours := and (eq (index $ann "meta.helm.sh/release-name" | default "") $.Release.Name) (eq (index $ann "meta.helm.sh/release-namespace" | default "") $.Release.Namespace) -}}
{{- if and $ours (ne $ns.metadata.name $keep) (not $ns.metadata.deletionTimestamp) (ne (index $ann "helm.sh/resource-policy" | default "") "keep") -}}
{{- fail (printf "this upgrade (namespace.create=%v, namespace.name=%q) would delete Namespace %q, which release %s created, and everything in it (the controller, its webhook Secret, the router, any sandboxes there). Keep namespace.create=true and namespace.name=%s, or hand the Namespace over first - kubectl annotate namespace %s helm.sh/resource-policy=keep - and Helm leaves it in place" $.Values.namespace.create (include "agent-sandbox.namespace" $) $ns.metadata.name $.Release.Name $ns.metadata.name $ns.metadata.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
nameOverride (app.kubernetes.io/name) is in the controller Deployment's selector, which the API server
refuses to change; Helm would have re-pointed the Services at the new labels before the Deployment fails,
leaving them selecting no pod. So on a live release a different selector is refused before anything is
applied: nameOverride is install-time only.
*/}}
{{- define "agent-sandbox.selector.check" -}}
{{- $dep := lookup "apps/v1" "Deployment" (include "agent-sandbox.namespace" .) "agent-sandbox-controller" -}}
{{- if $dep -}}
{{- $ann := $dep.metadata.annotations | default dict -}}
{{- $ours := and (eq (index $ann "meta.helm.sh/release-name" | default "") .Release.Name) (eq (index $ann "meta.helm.sh/release-namespace" | default "") .Release.Namespace) -}}
{{- $live := (($dep.spec | default dict).selector | default dict).matchLabels | default dict -}}
{{- $want := include "agent-sandbox.selectorLabels" . | fromYaml -}}
{{- if and $ours (ne (toJson $live) (toJson $want)) -}}
{{- fail (printf "nameOverride is install-time only: the controller Deployment's selector (%s) cannot change to %s (the API server refuses, after the Services were re-pointed at it). Upgrade with the nameOverride the release was installed with (%q), or uninstall and install again" (toJson $live) (toJson $want) (index $live "app.kubernetes.io/name" | default "")) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The router PodDisruptionBudget's minAvailable, refused when it leaves no pod to evict (every node drain would
wait for it forever): an integer of router.replicaCount or more, or a percentage that Kubernetes rounds up to
that many. An empty string when it allows an eviction.
*/}}
{{- define "agent-sandbox.router.pdb.check" -}}
{{- $min := .Values.router.podDisruptionBudget.minAvailable -}}
{{- $replicas := int .Values.router.replicaCount -}}
{{- $pods := 0 -}}
{{- if kindIs "string" $min -}}
{{- if not (regexMatch "^[0-9]+%$" $min) -}}
{{- fail (printf "router.podDisruptionBudget.minAvailable must be a whole number or a percentage such as 50%%, not %q" $min) -}}
{{- end -}}
{{- /* ceil(p * replicas / 100) in integers */ -}}
{{- $pods = div (add (mul (atoi (trimSuffix "%" $min)) $replicas) 99) 100 -}}
{{- else -}}
{{- $pods = int $min -}}
{{- end -}}
{{- if ge (int $pods) $replicas -}}
{{- fail (printf "router.podDisruptionBudget.minAvailable=%v of router.replicaCount=%d allows no voluntary disruption: every node drain would wait for it forever. Set it below the replica count (e.g. 1, or 50%%), or router.podDisruptionBudget.enabled=false" $min $replicas) -}}
{{- end -}}
{{- end -}}
