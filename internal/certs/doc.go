// Package certs makes and loads the X.509 material of farmem's mutual TLS:
// a small certificate authority, node certificates (server and client use:
// poold's TCP control plane and its calls to peers) and client certificates
// (memctl, alloc over tcp://). Init is what `memctl certs init` runs; the
// test harnesses call it once per test binary (ECDSA P-256 keys make that a
// few milliseconds).
//
// The identity of a TLS peer is its certificate's common name: Identity
// reads it from a verified connection, and poold records it as the owner
// identity of the segments that peer allocates.
// A node's name is its certificate's common name too: CheckName refuses a
// peer dialed as one node that presents another's certificate.
//
// Everything is the standard library (crypto/x509, crypto/ecdsa,
// crypto/tls). Functions are safe for concurrent use; Init writes files and
// must not run twice at once on one directory. Pure Go, any OS.
package certs
