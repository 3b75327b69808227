// Pinned development tool, run with `go tool -modfile=tools/protoc/go.mod NAME`; one module per tool so
// that their dependencies never constrain each other or the main module.
module crust.dev/crust/tools/protoc

go 1.26

tool (
	github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc
	google.golang.org/grpc/cmd/protoc-gen-go-grpc
	google.golang.org/protobuf/cmd/protoc-gen-go
)

require (
	github.com/containerd/ttrpc v1.2.10 // indirect
	google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.2 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
