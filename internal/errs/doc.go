// Package errs holds farmem's sentinel errors and the one table that maps
// them to gRPC status codes and back, so that the daemon can return them over
// the control plane and the client library can hand the same sentinels to
// applications (package alloc re-exports them).
//
// Everything here is safe for concurrent use; the sentinels are immutable.
package errs
