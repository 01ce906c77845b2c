#!/usr/bin/env bash
# Regenerates pool.pb.go and pool_grpc.pb.go from pool.proto.
# Needs protoc (Debian: apt-get install protobuf-compiler); installs the Go
# plugins at the versions below into a private directory.
set -euo pipefail
cd "$(dirname "$0")"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
GOBIN="$bin" go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.11
GOBIN="$bin" go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
PATH="$bin:$PATH" protoc --go_out=. --go_opt=paths=source_relative \
  --go-grpc_out=. --go-grpc_opt=paths=source_relative pool.proto
