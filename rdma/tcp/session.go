package tcp

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/farmem/farmem/rdma"
)

// sessionKey names a client session: who its connections act for and the
// id the client chose. Keying by who too keeps one client's connections
// from reaching another's replies even if they learnt its id. Who is the
// principal (ServerConfig.Identify) where the server names one, so that
// the replies a primary forwards with its ops (origin.go) are found by the
// same client connecting with the credential this host issued it; else the
// credential.
type sessionKey struct {
	name string // sessionName
	id   [sessionIDSize]byte
}

// sessionName is a sessionKey's name: a principal, or a credential.
func sessionName(principal bool, who string) string {
	if principal {
		return "p:" + who
	}
	return "c:" + who
}

// sessionTable is a server's reply cache: the exactly-once sessions of its
// clients, at most max of them; opening one more evicts the least recently
// used of the tenant that holds the most, if that is more than its share
// (ownerShare), else the least recently used: a client that opens session
// after session, under one principal or many of one tenant, evicts its
// own, not the others'. It is safe for concurrent use.
type sessionTable struct {
	max    int
	tenant func(principal string) string // ServerConfig.Tenant; nil: none
	tick   atomic.Uint64                 // logical clock for least-recently-used eviction

	mu    sync.Mutex
	m     map[sessionKey]*session
	owned map[string]int // sessions per tenant (tenantOf)
	// fresh holds the sessions a hello without RESUME named (their
	// client had no server accept them before) that no ONCE request has
	// opened yet, at most max of them, the oldest forgotten first
	// (freshRing): a session a connection with a RESUME hello opens first
	// still starts with known slots if it is fresh.
	fresh     map[sessionKey]struct{}
	freshRing []sessionKey
	freshNext int
	// forgot is set once this server may have run ops of a session it
	// no longer holds: it evicted a session, or it serves memory that
	// predates it (ExportKey, a restarting daemon's segments). Until then
	// a session an origin block opens is new here (see openForwarded).
	forgot bool
}

func newSessionTable(max int, tenant func(principal string) string) *sessionTable {
	return &sessionTable{max: max, tenant: tenant, m: make(map[sessionKey]*session), owned: make(map[string]int)}
}

// ownerShare is how many sessions one tenant may hold in a full table
// before the next one opened evicts one of its: a client uses one session per
// process (a peer daemon one per node), so a sixteenth of the table (at
// least 4) leaves room for many of them, while a tenant that churns
// sessions, or principals, cannot push every other client's replies out.
func (t *sessionTable) ownerShare() int { return max(4, t.max/16) }

// tenantOf is whose share a session of key counts against: "t:" and the
// tenant ServerConfig.Tenant names for its principal, so that one
// identity's many principals share one; else the key's name (its
// principal, or its credential). It is called outside t.mu: Tenant is the
// embedder's code.
func (t *sessionTable) tenantOf(key sessionKey) string {
	if t.tenant != nil {
		if p, ok := strings.CutPrefix(key.name, "p:"); ok {
			return tenantName(key, t.tenant(p))
		}
	}
	return key.name
}

// tenantName is whose share a session of key counts against when
// ServerConfig.Tenant named tenant for its principal (tenantOf).
func tenantName(key sessionKey, tenant string) string {
	if tenant != "" {
		return "t:" + tenant
	}
	return key.name
}

// session is one client session's reply cache: the last answer of each of
// its slots. A connection keeps a pointer to it, so an evicted session
// stays usable by the connections that opened it; a connection that
// resumes it later finds it gone and answers its retries INDETERMINATE.
type session struct {
	lastUsed atomic.Uint64
	tenant   string // whose share it counts against (tenantOf)
	slots    [rdma.SessionSlots]slot
}

// slot is the reply cache of one session slot. mu is held while the slot's
// request executes, so a retry that arrives on another connection while the
// original still runs waits for the original's answer.
type slot struct {
	mu     sync.Mutex
	known  bool   // seq is the slot's last executed sequence number
	seq    uint32 // last sequence number executed on the slot
	status uint16 // its answer
	flags  uint8
	value  uint64
	// at is when seq was recorded (onceClock), 0 if it never was: a
	// RETRY at an export filled by copy is compared with its join mark
	// (decideAt).
	at uint64
	// pending is the newest forwarded answer that found mu held, and
	// waiter says a goroutine waits for mu to record it (remember): one
	// per slot however many come.
	pending atomic.Pointer[origin]
	waiter  atomic.Bool
}

// onceClock orders a slot's records against the join marks of exports
// filled by copy (Server.ExportCopy, Server.Join). One clock serves every
// server of the process: only the order of a record and a mark on the
// same server is ever compared.
var onceClock atomic.Uint64

// announce records that a hello without RESUME named key: its client had
// no server accept the session before, so nothing of it ran anywhere. The
// mark is used (and dropped) by the session's first open.
func (t *sessionTable) announce(key sessionKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.m[key]; ok {
		return
	}
	if _, ok := t.fresh[key]; ok {
		return
	}
	if t.fresh == nil {
		t.fresh = make(map[sessionKey]struct{})
		t.freshRing = make([]sessionKey, t.max)
	}
	if old := t.freshRing[t.freshNext]; old != (sessionKey{}) {
		delete(t.fresh, old)
	}
	t.freshRing[t.freshNext] = key
	t.freshNext = (t.freshNext + 1) % len(t.freshRing)
	t.fresh[key] = struct{}{}
}

