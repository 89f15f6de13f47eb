#!/usr/bin/env bash
# Generate the Go stubs of process.v1 (internal/processv1/*.pb.go) from the one .proto the runtime serves
# (src/agent_sandbox/api/processv1/process.proto), so client and server can never disagree.
#
#   clients/go/hack/gen-proto.sh          regenerate
#   clients/go/hack/gen-proto.sh --check  exit 1 if the checked-in stubs differ from a fresh generation
#
# protoc comes from grpcio-tools (a dev dependency of the Python project: .venv/bin/python); the plugins
# protoc-gen-go / protoc-gen-go-grpc are built at the versions pinned in hack/tools/go.mod. The protoc version
# line in the generated header is normalised (it would otherwise change with every grpcio-tools release).
set -euo pipefail
GO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
ROOT="$(cd "$GO_DIR/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
PROTO="${PROTO:-$ROOT/src/agent_sandbox/api/processv1/process.proto}"
OUT="$GO_DIR/internal/processv1"
GO_PKG="agent-sandbox.invalid/clients/go/internal/processv1"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/process/v1" "$tmp/bin" "$tmp/out"
cp "$PROTO" "$tmp/src/process/v1/process.proto"
(cd "$GO_DIR/hack/tools" && go build -o "$tmp/bin/" \
  google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc)
include="$("$PY" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')"
"$PY" -m grpc_tools.protoc -I"$tmp/src" -I"$include" \
  --plugin=protoc-gen-go="$tmp/bin/protoc-gen-go" --plugin=protoc-gen-go-grpc="$tmp/bin/protoc-gen-go-grpc" \
  --go_out="$tmp/out" --go_opt=paths=source_relative --go_opt="Mprocess/v1/process.proto=$GO_PKG;processv1" \
  --go-grpc_out="$tmp/out" --go-grpc_opt=paths=source_relative \
  --go-grpc_opt="Mprocess/v1/process.proto=$GO_PKG;processv1" \
  process/v1/process.proto
for f in process.pb.go process_grpc.pb.go; do
  sed -E 's#^(//[[:space:]]+)(- )?protoc[[:space:]]+v[0-9.]+.*$#\1\2protoc        (grpcio-tools)#' \
    "$tmp/out/process/v1/$f" >"$tmp/out/$f"
done

if [ "${1:-}" = "--check" ]; then
  status=0
  for f in process.pb.go process_grpc.pb.go; do
    if ! diff -u "$OUT/$f" "$tmp/out/$f"; then status=1; fi
  done
  [ "$status" -eq 0 ] || echo "clients/go/internal/processv1 is stale: run clients/go/hack/gen-proto.sh" >&2
  exit "$status"
fi
mkdir -p "$OUT"
cp "$tmp/out/process.pb.go" "$tmp/out/process_grpc.pb.go" "$OUT/"
echo "wrote $OUT/process.pb.go $OUT/process_grpc.pb.go"
