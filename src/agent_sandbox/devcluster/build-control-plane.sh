#!/usr/bin/env bash
# Build the local control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# etcd, kwok) and helm v3 from the official Go modules into a cache keyed on versions + Go version.
# Usage: hack/build-control-plane.sh [OUT_DIR]
# Why a script: it is plain `go` plumbing; the Python devcluster calls it and streams its output.
set -euo pipefail

KV="${AGENT_SANDBOX_K8S_VERSION:-1.35.4}"
ETCD_V="${AGENT_SANDBOX_ETCD_VERSION:-3.6.5}"
KWOK_V="${AGENT_SANDBOX_KWOK_VERSION:-0.8.0}"
HELM_V="${AGENT_SANDBOX_HELM_VERSION:-3.20.2}"
CACHE="${AGENT_SANDBOX_CACHE:-$HOME/.cache/agent-sandbox}"
GOV="$(go env GOVERSION)"
OUT="${1:-$CACHE/bin/k8s-v$KV-etcd-v$ETCD_V-kwok-v$KWOK_V-$GOV-$(go env GOARCH)}"
WORK="$CACHE/build"
export GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-buildvcs=false -mod=mod"

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
mkdir -p "$OUT" "$WORK"

have() { for b in "$@"; do [ -x "$OUT/$b" ] || return 1; done; }

MINOR=$(echo "$KV" | cut -d. -f2)
SV="0.${KV#1.}"

if ! have kube-apiserver kube-controller-manager kube-scheduler kubectl; then
  d="$WORK/k8s-v$KV"; mkdir -p "$d"; cd "$d"
  log "resolving k8s.io/kubernetes v$KV"
  upstream=$(go mod download -json "k8s.io/kubernetes@v$KV" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  goline=$(awk '$1=="go"{print $2; exit}' "$upstream")
  staging=$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$upstream" | sort -u)
  {
    printf 'module example.local/k8sbuild\n\ngo %s\n\ngodebug default=go%s\n\n' "$goline" "${goline%.*}"
    printf 'require k8s.io/kubernetes v%s\n\nreplace (\n' "$KV"
    for m in $staging; do printf '\t%s => %s v%s\n' "$m" "$m" "$SV"; done
    printf ')\n'
  } > go.mod
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  log "go mod tidy (downloads a few hundred MB on a cold cache)"
  go mod tidy
  LDF="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDF="$LDF -X $p.gitVersion=v$KV -X $p.gitMajor=1 -X $p.gitMinor=$MINOR -X $p.gitTreeState=clean"
  done
  log "go build kube-apiserver kube-controller-manager kube-scheduler kubectl (15-30 min cold on 2 cores)"
  go build -p 2 -trimpath -tags selinux,notest -ldflags "$LDF" -o "$OUT/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
fi

if ! have etcd; then
  d="$WORK/etcd-v$ETCD_V"; rm -rf "$d"; mkdir -p "$d"; cd "$d"
  log "building etcd v$ETCD_V"
  go mod init example.local/etcdbuild >/dev/null 2>&1
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
  go get "go.etcd.io/etcd/server/v3@v$ETCD_V"
  go mod tidy
  go build -trimpath -ldflags "-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3
fi

if ! have kwok; then
  log "building kwok v$KWOK_V"
  GOBIN="$OUT" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_V"
fi

# helm is not part of the directory's key (adding it would rebuild everything); its version is stamped
# next to it instead, so a pin bump rebuilds only helm.
if ! have helm || [ "$(cat "$OUT/helm.version" 2>/dev/null)" != "$HELM_V" ]; then
  log "building helm v$HELM_V (2-4 min cold; shares k8s.io modules with the build above)"
  GOBIN="$OUT" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_V -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    "helm.sh/helm/v3/cmd/helm@v$HELM_V"
  echo "$HELM_V" > "$OUT/helm.version"
fi

log "done: $OUT"
echo "$OUT"
