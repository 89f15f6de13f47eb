#!/usr/bin/env bash
# migrate.sh - agent-sandbox v1alpha1 -> v1beta1 migration helper (docs/api-migration-guide.md).
#
# Two phases; both only need kubectl, both are idempotent and both support --dry-run:
#
#   --phase=bootstrap  Creates the SandboxWarmPool `shadow-pool-<template>` (replicas 0, annotated
#                      agents.x-k8s.io/migration-shadow: "true" and
#                      agents.x-k8s.io/migration-source-template: <template>) in every namespace where
#                      a cold-start v1alpha1 claim needs it. A v1alpha1 claim that names only a template
#                      (warmpool unset, "default" or "none") is served as a v1beta1 claim whose
#                      warmPoolRef is `shadow-pool-<template>`; without that pool the claim stays
#                      Ready=False/WarmPoolNotFound. With --all-templates, one for every template.
#                      Run it before the upgrade, and again whenever a legacy client has created new
#                      template-only claims since (the controller never creates these pools).
#
#   --phase=migrate    Stamps agents.x-k8s.io/storage-migrated-at=<now> on every SandboxWarmPool,
#                      SandboxTemplate, Sandbox and SandboxClaim, so the API server rewrites each one in
#                      the current storage version (v1beta1). Run it after the upgrade, then prune the
#                      CRDs' status.storedVersions to ["v1beta1"].
#
# Which claims need a shadow pool: when the API server serves v1beta1, the claims are read as v1beta1
# and every warmPoolRef that starts with `shadow-pool-` names one (conversion already applied the rule
# of api spec 8.4). When it serves only v1alpha1 (an upstream v0.4.x install before the upgrade), the
# rule is applied here as this project's conversion applies it: warmpool unset/default/none and no
# warm adoption recorded (the claim's assignment record - annotation agents.x-k8s.io/sandbox-name, else
# the legacy label of that key - empty or equal to the claim's name; not status.sandbox.name, which a
# /status write can change: docs/design/api-quirks.md). Claims naming a specific pool need none; a specific pool that
# does not exist is listed for the operator.
#
# Writes go through v1beta1 whenever it is served: a write through v1alpha1 would briefly drop the
# v1beta1-only status fields (docs/design/api-quirks.md).
#
# Exit status: 0 done (or nothing to do), 1 some object failed (see the log; re-run), 2 usage error.

# shellcheck disable=SC2046 # $(scope) expands to one flag, unquoted on purpose
set -euo pipefail

readonly SHADOW_POOL_PREFIX="shadow-pool-"
readonly ANNOTATION_SHADOW="agents.x-k8s.io/migration-shadow"
readonly ANNOTATION_SOURCE_TEMPLATE="agents.x-k8s.io/migration-source-template"
readonly ANNOTATION_MIGRATED_AT="agents.x-k8s.io/storage-migrated-at"
readonly CORE_GROUP="agents.x-k8s.io"
readonly EXT_GROUP="extensions.agents.x-k8s.io"
readonly MAX_NAME=63

PHASE=""
NAMESPACE=""
DRY_RUN="${MIGRATE_DRY_RUN:-false}"
ALL_TEMPLATES="false"
KUBECTL="${KUBECTL:-kubectl}"
KUBECTL_ARGS=()

usage() {
  cat <<EOF
Usage: $0 --phase=bootstrap|migrate [options]

  --phase=PHASE         bootstrap (before the upgrade) or migrate (after it). Required.
  --dry-run             Only read: print what would be created or stamped.
  --namespace=NS, -n NS Only this namespace.
  --all-namespaces, -A  Every namespace (the default).
  --all-templates       bootstrap: a shadow pool for every SandboxTemplate, not only for the
                        templates cold-start claims name today.
  --kubectl=PATH        kubectl binary (default: \$KUBECTL, else kubectl on PATH).
  --kubeconfig=PATH     Passed to kubectl.
  --context=NAME        Passed to kubectl.
  -h, --help            This text.

Environment: KUBECTL (binary), MIGRATE_DRY_RUN=true (same as --dry-run).
Back up all four kinds first; see docs/api-migration-guide.md.
EOF
}

die_usage() {
  echo "ERROR: $*" >&2
  usage >&2
  exit 2
}

