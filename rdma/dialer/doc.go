// Package dialer picks the data-plane transport for a connection: libibverbs
// where this build and host have an RDMA device, else the TCP fallback. It
// exists so that code outside rdma/ (the client library) can reach the verbs
// backend, which is internal to rdma/.
//
// Dial is safe for concurrent use.
package dialer