// open returns the session of key, creating it if the table lacks it. A new
// session's slots are known (nothing executed yet) unless the client
// resumes a session a server accepted before and no hello announced it
// fresh here: then this server lost its replies (it restarted, or evicted
// the session), and a retry on a slot that has not executed anything
// since is INDETERMINATE.
//
// tenant is whose share a new session counts against, as tenantOf named
// it when the client authenticated ("": the key's own name): a principal
// whose credential ended since still counts as the identity it acted for.
func (t *sessionTable) open(key sessionKey, tenant string, resume bool) *session {
	if tenant == "" {
		tenant = key.name
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.openLocked(key, tenant, !resume)
}

// openForwarded is open for an origin block (origin.go): a primary
// forwards an op of the client's session. Its slots are known unless the
// table forgot a session: every op of the session that ran here before
// either came in an origin block, whose answer this server still holds,
// or came from the client itself, whose connection opened the session.
// An op whose forward never arrived was not applied here, and the primary
// answered nobody before every live copy acknowledged it, so running the
// client's retry of it applies it once.
func (t *sessionTable) openForwarded(key sessionKey) *session {
	if s := t.find(key); s != nil {
		return s
	}
	tenant := t.tenantOf(key)
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.openLocked(key, tenant, !t.forgot)
}

// find returns the session of key, marked used, or nil if the table lacks
// it: openForwarded runs it per forwarded op, so that only a new session
// asks ServerConfig.Tenant.
func (t *sessionTable) find(key sessionKey) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.m[key]
	if s != nil {
		t.touch(s)
	}
	return s
}

// openLocked returns the session of key, creating it for tenant
// (tenantOf) with its slots known if known is set or a hello announced it
// fresh; t.mu is held.
func (t *sessionTable) openLocked(key sessionKey, tenant string, known bool) *session {
	s := t.m[key]
	if s == nil {
		if len(t.m) >= t.max {
			t.evictOldest(t.overShare())
		}
		t.owned[tenant]++
		_, fresh := t.fresh[key]
		delete(t.fresh, key)
		s = &session{tenant: tenant}
		for i := range s.slots {
			s.slots[i].known = known || fresh
		}
		t.m[key] = s
	}
	t.touch(s)
	return s
}

// forget records that this server may have run ops of sessions it does
// not hold (memory exported from before it started).
func (t *sessionTable) forget() {
	t.mu.Lock()
	t.forgot = true
	t.mu.Unlock()
}

// overShare returns the tenant holding the most sessions if that is more
// than ownerShare, else ""; t.mu is held.
func (t *sessionTable) overShare() string {
	most, n := "", t.ownerShare()
	for tenant, c := range t.owned {
		if c > n {
			most, n = tenant, c
		}
	}
	return most
}

// evictOldest drops the least recently used session, of tenant's if it
// is not ""; t.mu is held. The scan is linear, and runs only when a
// session is opened at a full table.
func (t *sessionTable) evictOldest(tenant string) {
	var (
		oldest    sessionKey
		oldestUse uint64
		found     bool
	)
	for k, s := range t.m {
		if tenant != "" && s.tenant != tenant {
			continue
		}
		if u := s.lastUsed.Load(); !found || u < oldestUse {
			oldest, oldestUse, found = k, u, true
		}
	}
	if found {
		gone := t.m[oldest].tenant
		delete(t.m, oldest)
		if t.owned[gone]--; t.owned[gone] == 0 {
			delete(t.owned, gone)
		}
		t.forgot = true
	}
}

// touch marks s as used now.
func (t *sessionTable) touch(s *session) { s.lastUsed.Store(t.tick.Add(1)) }

// verdict is what a server does with an exactly-once request.
type verdict uint8

const (
	execute       verdict = iota // run it and cache its answer
	replay                       // answer from the cache: it ran before
	indeterminate                // it may have run; the answer is gone
)

// decide says what to do with a request for seq on the slot; retry is the
// request's RETRY flag. The caller holds sl.mu.
func (sl *slot) decide(seq uint32, retry bool) verdict {
	if !sl.known {
		if retry {
			return indeterminate
		}
		return execute
	}
	switch d := int32(seq - sl.seq); {
	case d == 0:
		return replay
	case d < 0: // the slot moved on: a stale duplicate
		return indeterminate
	default: // the slot's history is known, and seq did not run
		return execute
	}
}

// decideAt is decide for a request on an export whose memory may hold
// ops it took outside this server's reply cache until the mark joined (a
// copy filled by copying another home's, see Server.ExportCopy; 0: none,
// never reached: still filled). A RETRY of a seq the slot has not run
// answers INDETERMINATE unless the slot recorded an op at or after that
// mark: the client sends seq only once the slot's previous seq was
// answered, and was recorded here, so a seq after a record made once
// every change reached this export through it (forwarding, or as the
// primary) could only have been applied elsewhere if it reached here too.
// A first send (no RETRY) never ran anywhere and still runs. The caller
// holds sl.mu.
func (sl *slot) decideAt(seq uint32, retry bool, joined uint64) verdict {
	v := sl.decide(seq, retry)
	if v == execute && retry && joined != 0 && sl.at < joined {
		return indeterminate
	}
	return v
}

// record caches the answer of seq; the caller holds sl.mu. A refusal
// (refused) is not cached: the op was not applied and the slot stays at
// its last executed seq, so a retry of seq runs again and may find the
// segment writable by then.
func (sl *slot) record(seq uint32, status uint16, flags uint8, value uint64) {
	if refused(status) {
		return
	}
	sl.known, sl.seq, sl.at = true, seq, onceClock.Add(1)
	sl.status, sl.flags, sl.value = status, flags, value
}

// refused reports whether status refuses an op before it touched memory
// for a reason that may pass: ACCESS_DENIED (the segment is not, or not
// yet, writable by the principal here), LEASE_EXPIRED (a stale epoch, or
// a fence) and MOVED.
func refused(status uint16) bool {
	return status == statusAccessDenied || status == statusLeaseExpired || status == statusMoved
}