while (($# > 0)); do
  arg="$1"
  shift
  case "$arg" in
    --phase=*) PHASE="${arg#*=}" ;;
    --phase) (($# > 0)) || die_usage "--phase needs a value"; PHASE="$1"; shift ;;
    --namespace=*) NAMESPACE="${arg#*=}"; [[ -n "$NAMESPACE" ]] || die_usage "--namespace needs a value (--all-namespaces for all)" ;;
    --namespace | -n) (($# > 0)) && [[ -n "$1" ]] || die_usage "$arg needs a value (--all-namespaces for all)"; NAMESPACE="$1"; shift ;;
    --all-namespaces | -A) NAMESPACE="" ;;
    --all-templates) ALL_TEMPLATES="true" ;;
    --dry-run) DRY_RUN="true" ;;
    --kubectl=*) KUBECTL="${arg#*=}" ;;
    --kubectl) (($# > 0)) || die_usage "--kubectl needs a value"; KUBECTL="$1"; shift ;;
    --kubeconfig=* | --context=*) KUBECTL_ARGS+=("$arg") ;;
    --kubeconfig | --context) (($# > 0)) || die_usage "$arg needs a value"; KUBECTL_ARGS+=("$arg=$1"); shift ;;
    -h | --help) usage; exit 0 ;;
    *) die_usage "unknown argument: $arg" ;;
  esac
done

case "$PHASE" in
  bootstrap | migrate) ;;
  "") die_usage "--phase is required" ;;
  *) die_usage "--phase must be bootstrap or migrate (got: $PHASE)" ;;
esac
[[ "$DRY_RUN" == "true" || "$DRY_RUN" == "false" ]] || die_usage "MIGRATE_DRY_RUN must be true or false"

# Log lines go to fd 3 (stdout): functions whose stdout is captured still log to the terminal.
exec 3>&1
log() { echo "[migrate:$PHASE] $*" >&3; }
warn() { echo "[migrate:$PHASE] WARN: $*" >&2; }
err() { echo "[migrate:$PHASE] ERROR: $*" >&2; }

kctl() { "$KUBECTL" ${KUBECTL_ARGS[@]+"${KUBECTL_ARGS[@]}"} "$@"; }

# scope: the namespace flags of a list.
scope() {
  if [[ -n "$NAMESPACE" ]]; then
    printf '%s\n' "--namespace=$NAMESPACE"
  else
    printf '%s\n' "--all-namespaces"
  fi
}

SERVED=""
POOLS=""
# served GROUP VERSION: whether the API server serves GROUP/VERSION (discovery, no RBAC needed).
served() { grep -qxF "$1/$2" <<<"$SERVED"; }

# resource PLURAL GROUP: the fully qualified resource name, pinned to v1beta1 when it is served.
resource() {
  if served "$2" v1beta1; then
    echo "$1.v1beta1.$2"
  else
    echo "$1.v1alpha1.$2"
  fi
}

# --------------------------------------------------------------------------- bootstrap

# needed_pairs: "<namespace>\t<template>" of every shadow pool the claims (and, with --all-templates,
# the templates) in scope need, unsorted. Fails when a list fails: "no claims" must never be a
# listing error in disguise (missing RBAC would otherwise end in a silent success).
needed_pairs() {
  local claims out
  # Every pool in scope, listed once ("<namespace>/<name>"): claims on a pool of their own are checked
  # against it without one request per claim.
  POOLS="$(kctl get "$(resource sandboxwarmpools "$EXT_GROUP")" $(scope) \
    -o jsonpath='{range .items[*]}{.metadata.namespace}{"/"}{.metadata.name}{"\n"}{end}')" || return 1
  if served "$EXT_GROUP" v1beta1; then
    claims="$(kctl get "sandboxclaims.v1beta1.$EXT_GROUP" $(scope) \
      -o jsonpath='{range .items[*]}{.metadata.namespace}{"\t"}{.metadata.name}{"\t"}{.spec.warmPoolRef.name}{"\n"}{end}')" || return 1
    local ns name pool
    while IFS=$'\t' read -r ns name pool; do
      [[ -n "$ns" ]] || continue
      if [[ "$pool" == "$SHADOW_POOL_PREFIX"* ]]; then
        printf '%s\t%s\n' "$ns" "${pool#"$SHADOW_POOL_PREFIX"}"
      else
        check_specific_pool "$ns" "$name" "$pool"
      fi
    done <<<"$claims"
  else
    claims="$(kctl get "sandboxclaims.v1alpha1.$EXT_GROUP" $(scope) \
      -o jsonpath='{range .items[*]}{.metadata.namespace}{"|"}{.metadata.name}{"|"}{.spec.sandboxTemplateRef.name}{"|"}{.spec.warmpool}{"|"}{.metadata.annotations.agents\.x-k8s\.io/sandbox-name}{"|"}{.metadata.labels.agents\.x-k8s\.io/sandbox-name}{"\n"}{end}')" || return 1
    local ns name template warmpool sandbox label
    # "|" (never in a Kubernetes name), not a tab: bash's read folds adjacent whitespace delimiters, so an
    # empty `warmpool` took the bound Sandbox's name and an empty template skipped the error below.
    while IFS='|' read -r ns name template warmpool sandbox label; do
      [[ -n "$ns" ]] || continue
      sandbox="${sandbox:-$label}" # the assignment record: the annotation, else the legacy label
      case "$warmpool" in
        "" | default | none)
          if [[ -n "$sandbox" && "$sandbox" != "$name" ]]; then
            log "claim $ns/$name: warm-started from a pool that exists (Sandbox $sandbox); no shadow pool"
          elif [[ -z "$template" ]]; then
            err "claim $ns/$name names no template; cannot tell which shadow pool it needs"
            echo "ERROR" # counted by the caller
          else
            printf '%s\t%s\n' "$ns" "$template"
          fi
          ;;
        *) check_specific_pool "$ns" "$name" "$warmpool" ;;
      esac
    done <<<"$claims"
  fi
  if [[ "$ALL_TEMPLATES" == "true" ]]; then
    out="$(kctl get "$(resource sandboxtemplates "$EXT_GROUP")" $(scope) \
      -o jsonpath='{range .items[*]}{.metadata.namespace}{"\t"}{.metadata.name}{"\n"}{end}')" || return 1
    [[ -z "$out" ]] || printf '%s\n' "$out"
  fi
}

