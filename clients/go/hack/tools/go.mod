// Pinned code generators and linters for the Go SDK (not imported by the SDK; kept out of its go.mod so
// users of the SDK never download them). Build with `go build -o <dir> <pkg>` from this directory.
module agent-sandbox.invalid/clients/go/hack/tools

go 1.26.0

require (
	google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.5.1
	google.golang.org/protobuf v1.36.8
	honnef.co/go/tools v0.8.2
)

require (
	github.com/BurntSushi/toml v1.4.1-0.20240526193622-a339e1f7089c // indirect
	golang.org/x/exp/typeparams v0.0.0-20231108232855-2478ac86f678 // indirect
	golang.org/x/mod v0.41.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/tools v0.51.0 // indirect
)
