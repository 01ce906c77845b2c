// Package poolv1 holds the gRPC control-plane API of poold, generated from
// pool.proto by generate.sh. Do not edit the .pb.go files by hand. ListAll
// (list.go, written by hand) pages through List for its callers.
//
// The generated client and server types are safe for concurrent use as
// grpc-go documents; message values are not.
package poolv1