# check_specific_pool NS CLAIM POOL: a claim on a pool of its own; report it when the pool is missing.
check_specific_pool() {
  if ! grep -qxF "$1/$3" <<<"$POOLS"; then
    warn "claim $1/$2 names SandboxWarmPool \"$3\", which does not exist: create it (or change the claim); no shadow pool helps here"
  fi
}

# ensure_shadow_pool NS TEMPLATE: create shadow-pool-TEMPLATE unless it exists. Prints (stdout) one of
# created | exists | foreign | error.
ensure_shadow_pool() {
  local ns="$1" template="$2" pool="$SHADOW_POOL_PREFIX$2" pools shadow out
  pools="$(resource sandboxwarmpools "$EXT_GROUP")"
  if ((${#pool} > MAX_NAME)); then
    err "$ns/$pool: longer than $MAX_NAME characters (template \"$template\"); rename the template or point the claims at another pool"
    echo error
    return
  fi
  if ! shadow="$(kctl get "$pools" --namespace="$ns" "$pool" --ignore-not-found \
    -o go-template="{{if .metadata.annotations}}{{index .metadata.annotations \"$ANNOTATION_SHADOW\"}}{{end}}:found")"; then
    err "$ns/$pool: could not read it"
    echo error
    return
  fi
  if [[ "$shadow" == "true:found" ]]; then
    log "$ns/$pool exists"
    echo exists
    return
  elif [[ -n "$shadow" ]]; then
    # Someone's own pool of that name serves the claims as well; it is theirs to keep as it is.
    warn "$ns/$pool exists without $ANNOTATION_SHADOW: \"true\"; left as it is (the claims use it)"
    echo foreign
    return
  fi
  local template_found
  template_found="$(kctl get "$(resource sandboxtemplates "$EXT_GROUP")" --namespace="$ns" "$template" --ignore-not-found -o name 2>/dev/null || true)"
  [[ -n "$template_found" ]] || warn "$ns: SandboxTemplate \"$template\" does not exist; its claims need it as well as the pool"
  if [[ "$DRY_RUN" == "true" ]]; then
    log "DRY-RUN: would create $ns/$pool (replicas 0, template $template)"
    echo created
    return
  fi
  local version="v1alpha1"
  served "$EXT_GROUP" v1beta1 && version="v1beta1"
  local manifest
  manifest="$(printf '%s\n' \
    "apiVersion: $EXT_GROUP/$version" \
    "kind: SandboxWarmPool" \
    "metadata:" \
    "  name: \"$pool\"" \
    "  namespace: \"$ns\"" \
    "  annotations:" \
    "    $ANNOTATION_SHADOW: \"true\"" \
    "    $ANNOTATION_SOURCE_TEMPLATE: \"$template\"" \
    "spec:" \
    "  replicas: 0" \
    "  sandboxTemplateRef:" \
    "    name: \"$template\"")"
  if out="$(printf '%s\n' "$manifest" | kctl create --namespace="$ns" -f - 2>&1)"; then
    log "$ns/$pool created (replicas 0, template $template)"
    echo created
  elif [[ "$out" == *AlreadyExists* ]]; then
    log "$ns/$pool exists (created concurrently)"
    echo exists
  else
    err "$ns/$pool: create failed: $out"
    echo error
  fi
}

bootstrap_phase() {
  local pairs errors=0 created=0 exists=0 foreign=0 ns template outcome
  if ! pairs="$(needed_pairs)"; then
    err "listing SandboxClaims/SandboxTemplates failed (RBAC needs get/list on $EXT_GROUP); nothing created"
    return 1
  fi
  errors="$(grep -cx ERROR <<<"$pairs" || true)"
  pairs="$(grep -vx ERROR <<<"$pairs" | sort -u || true)"
  if [[ -z "$pairs" ]]; then
    log "no shadow pool needed"
  fi
  while IFS=$'\t' read -r ns template; do
    [[ -n "$ns" ]] || continue
    outcome="$(ensure_shadow_pool "$ns" "$template")"
    case "$outcome" in
      created) created=$((created + 1)) ;;
      exists) exists=$((exists + 1)) ;;
      foreign) foreign=$((foreign + 1)) ;;
      *) errors=$((errors + 1)) ;;
    esac
  done <<<"$pairs"
  local verb="created"
  [[ "$DRY_RUN" == "true" ]] && verb="would create"
  log "summary: $verb=$created exists=$exists not-a-shadow=$foreign errors=$errors"
  ((errors == 0))
}

