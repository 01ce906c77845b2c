// Package tcp is the TCP fallback transport of farmem's rdma tier: the same
// one-sided READ, WRITE, compare-and-swap and fetch-and-add that RDMA verbs
// offer, served by the exporting host's daemon over plain TCP for hosts
// without an RDMA NIC. Server implements rdma.Exporter, Client implements
// rdma.Conn and Transport implements rdma.Transport.
//
// This comment is the protocol specification. Version 2; servers still
// serve version 1 clients, which lack only exactly-once sessions.
//
// # Connection and handshake
//
// A client opens a TCP connection and sends a hello; the server answers with
// a reply. The client sends no request before it has read an accepting
// reply. All integers on the wire are little-endian; all headers have a
// fixed size.
//
//	hello (client → server), 12 bytes + credential (+ session id from version 2):
//	+--------+--------+--------+----------------+- - - - - - - - - -+- - - - - - - -+
//	| magic  |version | flags  | credential len | credential bytes  | session id    |
//	|"FMRD" 4| u16    | u16    | u32 ≤ 4096     | (len bytes)       | 16 bytes (v2) |
//	+--------+--------+--------+----------------+- - - - - - - - - -+- - - - - - - -+
//	0        4        6        8                12
//
// Hello flags: none in version 1 (the field is reserved, 0); in version 2
// bit 0 RESUME says a server accepted this session id before (see
// Sessions). Other bits set are BAD_MAGIC.
//
//	reply (server → client), 12 bytes:
//	+--------+--------+--------+----------------+
//	| magic  |version | code   | max payload    |
//	|"FMRD" 4| u16    | u16    | u32            |
//	+--------+--------+--------+----------------+
//	0        4        6        8                12
//
// Versioning (as in hashicorp/memberlist): the client sends the version it
// speaks; a server that speaks it answers code 0 (accept) with that version;
// otherwise it answers BAD_VERSION with the newest version it speaks and
// closes the connection. This server speaks versions 1 and 2; this client
// speaks 2 only, so against a version 1 server Dial fails with an error
// matching rdma.ErrNotSupported that names both versions: upgrade the
// server. Reply codes (append only, never renumbered):
//
//	0 ACCEPT          the connection is open for requests
//	1 BAD_MAGIC       the hello is malformed (wrong magic, reserved bits set, truncated)
//	2 BAD_VERSION     the server does not speak the client's version
//	3 AUTH_FAILED     ServerConfig.Authenticate refused the credential
//	4 CRED_TOO_LONG   the credential is longer than 4096 bytes
//	5 BUSY            the server is at ServerConfig.MaxConns, MaxHandshakes or MaxHandshakesPerSource, or the client's tenant at MaxConnsPerTenant
//	6 SHUTTING_DOWN   the server is closing
//	7 INTERNAL        the server failed for a reason of its own
//
// Any code but ACCEPT is followed by the server closing the connection.
//
// Admission (this server): a connection that would exceed MaxConns (open
// connections, those in their handshake included), MaxHandshakes
// (connections whose hello is not yet answered) or MaxHandshakesPerSource
// (those from one IPv4 address or IPv6 /64) is sent BUSY at once, before
// its hello is read, and reset; a client then fails to write its hello or
// reads BUSY. A connection in its handshake holds no buffers, and its hello
// must arrive within HandshakeTimeout. An authenticated connection counts
// against its tenant's MaxConnsPerTenant (a principal without a tenant
// counts alone); once half of MaxConns are open, one over it is answered
// BUSY after its hello, so that a client with a valid credential cannot
// take every one of MaxConns. Once accepted, a request frame whose
// first byte arrived must arrive whole within FrameTimeout, or the
// connection is closed; idle time between frames is not limited.
//
// Principals: a server with ServerConfig.Identify takes from it the
// principal a hello's credential names (Identify also sees the client
// certificate the TLS session verified, if the client presented one), and
// serves a segment given a principal set (Server.Allow) only to
// connections whose principal is in it: any other gets ACCESS_DENIED, also
// with the right key. A segment may also name read-only principals
// (Server.AllowReaders: a backup copy its clients read on failover, which
// only its primary writes): they may READ it, in Allow's set or not, and
// their WRITE, CAS, FADD and XOR get ACCESS_DENIED, in Allow's set or
// not. Each connection remembers the last segment and sets it checked, so
// a run of requests on one segment costs three pointer comparisons; a new
// set takes effect on the next request.
//
// poold's data plane sets Identify: the credential is the 16 random bytes
// its control plane issued to a live session, or delegated over a peer
// daemon's session to one of that daemon's clients (pool.v1 Welcome,
// Segment data_credential, Delegate), refused with AUTH_FAILED once that
// session ends or when the connection's client certificate names another
// identity than the one it was issued to; the credential is checked once,
// at the handshake, and every request is checked against its segment's key
// and principals (the owner's and attachers' client ids).
//
// # TLS
//
// With ServerConfig.TLS (and WithTLS on the client) every connection runs a
// TLS handshake (1.3; the server presents its certificate, the client
// verifies it and may present its own) before the hello, and everything above
// then flows inside TLS, so neither the credential, nor keys, nor data can
// be read off the wire, and a recorded connection cannot be replayed (a
// replayed handshake fails). HandshakeTimeout bounds both handshakes; a
// connection refused at admission is only reset (a TLS client cannot read
// a BUSY sent before TLS). A client may present a certificate (the server
// asks with TLS.ClientAuth tls.VerifyClientCertIfGiven), which Identify
// then checks against the credential; without one, the credential is a
// bearer secret inside the session. Costs and how they are kept down:
// responses and requests are gathered into full 16 KiB records, a batch's
// records leave in one write(2) and the socket is read 64 KiB at a time
// (crypto/tls alone makes one system call per record); busy polling polls
// the socket under TLS and decrypts records as they arrive.
//
// # Requests
//
// After the handshake the client sends request frames and the server sends
// one response frame per request. Requests are pipelined: a client may send
// any number before reading responses, and the server may answer them out of
// order (this server answers in order, but for the ops on a forwarding
// segment, which are answered once their targets acknowledged: see
// Forwarding); the request id matches a response to its request, so ids
// must be unique among a connection's outstanding requests.
//
//	request frame: 80-byte header, then payload-len bytes of payload
//	+---------------------------------------------------------------+
//	|                     request id (u64)                       0  |
//	+---------------+---------------+-------------------------------+
//	| opcode (u8) 8 | flags (u8)  9 | slot (u16) (ONCE; else 0)  10 |
//	+---------------+---------------+-------------------------------+
//	|                 payload len (u32) ≤ 16 MiB                 12 |
//	+---------------------------------------------------------------+
//	|                     segment id (u64)                       16 |
//	+---------------------------------------------------------------+
//	|                     access key (16 bytes)                  24 |
//	+---------------------------------------------------------------+
//	|                     lease epoch (u64)                      40 |
//	+---------------------------------------------------------------+
//	|                     offset (u64)                           48 |
//	+-------------------------------+-------------------------------+
//	| length (u32) ≤ 16 MiB      56 | seq (u32) (ONCE; else 0)   60 |
//	+-------------------------------+-------------------------------+
//	|                     arg0 (u64)                             64 |
//	+---------------------------------------------------------------+
//	|                     arg1 (u64)                             72 |
//	+---------------------------------------------------------------+
//	|                     payload (payload len bytes) ...        80 |
//	+- - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - -+
//
// Opcodes (append only, never renumbered or reused):
//
//	1 READ   read length bytes at offset; payload len 0; arg0, arg1 0
//	2 WRITE  write the payload at offset; payload len = length
//	3 CAS    if the u64 at offset equals arg0, store arg1; length 8, payload len 0
//	4 FADD   add arg0 to the u64 at offset; length 8, payload len 0
//	5 MSG    hand the payload to the server's ServerConfig.Message hook for
//	         the segment; length is the largest answer the client accepts,
//	         offset, arg0 and arg1 are 0; the response payload (≤ length) is
//	         the hook's answer. The coherence protocol of shared segments
//	         rides it; a hook may block (the sharer's long poll), so a client
//	         keeps such calls on a connection of their own. A server without
//	         the hook answers UNSUPPORTED. The payload is at most 1 MiB +
//	         64 KiB (MaxMessage: the largest coherence message, with room
//	         to spare). The server checks the length and the segment (key,
//	         principal, state) before it reads the payload: a longer
//	         payload is answered OUT_OF_RANGE, a segment the connection may
//	         not use with its status (ACCESS_DENIED, ...), both at once,
//	         and the payload is skipped, never buffered.
//	6 XOR    XOR the payload into the bytes at offset; payload len = length
//	         (with FORWARD, length plus the origin block); arg0, arg1 0. XORs
//	         of a segment are atomic with each other (a parity shard takes
//	         XORs from several data shards' homes at once, and XORs
//	         commute). Servers older than this opcode answer UNSUPPORTED.
//
// Request flags (append only; none in version 1):
//
//	bit 0 ONCE    (v2) the request is exactly-once: slot and seq name it
//	              in the connection's session; WRITE, CAS, FADD and XOR
//	              only
//	bit 1 RETRY   (v2) with ONCE: the client sent this slot and seq before
//	bit 2 FORWARD (v2) with ONCE, on WRITE or XOR only: a primary forwards
//	              this op, and its payload starts with an origin block
//	              (see Forwarding); payload len = length + the block's size
//
// A request with a flag the connection's version does not define, RETRY
// or FORWARD without ONCE, ONCE on another opcode or with a slot ≥ 128,
// FORWARD on another opcode than WRITE and XOR, or an opcode the server
// does not know, is answered UNSUPPORTED after its payload has been
// skipped, so newer clients can probe older servers. FORWARD from a
// connection whose principal ServerConfig.Forwarders refuses is answered
// ACCESS_DENIED, unapplied; an origin block naming the connection's own
// session is answered PROTOCOL. Without ONCE the
// slot and seq fields are reserved and must be 0. Atomics need offset to be
// a multiple of 8 and operate on the word in the byte order of the
// exporting host.
//
// # Sessions (version 2): exactly-once writes and atomics
//
// A client that lost a connection after sending a WRITE, CAS or FADD cannot
// tell whether it ran; sending it again could apply it twice (a second
// fetch-and-add, or a CAS that finds its own first store and reports
// "not swapped"). Version 2 borrows NFSv4.1's session slot table. The
// client picks a random 16-byte session id per server and presents it in
// every hello (RESUME once a server accepted it); the server keys the
// session by (credential, id), or by (principal, id) on a server that
// names principals (ServerConfig.Identify; see Forwarding), so it
// outlives connections. A session has
// 128 slots (rdma.SessionSlots); a client keeps at most one operation per
// slot in flight and numbers the operations of a slot 1, 2, 3... (seq,
// wrapping). The server keeps, per slot, the last seq it ran and that
// request's response header (status, flags, value): a bounded reply cache,
// 128 answers per session, at most ServerConfig.MaxSessions sessions (least
// recently used evicted, use counted when a connection sends its first
// ONCE request and when it ends; while one tenant holds more than a
// sixteenth of them, its own least recently used: ServerConfig.Tenant
// names the identity a principal acts for, so one identity's many
// principals share one share). A server keeps a session only once a
// connection of it sends a ONCE request: a client that only reads takes no
// place. For a request with ONCE, under the slot's lock:
//
//	seq = slot's last               → the cached answer (payload skipped)
//	seq after the slot's last       → run it; cache its answer
//	seq before the slot's last      → INDETERMINATE (a stale duplicate)
//	slot's history unknown, RETRY   → INDETERMINATE
//	slot's history unknown, no RETRY → run it; cache its answer
//
// A slot's history is unknown when its session was created by a RESUME
// hello: this server never saw it, or evicted it, or restarted since (or
// by an origin block, on a server that forgot a session: see Forwarding). A
// session created by a hello without RESUME starts with every slot at seq
// 0, and so does one that a connection with a RESUME hello creates while
// the server still remembers a hello without RESUME for it (the client's
// first connection: a client dials several and may send its first ONCE
// request on any; the last MaxSessions such hellos are remembered until
// their session is created). A retry that arrives while its original still runs on another
// connection waits for the original's answer. A WRITE whose payload is cut
// off caches nothing, so its retry runs in full. Nor is an answer
// ACCESS_DENIED, LEASE_EXPIRED or MOVED cached: such a request applied
// nothing, the slot stays at its last seq, and a retry runs again (and
// succeeds once the segment is writable there, as on a copy promoted to
// primary). The client moves a slot to
// its next seq only once it has the answer (or gave up), which tells the
// server the cached answer is no longer needed. rdma.Op.Once carries the
// ticket (slot and seq); rdma.Session is the client's table.
//
// # Responses
//
//	response frame: 24-byte header, then payload len bytes of payload
//	+---------------------------------------------------------------+
//	|                     request id (u64)                        0 |
//	+-------------------------------+---------------+---------------+
//	| status (u16)                8 | flags (u8) 10 | reserved = 0 11|
//	+-------------------------------+---------------+---------------+
//	|                 payload len (u32)                          12 |
//	+---------------------------------------------------------------+
//	|                     value (u64)                            16 |
//	+---------------------------------------------------------------+
//	|                     payload (payload len bytes) ...        24 |
//	+- - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - -+
//
// A successful READ carries exactly length bytes of payload, a successful
// MSG at most length bytes; every other response carries none. value is the word's previous value for CAS and FADD;
// flags bit 0 (SWAPPED) says whether a CAS stored arg1. Status codes (append
// only) and the rdma errors they map to:
//
//	0 OK
//	1 ACCESS_DENIED   rdma.ErrAccessDenied: unknown segment, wrong key, revoked, principal not allowed
//	2 OUT_OF_RANGE    rdma.ErrOutOfRange: offset+length past the segment end
//	3 SEGMENT_LOST    rdma.ErrSegmentLost: the segment's memory is gone
//	4 LEASE_EXPIRED   rdma.ErrLeaseExpired: WRITE, CAS or FADD with an epoch
//	                  older than the segment's (READ is not fenced by epoch);
//	                  or any op, with the segment's own key, on a segment
//	                  the server fenced (Server.Fence: its lease ended or it
//	                  was freed; remembered for the last MaxFenced fences)
//	5 UNALIGNED       rdma.ErrUnaligned: atomic at an offset not a multiple of 8
//	6 PROTOCOL        rdma.ErrProtocol
//	7 UNSUPPORTED     rdma.ErrNotSupported: unknown opcode or flags
//	8 INDETERMINATE   rdma.ErrIndeterminate (v2): an exactly-once request
//	                  whose earlier run the server can neither confirm nor
//	                  rule out; it was not run again
//	9 MOVED           rdma.ErrMoved: the segment moved to another home
//	                  (Server.MoveAway), or its move is switching over
//	                  (Server.Seal: WRITE, CAS and FADD, and READ by any
//	                  principal but the mover's); the op was not applied.
//	                  A client asks the segment's daemon where it lives now
//	                  and sends the op there (with a new exactly-once
//	                  ticket or the same: the refusal is not cached). Clients
//	                  older than this status see PROTOCOL. Once a sealed
//	                  segment's switch-over is done here (Server.Handover),
//	                  the response's value is the move's token
//	                  (rdma.MoveToken, rdma.MovedError; 0 before and
//	                  after the withdrawal): a client told of that copy
//	                  ahead goes there without asking. Older clients
//	                  ignore the value.
//
// The server checks, in this order, key (constant-time), segment state,
// epoch, alignment and bounds (overflow-safe: offset ≤ size and
// length ≤ size-offset) before it touches memory.
//
// # Forwarding (redundant segments)
//
// A segment with copies on other hosts (replicas) or a data shard of an
// erasure-coded stripe is written at one home only, its primary (a data
// shard's home), whose data plane forwards each change to the other homes
// (Server.Forward), over a connection it dials to each (a Client whose
// session is the primary's own):
//
//   - copy mode: after applying a WRITE, CAS, FADD or XOR the primary
//     sends every copy a WRITE of the range's bytes as they are now (for
//     an atomic, the word's new value), so copies never re-run an atomic;
//   - parity mode: the primary keeps the range's old bytes, applies the
//     op, and sends parity shard j the j-th Reed-Solomon parity (klauspost
//     /reedsolomon, reedsolomon.New(k, m)) of delta = old XOR new, as data
//     shard i's contribution (EncodeIdx), as an XOR at the same offset.
//
// Reads: a READ of a forwarding segment that overlaps an op not yet
// settled (every live target acknowledged it, or was reported to OnFail
// and OnFail returned) waits until it is, then copies its bytes under the
// forwarding lock: a reader never sees a change that a target promoted in
// the primary's place could lack.
//
// Order: the apply and the queueing of the forwarded ops on the targets'
// connections happen under one lock per segment, and every op for one
// target of one segment goes on one connection of its Client, so each
// target applies them in the primary's order (parity XORs commute, so
// parity shards need no order across data shards). A WRITE to a
// forwarding segment is read into a buffer before the lock is taken, so
// the lock never waits for a socket. The client is answered once every
// live target acknowledged, by the goroutine that waited for the
// acknowledgements: the connection's own goroutine when the client's op
// is alone on its connection (no other request read and not yet run, no
// other forwarded op unanswered), else a worker, so the connection goes
// on reading and running its next requests meanwhile and their answers
// may overtake. An op that arrives while the connection's goroutine
// waits is read once that op is answered. A forwarded op that is itself
// forwarded on is always left to a worker. A forwarded op
// holds its segment as a write in flight until answered: Seal and Revoke
// wait for its targets.
//
// Link: every forwarded op carries an exactly-once ticket of the
// primary's session (ONCE). When the connection it went on breaks, the
// primary sends the ops that connection left unanswered again, in their
// order and before any later op, on the Client's next live connection,
// with RETRY if they may have left (the target answers a repeat from its
// reply cache). A target that answers an error, has no live connection
// left, or is silent while forwarded ops wait on it is reported to
// Forwarding.OnFail once and skipped from then on; the
// client's op is still answered OK if every other target acknowledged,
// after OnFail returned. When OnFail returns an error (the loss could not
// be recorded where promotions are decided), that op and every later op
// of the segment are applied but answered INDETERMINATE until Forward is
// called again: a target that missed them must not be promoted over
// acknowledged writes.
//
// Silence: a target is silent once its Client has read no response on
// any connection for ServerConfig.ForwardTimeout (1 s) plus a second per
// 4 MiB of forwarded payload waiting on the target (queued for one of the
// session's 128 exactly-once slots, in flight, or unanswered). The clock
// measures silence, not the ops' total time: a 16 MiB write, or a
// client's large write cut into thousands of 4 KiB ops of a coded
// segment that queue for the slots, is waited for as long as the target
// keeps answering, so a slow but live target keeps the segment's
// redundancy. A target that stops answering is declared failed at most
// ForwardTimeout and an eighth, plus that allowance, after the later of
// its last answer and the op's start: a watch checks sixteen times per
// ForwardTimeout while ops wait on it, and ends the waits of them all.
//
// Exactly-once across failover: a forwarded op that stems from a client's
// exactly-once op (ONCE) has the flag FORWARD and carries, before its
// data, an origin block: the client's session and slot, the op's seq,
// and the primary's answer. The target applies the data and stores the
// answer in its own reply cache as the answer to that client session's
// slot and seq. A client whose primary died and that sends the op again
// (RETRY, same slot and seq) to the copy promoted in its place is
// answered from that cache and the op is not applied again. Sessions are
// keyed by the connection's principal (ServerConfig.Identify) when the
// server names one, else by its credential: each home issues a client a
// credential of its own, but names the same principal. An origin block
// opens a session with every slot at seq 0, counted against
// ServerConfig.MaxSessions like any other: an op of that session that
// ran here before came either in an origin block (its answer is cached)
// or from the client (whose connection opened the session), and an op
// whose forward never arrived was not applied here (the primary answers
// only once every live copy acknowledged), so a retry on another slot
// runs. A server that evicted a session, or that exported memory from
// before it started (Server.ExportKey, a daemon restarting), may have run
// ops of a session it no longer holds: from then on an origin block opens
// a session as a RESUME hello does (its other slots' history unknown).
// This relies on a copy taking every change through forwarding from its
// export on. A copy filled any other way (copying a surviving home's
// memory while that home goes on applying ops: a rebuild's new copy, a
// moved home's target) holds the effect of ops whose answers it never
// saw, and its server may well hold the client's session with those slots
// known (an origin block of another slot, another segment there):
// exported with Server.ExportCopy, it carries a join mark, unset until
// Server.Join, which its daemon calls once every home that applied ops
// before is sealed or gone (the copy's switch), and which ExportKey sets
// at the export. A RETRY on such a segment whose seq is not the slot's
// cached one answers INDETERMINATE unless the slot recorded an op on this
// server since the mark: the client sends a slot's next seq only once its
// previous one was answered, which was recorded here before that answer,
// so a seq after a record made past the mark was applied nowhere without
// reaching here too, and runs. A first send (no RETRY) runs as ever.
//
//	origin block (FORWARD), 40 bytes + owner:
//	+---------------------------------------------------------------+
//	|               the client's session id (16 bytes)            0 |
//	+---------------+---------------+-------------------------------+
//	| slot (u16) 16 | status (u16)18| seq (u32)                  20 |
//	+---------------+---------------+-------------------------------+
//	|                     value (u64)                            24 |
//	+-------+-------+---------------+-------------------------------+
//	|flags32|rsvd 33| owner len  34 | reserved (u32) = 0         36 |
//	+-------+-------+---------------+-------------------------------+
//	|                 owner (owner len bytes) ...                40 |
//	+- - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - -+
//
// slot is below 128, owner len at most 4098, the reserved bytes zero.
// status, flags and value are the primary's answer to the client (a
// response header's fields); owner is "p:" and the principal, or "c:" and
// the credential where the primary names no principal. A block that
// breaks these rules is answered PROTOCOL, nothing applied; the
// connection stays open. The payload of a FORWARD request may exceed
// MaxPayload by the largest origin block (40 + 4098 bytes). A server
// older than FORWARD closes the connection on a forwarded WRITE (its
// payload length contradicts its length): forward only to daemons that
// speak it.
//
// # Limits and framing errors
//
// A payload or length over 16 MiB (MaxPayload), reserved bytes that are not
// zero (slot and seq without ONCE), a payload length that contradicts a known opcode, or a stream that
// ends inside a frame are framing errors: the receiver logs the reason and
// closes the connection without touching memory for that frame. Clients
// split larger reads and writes into several requests.
//
// A WRITE that fails its checks still has its payload read and discarded,
// so the connection stays usable (the limit bounds the waste to 16 MiB).
// A WRITE whose payload is cut short (the client dies mid-frame) leaves a
// prefix of the payload in memory, as a torn RDMA write does; the client
// never sees it succeed.
//
// # Zero copy
//
// The server reads WRITE payloads from the socket straight into the mapped
// segment (but for a forwarding segment, and XOR payloads, which are read
// into a buffer first): only payload bytes that arrived in the same read(2) as earlier
// headers are copied, once, from the connection's read buffer (after a
// payload of 32 KiB or more the next read fetches only the next header, so a
// stream of large writes goes straight to the mapping). READ payloads go
// from the mapping to the socket with writev (net.Buffers{header,
// mem[off:off+n]}), without an intermediate copy, but for a forwarding
// segment's: a READ there waits until no op whose change it overlaps is
// still on its way to the targets (each answered, or reported to OnFail)
// and copies the bytes under the segment's forwarding lock, so it never
// returns a change a target may miss (see Forwarding). The client reads
// READ payloads into the caller's buffer the same way.
//
// # Batching and hand-offs
//
// Server: one goroutine per connection reads a request, executes it and
// queues its response; the queue is flushed with one writev when no further
// complete request is buffered, after ServerConfig.MaxInflightPerConn
// responses, or after 256 KiB of payload. Doing the writes on the reading
// goroutine instead of a separate writer goroutine saves a goroutine wake-up
// per batch (the expensive part of a small op on a small host) and batches
// just as well. Responses hold their segment pinned until flushed.
//
// Client: a caller that finds its connection idle writes its own request
// and, if nobody else is reading the connection, reads responses itself
// until its own arrives (leader/follower): a lone request costs one write
// and one read, as with raw TCP, and no goroutine hand-off. Under load,
// requests queued while a write is in progress are gathered by the
// connection's writer goroutine into one writev, and responses are read by
// the connection's reader goroutine, which matches them to requests by id
// and wakes their callers, so a slow op never blocks the others. Ops stay on
// the first connection until it has 8 in flight and then spread to the
// next: per-syscall cost, not bandwidth, limits small ops, so they are
// packed, but each connection is served by one goroutine, so a deeper
// load is spread over the cores.
//
// Busy polling (Linux): at one request in flight neither end has work while
// it waits, and parking in the network poller costs a wake-up (epoll, a
// futex, two context switches) on each side per round trip, on a VM more
// than the round trip's own work. A leading caller whose op has been alone
// on its connection for 8 ops in a row, and a server connection whose last
// 8 flushes carried one response each while no other connection was
// served, poll the socket with non-blocking reads for up to
// ServerConfig.BusyPoll / WithBusyPoll (default 50µs) before they park.
// A poll that finds nothing backs off (2^k reads without polling after k
// misses in a row, at most 256), one that was descheduled backs off the
// most, and at most GOMAXPROCS/2 goroutines of a process poll at once. A
// client keeps the backoff of waits for READ answers apart from that of
// waits for any other answer: a home that forwards its changes (the
// primary of copies, a data shard's home) answers a write after a second
// round trip, past the poll, and one backoff shared with the reads would
// stop them polling for up to 256 reads after a run of writes (reads of a
// Replicas(2) segment took 1.12-1.49x, and of an ErasureCoded(4, 2) one
// 1.11-1.35x, those of an unreplicated segment on the same home measured
// in turn with them; 0.99-1.08x with the two backoffs). A descheduled
// poll backs off both: the cores are busy, whatever the wait is for.
// Pipelined loads keep batching: their ops are seldom alone.
//
// Raw system calls (Linux): both ends read and write their non-blocking
// TCP sockets with raw read(2) and writev(2) calls (batches up to 64 KiB;
// larger ones and blocking sockets the runtime's way), skipping the
// runtime's system-call entry, which wakes its monitor thread out of its
// idle sleep and sets it polling every 20 µs: a process that waits on the
// network between short bursts of socket calls kept it switching in and
// out. At one read in flight between two poolds' processes the round
// trip's p50 fell from a median of 31.5 µs to 17.7 µs (memctl bench, five
// runs each: 17.7-44.5 µs before, 16.0-18.7 µs after).
//
// # Concurrency
//
// Server and Client are safe for concurrent use. A Client spreads ops over
// several TCP connections (WithConns, default max(GOMAXPROCS, 2)).
// Cancelling a call (ctx) returns ctx.Err() promptly, with two bounded
// exceptions that keep caller buffers safe: a Write whose request is in the
// middle of being written to the socket waits for that writev, and a Read
// whose response payload is already streaming into the caller's buffer waits
// for the rest of that frame. A response that arrives for a Read whose
// caller has left is discarded, never copied into the caller's buffer.
//
// Revoke waits for in-flight operations on the segment: a WRITE payload that
// is still arriving is cut off (its connection is closed) and unflushed
// READ responses are flushed, so no goroutine touches the memory after
// Revoke returns.
//
// # Faults
//
// Server connection goroutines run with debug.SetPanicOnFault, so a SIGBUS
// on a mapping (truncated file, poisoned memory) while copying or doing an
// atomic marks the segment lost (SEGMENT_LOST) instead of killing the
// daemon; an EFAULT from the kernel while reading a WRITE payload into a
// mapping marks it lost too and closes the connection (the stream position
// is unknown). A READ whose writev hits EFAULT closes its connection.
//
// # OS and tags
//
// Pure Go; builds everywhere. The tests map their test memory with mmap on
// Linux and fall back to an aligned heap buffer elsewhere.
package tcp
