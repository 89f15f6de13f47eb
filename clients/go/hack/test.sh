#!/usr/bin/env bash
# The Go SDK's CI checks (hack/test.sh calls this; `make test-go` too):
#   generated process.v1 stubs up to date -> gofmt -> go vet -> staticcheck -> go test -race, unit + e2e.
# The e2e package (build tag e2e) starts its own dev cluster + controller + router + local runner through
# tests/go_sdk_cluster.py and fails (never skips) when that cannot start.
#   --unit   everything except the e2e package (which needs the router, see hack/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${AGENT_SANDBOX_CACHE:-$HOME/.cache/agent-sandbox}"
ROOT="$(cd ../.. && pwd)"
export AGENT_SANDBOX_PYTHON="${AGENT_SANDBOX_PYTHON:-$ROOT/.venv/bin/python}"
TAGS=(-tags e2e)
if [ "${1:-}" = "--unit" ]; then
  TAGS=()
  shift
fi

echo "==> Go SDK: process.v1 stubs match src/agent_sandbox/api/processv1/process.proto"
hack/gen-proto.sh --check

echo "==> Go SDK: gofmt"
unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then echo "gofmt needed:"; echo "$unformatted"; exit 1; fi

echo "==> Go SDK: go vet"
go vet "${TAGS[@]}" ./...

echo "==> Go SDK: staticcheck"
version="$(cd hack/tools && go list -m -f '{{.Version}}' honnef.co/go/tools)"
staticcheck="$CACHE/go-tools/staticcheck-$version"
if [ ! -x "$staticcheck" ]; then
  mkdir -p "$CACHE/go-tools"
  (cd hack/tools && go build -o "$staticcheck" honnef.co/go/tools/cmd/staticcheck)
fi
"$staticcheck" "${TAGS[@]}" ./...

echo "==> Go SDK: go test -race ${TAGS[*]:-(unit only)}"
go test -race "${TAGS[@]}" -count=1 -timeout 20m "$@" ./...
