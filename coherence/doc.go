// Package coherence keeps the pages of a segment shared by several hosts
// coherent: a directory at the segment's home tracks, per page, which
// sharers hold it shared (each under a read lease) and which one holds it
// modified (keeping state only for pages held or asked for), and a
// sharer caches the pages it holds and answers the home's invalidations.
// CXL 3.0 does this in hardware (back-invalidation); CXL 2.0 pools and
// RDMA do not, so farmem does it in software.
//
// # State machines
//
// Directory (home) and Cache (sharer) are pure state machines: time comes in
// as arguments, messages (Message, plain values) go out as return values,
// and no goroutine or network is involved, so transcript tests and a
// randomized test that drops, duplicates and reorders messages drive them
// directly. Home and Sharer wrap them for real use: locking, a mailbox per
// sharer for the messages the home pushes, a background poll, lease renewal
// and retries; they take a Clock and a Link, never a socket.
//
// Per page the home is Invalid (no copies), Shared (sharers with read-lease
// expiries) or Modified (one owner). A ReadReq is granted at once unless an
// owner exists; a WriteReq at once unless others hold copies. Otherwise the
// home sends Invalidate to each conflicting holder (a downgrade to shared
// for a reader) and answers Wait; the Grant is pushed when every one of them
// has acknowledged (InvAck, carrying the owner's data) or its lease has run
// out. A lease counts on the sharer from when it sent its request, on the
// home from when it granted, so the sharer's copy always expires first: no
// write is granted while an unexpired, unacknowledged read lease exists, and
// a dead or partitioned sharer delays a writer by at most one lease. A
// Grant's Lease adds how long the home held the request (the request
// arrived after it was sent, so the sum still ends before the home's
// lease): a grant that waited most of a lease for invalidations still
// comes with a whole lease to use, time for the keeper to renew it. A
// resend of a request already granted (the sharer resends until answered,
// so a resend can cross the pushed grant, or find it lost) is granted
// again counting the hold from when the home first took the request.
// A modified page is written back on downgrade (in the InvAck), on Sync, by
// the sharer's keeper before its ownership lease runs out (which renews
// it), on eviction and on Close. Generations (one per grant), invalidation
// ids and write-back sequence numbers make every message idempotent:
// duplicates and stale messages are recognised and ignored.
//
// Atomics (CompareAndSwap64, FetchAdd64) run at the sharer under exclusive
// ownership of their page, like a CPU's atomics in its cache: a second
// atomic on a page the sharer still owns costs no message at all, and the
// home needs no atomic path of its own.
//
// # The wire and the callback path
//
// Messages ride the data plane (package rdma/tcp, opcode MSG): a request's
// payload is a batch of messages (see AppendBatch) addressed to a segment
// under its access key, the response's payload the batch of replies. The
// home calls sharers back without any connection from home to sharer: each
// sharer keeps one long poll (a Poll message on a connection of its own) at
// the home, which the home answers as soon as something is pushed to that
// sharer (an Invalidate, a Grant that had to wait) or after a quarter lease
// with nothing. Sharers behind NAT or in other network namespaces need no
// listening socket, and a sharer that stops polling simply stops
// acknowledging, which the lease bounds.
//
// A ReadReq or WriteReq that must wait for invalidations is held at the
// home for up to a twentieth of a lease (Home.HandleHeld) and answered with
// its Grant itself, so the requester needs neither the Wait nor its poll
// for the grant; only past that (a sharer that does not answer) does it get
// Wait and the pushed grant. Requests that may be held ride a connection of
// their own. A sharer's InvAcks ride its next poll (Home.Poll), so an
// invalidation costs the sharer no call and the home no reply; only an
// owner's InvAck, which carries its data, is a call of its own, answered
// OK, or Stale when the owner's lease had run out and the page moved on
// without it (the sharer then reports the loss), and Sync waits for it.
//
// Messages for a write to a page that two other hosts share: WriteReq
// (half a round trip), the home pushes Invalidate into both sharers' pending
// polls (half), each sharer's next poll carries its InvAck (half, in
// parallel), and the home answers the held WriteReq with the Grant (half):
// 2 network round trips on the critical path, 6 messages in all.
//
// # Guarantee
//
// Every single-page read, write and atomic is linearizable: it takes effect
// at one instant between its call and its return, and all sharers agree on
// the order. A read or write that spans pages is linearizable per page
// only: each page's part takes effect at its own instant, so a reader whose
// read spans pages may observe a multi-page write torn (new data in one page,
// old in the next), even though it never observes a torn page. Put data that
// must change together in one page, or guard it with a CompareAndSwap64
// version word.
//
// When the home dies, the directory dies with it: operations that need the
// home fail with ErrSegmentLost (when the pool reports the home lost) or
// ErrUnavailable (while it is unreachable). When the home's daemon restarts,
// the directory starts a new incarnation that grants nothing for one lease
// (so every lease of the old one has run out): every attachment that was
// open fails with ErrSegmentLost, pages it held modified and had not written
// back are lost, and the segment's memory holds what was last written back;
// attach again to continue.
//
// When a sharer dies, its leases run out and the home reclaims its pages
// within one lease; the data it held modified and had not written back
// (Sync) is lost. A partitioned sharer is treated the same way: once its
// ownership lease has run out the page reverts to its last written-back
// contents, and when the partition heals the sharer reports the lost writes
// (ErrLeaseExpired) from its next operation on the page, or from Sync. Call
// Sync after writes that must survive the writer.
//
// # Concurrency
//
// Directory and Cache are not safe for concurrent use; Home and Sharer are.
//
// # OS and tags
//
// Pure Go; builds everywhere.
package coherence
