// Package verbs will be farmem's libibverbs backend for the rdma tier: real
// one-sided RDMA READ, WRITE, compare-and-swap and fetch-and-add executed by
// the NIC, with the remote CPU never involved.
//
// # Status
//
// Only a stub exists today: every build of this package returns an error for
// which errors.Is(err, rdma.ErrNotSupported) is true, so rdma.Pick falls back
// to the tcp transport. A plain `go build ./...` needs no C library.
//
// # The future backend
//
// The real backend lives in files tagged `//go:build linux && cgo && verbs`;
// this is the only package in farmem allowed to `import "C"`. It maps the
// rdma interfaces onto verbs one to one:
//
//   - Server (rdma.Exporter): ibv_open_device + ibv_alloc_pd once;
//     Export = ibv_reg_mr(mem, IBV_ACCESS_REMOTE_READ|REMOTE_WRITE|
//     REMOTE_ATOMIC|LOCAL_WRITE) on the already mapped segment; Revoke =
//     ibv_dereg_mr, which the NIC completes only after in-flight accesses end.
//     The NIC's rkey is 32 bits and guessable, so the 128-bit rdma.Key is
//     checked during connection setup (RC QP exchange over the tcp control
//     handshake) and rkeys are only handed to authenticated peers; epochs are
//     fenced by re-registering the MR (new rkey) when the epoch changes.
//   - Client (rdma.Conn): one RC queue pair per (client, peer) pair and CPU,
//     a completion queue polled by one goroutine; Read/Write/CAS/FADD post
//     IBV_WR_RDMA_READ / RDMA_WRITE / ATOMIC_CMP_AND_SWP /
//     ATOMIC_FETCH_AND_ADD work requests; Do posts a linked list of work
//     requests with one ibv_post_send and signals only the last.
//     Caller buffers must be registered memory, so the client copies through
//     a registered bounce pool unless the caller passes memory it registered.
//   - Errors: IBV_WC_REM_ACCESS_ERR → rdma.ErrAccessDenied, length errors →
//     rdma.ErrOutOfRange, a QP in error state → rdma.ErrClosed.
//
// A package outside the rdma tree cannot import this internal package; an
// exported wrapper (rdma/verbs) will expose its Transport when it is real.
//
// # Concurrency
//
// Transport is safe for concurrent use.
//
// # OS and tags
//
// The stub builds everywhere. The real backend needs Linux, cgo, libibverbs
// (Debian package libibverbs-dev) and the `verbs` build tag.
package verbs