# --------------------------------------------------------------------------- migrate

migrate_phase() {
  local now failures=0 stamped=0
  now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # Pools and templates before the Sandboxes and claims that point at them. One kubectl per kind and
  # namespace (`annotate --all`): one process per object would take hours on a large cluster.
  local kind items namespaces ns name out bad
  for kind in "sandboxwarmpools $EXT_GROUP" "sandboxtemplates $EXT_GROUP" "sandboxes $CORE_GROUP" \
    "sandboxclaims $EXT_GROUP"; do
    # shellcheck disable=SC2086 # two words: plural and group
    kind="$(resource $kind)"
    if ! items="$(kctl get "$kind" $(scope) \
      -o jsonpath='{range .items[*]}{.metadata.namespace}{"\t"}{.metadata.name}{"\n"}{end}')"; then
      err "listing $kind failed; skipped"
      failures=$((failures + 1))
      continue
    fi
    if [[ "$DRY_RUN" == "true" ]]; then
      while IFS=$'\t' read -r ns name; do
        [[ -n "$ns" ]] || continue
        log "DRY-RUN: would stamp $kind $ns/$name"
        stamped=$((stamped + 1))
      done <<<"$items"
      continue
    fi
    namespaces="$(cut -f1 <<<"$items" | sort -u)"
    while read -r ns; do
      [[ -n "$ns" ]] || continue
      if out="$(kctl annotate "$kind" --all --namespace="$ns" --overwrite \
        "$ANNOTATION_MIGRATED_AT=$now" 2>&1)"; then
        stamped=$((stamped + $(grep -c ' annotated$' <<<"$out" || true)))
      else
        err "stamping $kind in $ns: $out"
        stamped=$((stamped + $(grep -c ' annotated$' <<<"$out" || true)))
        bad="$(grep -vc ' annotated$' <<<"$out" || true)"
        failures=$((failures + (bad > 0 ? bad : 1)))
      fi
    done <<<"$namespaces"
  done
  local verb="stamped"
  [[ "$DRY_RUN" == "true" ]] && verb="would stamp"
  log "summary: $verb=$stamped failures=$failures ($ANNOTATION_MIGRATED_AT=$now)"
  ((failures == 0))
}

# --------------------------------------------------------------------------- main

if ! SERVED="$(kctl api-versions)"; then
  err "kubectl api-versions failed: is $KUBECTL configured for the cluster?"
  exit 1
fi
served "$EXT_GROUP" v1beta1 || served "$EXT_GROUP" v1alpha1 || {
  err "the API server serves no $EXT_GROUP version: are the agent-sandbox CRDs installed?"
  exit 1
}
log "kubectl=$KUBECTL dry-run=$DRY_RUN namespace=${NAMESPACE:-<all>}"
status=0
case "$PHASE" in
  bootstrap) bootstrap_phase || status=1 ;;
  migrate) migrate_phase || status=1 ;;
esac
exit "$status"
