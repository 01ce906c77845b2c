// Package session is a client's connection to a poold's control plane: a
// gRPC channel plus the Session stream that keeps the client's lease alive,
// re-established with backoff when it breaks (the daemon restarted, the
// network flapped). The client library (alloc) uses it towards the local
// daemon over its unix socket; poold uses it towards its peers over TCP,
// where one session per peer keeps all the peer-held segments alive.
//
// A Conn is safe for concurrent use.
package session
