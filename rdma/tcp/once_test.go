package tcp

import (
	"context"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/faultproxy"
	"github.com/farmem/farmem/internal/oncecheck"
	"github.com/farmem/farmem/rdma"
)

var onceOps = flag.Int("once.ops", 100_000, "adds and as many CASes that TestOnceUnderConnectionKills runs")

// retrier is the retry layer a caller puts over Client: it redials, with
// one Session, whenever a connection fails, and posts the same op again
// with the same ticket until it gets an answer. It is an oncecheck.Target.
type retrier struct {
	addr string
	sess *rdma.Session
	r    rdma.Region

	mu sync.Mutex
	cl *Client
}

func (rt *retrier) conn(ctx context.Context) (*Client, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.cl == nil {
		cl, err := Dial(ctx, rt.addr, WithSession(rt.sess), WithConns(1), WithBusyPoll(-1))
		if err != nil {
			return nil, err
		}
		rt.cl = cl
	}
	return rt.cl, nil
}

func (rt *retrier) broken(cl *Client) {
	rt.mu.Lock()
	if rt.cl == cl {
		rt.cl = nil
	}
	rt.mu.Unlock()
	cl.Close()
}

func (rt *retrier) close() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.cl != nil {
		rt.cl.Close()
	}
}

// do posts op until it gets an answer; a WRITE or atomic holds a ticket.
func (rt *retrier) do(ctx context.Context, op *rdma.Op) error {
	op.Region = rt.r
	if op.Kind != rdma.OpRead {
		t, err := rt.sess.Acquire(ctx)
		if err != nil {
			return err
		}
		defer t.Release()
		op.Once = t
	}
	for {
		cl, err := rt.conn(ctx)
		if err == nil {
			if err = cl.Do(ctx, op); err == nil || !errors.Is(err, rdma.ErrClosed) {
				return err
			}
			rt.broken(cl)
		}
		if ctx.Err() != nil {
			return err
		}
	}
}

func (rt *retrier) Add(ctx context.Context) (uint64, error) {
	op := rdma.Op{Kind: rdma.OpFetchAdd, Delta: 1}
	err := rt.do(ctx, &op)
	return op.Prev, err
}

func (rt *retrier) CAS(ctx context.Context, w int, old, new uint64) (uint64, bool, error) {
	op := rdma.Op{Kind: rdma.OpCompareAndSwap, Offset: int64(8 * w), Old: old, New: new}
	err := rt.do(ctx, &op)
	return op.Prev, op.Swapped, err
}

func (rt *retrier) Load(ctx context.Context, w int) (uint64, error) {
	var b [8]byte
	err := rt.do(ctx, &rdma.Op{Kind: rdma.OpRead, Offset: int64(8 * w), Buf: b[:]})
	return binary.NativeEndian.Uint64(b[:]), err
}

func (rt *retrier) Indeterminate(err error) bool { return errors.Is(err, rdma.ErrIndeterminate) }

// TestOnceUnderConnectionKills runs the exactly-once workload through a
// proxy that kills every connection each 50 ms and cuts half of them after
// a random number of response bytes (requests delivered, replies lost): no
// add or CAS is applied twice, and a CAS that says it did not swap did not
// store.
func TestOnceUnderConnectionKills(t *testing.T) {
	s := startServer(t, ServerConfig{BusyPoll: -1})
	_, r := s.export(t, 1, 4096)
	p, err := faultproxy.Start(faultproxy.Config{
		Target: s.addr,
		ReplyBudget: func() int {
			if rand.IntN(2) == 0 {
				return 0
			}
			return replySize + rand.IntN(200*respHeaderSize)
		},
	})
	require.NoError(t, err)
	defer p.Close()
	p.KillEvery(50 * time.Millisecond)
	rt := &retrier{addr: p.Addr(), sess: rdma.NewSession(), r: r}
	defer rt.close()

	start := time.Now()
	res := oncecheck.Run(t, t.Context(), rt, *onceOps, 4)
	t.Logf("%d adds + %d CAS in %v, %d connections killed: %+v", *onceOps, *onceOps, time.Since(start).Round(time.Millisecond), p.Kills(), res)
	require.Positive(t, p.Kills(), "the proxy killed no connection: the test exercised nothing")
}

// TestOnceReplay: a ticket posted again on a new connection of the same
// session (the reply was lost) gets the first answer, and the op ran once;
// a new ticket then runs.
func TestOnceReplay(t *testing.T) {
	s := startServer(t, ServerConfig{})
	mem, r := s.export(t, 1, 4096)
	sess := rdma.NewSession()
	tk, err := sess.Acquire(t.Context())
	require.NoError(t, err)
	for range 3 {
		cl := dial(t, s.addr, WithSession(sess))
		op := rdma.Op{Kind: rdma.OpFetchAdd, Region: r, Delta: 5, Once: tk}
		require.NoError(t, cl.Do(t.Context(), &op))
		require.Zero(t, op.Prev, "the retry was not answered with the first answer")
		require.EqualValues(t, 5, binary.NativeEndian.Uint64(mem))
		require.NoError(t, cl.Close())
	}
	tk.Release()
	cl := dial(t, s.addr, WithSession(sess))
	for _, op := range []rdma.Op{
		{Kind: rdma.OpFetchAdd, Region: r, Delta: 1},
		{Kind: rdma.OpCompareAndSwap, Region: r, Old: 6, New: 9},
		{Kind: rdma.OpWrite, Region: r, Offset: 8, Buf: []byte("once")},
	} {
		tk, err := sess.Acquire(t.Context())
		require.NoError(t, err)
		op.Once = tk
		require.NoError(t, cl.Do(t.Context(), &op))
		first := op
		op.Prev, op.Swapped = 0, false
		require.NoError(t, cl.Do(t.Context(), &op), "retry of %s", op.Kind)
		// A CAS run again would answer not swapped (the word is new now);
		// a retry answered from the cache repeats the first answer.
		require.Equal(t, first.Prev, op.Prev, "retry of %s", op.Kind)
		require.Equal(t, first.Swapped, op.Swapped, "retry of %s", op.Kind)
		tk.Release()
	}
	require.EqualValues(t, 9, binary.NativeEndian.Uint64(mem))
	require.Equal(t, "once", string(mem[8:12]))
}

// TestReadersTakeNoSession: a client that only reads takes no place in
// the session table, so it cannot push out a session whose retry then
// would be answered INDETERMINATE: the retry is answered from the cache.
func TestReadersTakeNoSession(t *testing.T) {
	s := startServer(t, ServerConfig{MaxSessions: 1})
	mem, r := s.export(t, 1, 4096)
	sess := rdma.NewSession()
	tk, err := sess.Acquire(t.Context())
	require.NoError(t, err)
	defer tk.Release()
	op := rdma.Op{Kind: rdma.OpFetchAdd, Region: r, Delta: 1, Once: tk}
	cl := dial(t, s.addr, WithSession(sess))
	require.NoError(t, cl.Do(t.Context(), &op))
	require.NoError(t, cl.Close())
	for range 3 { // each dial without WithSession has a session id of its own
		rd := dial(t, s.addr)
		require.NoError(t, rd.Read(t.Context(), r, 0, make([]byte, 8)))
		require.NoError(t, rd.Close())
	}
	op.Prev = 7
	require.NoError(t, dial(t, s.addr, WithSession(sess)).Do(t.Context(), &op))
	require.Zero(t, op.Prev, "the retry is answered from the cache")
	require.EqualValues(t, 1, binary.NativeEndian.Uint64(mem))
}

// TestOnceIndeterminate: when the server no longer holds the session's
// replies (evicted by other sessions, or the server restarted), a retry is
// answered ErrIndeterminate and not applied; a fresh ticket still runs.
func TestOnceIndeterminate(t *testing.T) {
	for _, tc := range []struct {
		name string
		// lose returns the address of a server that serves mem as
		// segment 1 under key but lacks the session's replies.
		lose func(t *testing.T, s *testServer, mem []byte, key rdma.Key) string
	}{
		{"evicted", func(t *testing.T, s *testServer, _ []byte, key rdma.Key) string {
			// A second session (MaxSessions is 1) that posts an
			// exactly-once op: a session takes its place at its first.
			other := rdma.NewSession()
			tk, err := other.Acquire(t.Context())
			require.NoError(t, err)
			defer tk.Release()
			op := rdma.Op{Kind: rdma.OpFetchAdd, Region: rdma.Region{Segment: 1, Key: key, Epoch: 1}, Offset: 8, Delta: 1, Once: tk}
			require.NoError(t, dial(t, s.addr, WithSession(other)).Do(t.Context(), &op))
			return s.addr
		}},
		{"server restarted", func(t *testing.T, _ *testServer, mem []byte, key rdma.Key) string {
			s := startServer(t, ServerConfig{}) // a new process, the same memory
			require.NoError(t, s.ExportKey(1, mem, 1, key))
			return s.addr
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, ServerConfig{MaxSessions: 1})
			mem, r := s.export(t, 1, 4096)
			sess := rdma.NewSession()
			tk, err := sess.Acquire(t.Context())
			require.NoError(t, err)
			cl := dial(t, s.addr, WithSession(sess))
			op := rdma.Op{Kind: rdma.OpFetchAdd, Region: r, Delta: 1, Once: tk}
			require.NoError(t, cl.Do(t.Context(), &op))
			require.NoError(t, cl.Close())

			cl = dial(t, tc.lose(t, s, mem, r.Key), WithSession(sess))
			err = cl.Do(t.Context(), &op)
			require.ErrorIs(t, err, rdma.ErrIndeterminate)
			require.EqualValues(t, 1, binary.NativeEndian.Uint64(mem), "the retry was applied again")
			tk.Release()

			tk, err = sess.Acquire(t.Context())
			require.NoError(t, err)
			defer tk.Release()
			op = rdma.Op{Kind: rdma.OpFetchAdd, Region: r, Delta: 1, Once: tk}
			require.NoError(t, cl.Do(t.Context(), &op))
			require.EqualValues(t, 2, binary.NativeEndian.Uint64(mem))
		})
	}
}

// TestOnceForeignTicket: a ticket of another session is refused before it
// is sent: ErrIndeterminate once it was posted, ErrNotSupported before.
func TestOnceForeignTicket(t *testing.T) {
	s := startServer(t, ServerConfig{})
	mem, r := s.export(t, 1, 4096)
	cl := dial(t, s.addr)
	tk, err := rdma.NewSession().Acquire(t.Context())
	require.NoError(t, err)
	defer tk.Release()
	op := rdma.Op{Kind: rdma.OpFetchAdd, Region: r, Delta: 1, Once: tk}
	require.ErrorIs(t, cl.Do(t.Context(), &op), rdma.ErrNotSupported)
	tk.Post()
	require.ErrorIs(t, cl.Do(t.Context(), &op), rdma.ErrIndeterminate)
	require.Zero(t, binary.NativeEndian.Uint64(mem))
	op = rdma.Op{Kind: rdma.OpRead, Region: r, Buf: make([]byte, 8), Once: tk}
	require.ErrorIs(t, cl.Do(t.Context(), &op), rdma.ErrNotSupported, "a READ takes no ticket")
}

// TestSlotDecide is the reply cache's rule table.
func TestSlotDecide(t *testing.T) {
	for _, tc := range []struct {
		name      string
		known     bool
		last, seq uint32
		retry     bool
		want      verdict
	}{
		{"fresh slot, first op", true, 0, 1, false, execute},
		{"retry of an op that never arrived", true, 4, 5, true, execute},
		{"retry after ops that never arrived", true, 4, 9, true, execute},
		{"retry of the last op", true, 5, 5, true, replay},
		{"repeat of the last op", true, 5, 5, false, replay},
		{"stale duplicate: slot reused", true, 5, 4, false, indeterminate},
		{"stale retry", true, 5, 3, true, indeterminate},
		{"lost history, new op", false, 0, 7, false, execute},
		{"lost history, retry", false, 0, 7, true, indeterminate},
		{"sequence wraps", true, 1<<32 - 1, 0, false, execute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sl := slot{known: tc.known, seq: tc.last}
			require.Equal(t, tc.want, sl.decide(tc.seq, tc.retry))
		})
	}
}

// TestSessionTableBound: the table holds at most max sessions and evicts
// the least recently used; a resumed unknown session has unknown slots.
func TestSessionTableBound(t *testing.T) {
	tb := newSessionTable(3, nil)
	key := func(i byte) sessionKey { return sessionKey{name: "c", id: [sessionIDSize]byte{i}} }
	a := tb.open(key(1), "", false)
	tb.open(key(2), "", false)
	tb.open(key(3), "", false)
	tb.touch(a) // 2 is now the least recently used
	tb.open(key(4), "", false)
	require.Len(t, tb.m, 3)
	require.Same(t, a, tb.open(key(1), "", true), "a live session is kept, resumed or not")
	require.Len(t, tb.m, 3)
	require.NotContains(t, tb.m, key(2))
	resumed := tb.open(key(2), "", true)
	require.False(t, resumed.slots[0].known, "a resumed session the table lost must have unknown slots")
	require.True(t, tb.open(key(5), "", false).slots[0].known)
	require.Len(t, tb.m, 3)
	require.NotSame(t, tb.open(sessionKey{name: "other", id: key(5).id}, "", false), tb.m[key(5)], "another credential is another session")
}

// TestSessionTableFairShare: a client that opens session after session
// (a new session id at each hello) fills the table and then evicts its
// own, not the sessions of the others, even those used less recently.
func TestSessionTableFairShare(t *testing.T) {
	tb := newSessionTable(64, nil) // a share of 4
	bob := sessionKey{name: "p:bob", id: [sessionIDSize]byte{1}}
	carol := sessionKey{name: "p:carol", id: [sessionIDSize]byte{2}}
	b, c := tb.open(bob, "", false), tb.open(carol, "", false)
	for i := range 1000 {
		tb.open(sessionKey{name: "p:mallory", id: [sessionIDSize]byte{3, byte(i), byte(i >> 8)}}, "", false)
	}
	require.Len(t, tb.m, 64)
	require.Same(t, b, tb.m[bob], "bob's session outlives mallory's churn")
	require.Same(t, c, tb.m[carol])
	require.Equal(t, 62, tb.owned["p:mallory"])
	for i := range 8 { // a newcomer takes mallory's places, past its own share too
		tb.open(sessionKey{name: "p:dave", id: [sessionIDSize]byte{4, byte(i)}}, "", false)
	}
	require.Len(t, tb.m, 64)
	require.Equal(t, 8, tb.owned["p:dave"])
	require.Equal(t, 54, tb.owned["p:mallory"])
	require.Same(t, b, tb.m[bob])
}

// TestSessionTableTenantShare: one identity that opens its sessions under
// many principals (a client id each, as poold's clients of one identity
// may), directly or forwarded, shares one share of the table: it evicts
// its own sessions, not those of another identity's principals, nor of a
// principal Tenant names no tenant for.
func TestSessionTableTenantShare(t *testing.T) {
	tenant := func(principal string) string {
		ident, _, _ := strings.Cut(principal, "-")
		if ident == "anon" {
			return ""
		}
		return "cn:" + ident
	}
	tb := newSessionTable(64, tenant) // a share of 4
	others := []sessionKey{
		{name: "p:bob-1", id: [sessionIDSize]byte{1}},
		{name: "p:carol-1", id: [sessionIDSize]byte{2}},
		{name: "p:carol-2", id: [sessionIDSize]byte{3}},
		{name: "p:anon-1", id: [sessionIDSize]byte{4}},
		{name: "c:credential", id: [sessionIDSize]byte{5}},
	}
	kept := make([]*session, len(others))
	for i, k := range others {
		kept[i] = tb.open(k, tb.tenantOf(k), false)
	}
	for i := range 1100 {
		k := sessionKey{name: fmt.Sprintf("p:mallory-%d", i), id: [sessionIDSize]byte{6, byte(i), byte(i >> 8)}}
		if i%2 == 0 {
			tb.open(k, tb.tenantOf(k), false)
		} else {
			tb.openForwarded(k)
		}
	}
	require.Len(t, tb.m, 64)
	for i, k := range others {
		require.True(t, kept[i] == tb.m[k], "%s's session outlives mallory's principals", k.name)
	}
	require.Equal(t, 59, tb.owned["t:cn:mallory"])
	require.Equal(t, 2, tb.owned["t:cn:carol"])
	require.Equal(t, 1, tb.owned["p:anon-1"], "a principal without a tenant is its own")
}

// TestTenantNamedAtHello: a session counts against the tenant its
// principal had when the client authenticated. A client that ends its
// credential between its hello and its first ONCE request (poold revokes
// a data-plane credential when its control session ends) is no tenant
// by then; counted as a tenant of its own, each of its many principals
// would stay within a share and push the other tenants' sessions out.
func TestTenantNamedAtHello(t *testing.T) {
	var ended sync.Map
	cfg := ServerConfig{MaxSessions: 64}
	// The hello's credential names its tenant; Tenant, asked later,
	// would find an ended one's gone (it serves forwarded ops).
	cfg.Identify = func(cred []byte, _ *x509.Certificate) (string, string, error) {
		ident, _, _ := strings.Cut(string(cred), "-")
		return string(cred), "cn:" + ident, nil
	}
	cfg.Tenant = func(p string) string {
		if _, ok := ended.Load(p); ok {
			return ""
		}
		ident, _, _ := strings.Cut(p, "-")
		return "cn:" + ident
	}
	s := startServer(t, cfg)
	_, r := s.export(t, 1, 4096)
	fadd := func(cred string) {
		sess := rdma.NewSession()
		cl := dial(t, s.addr, WithCredential([]byte(cred)), WithSession(sess))
		if strings.HasPrefix(cred, "mallory") {
			ended.Store(cred, true)
		}
		tk, err := sess.Acquire(t.Context())
		require.NoError(t, err)
		defer tk.Release()
		op := rdma.Op{Kind: rdma.OpFetchAdd, Region: r, Delta: 1, Once: tk}
		require.NoError(t, cl.Do(t.Context(), &op))
	}
	fadd("bob-1")
	fadd("carol-1")
	for i := range 100 {
		fadd(fmt.Sprintf("mallory-%d", i))
	}
	s.sessions.mu.Lock()
	defer s.sessions.mu.Unlock()
	names := map[string]int{}
	for k := range s.sessions.m {
		names[k.name]++
	}
	require.Equal(t, 1, names["p:bob-1"], "bob's session outlives mallory's ended credentials")
	require.Equal(t, 1, names["p:carol-1"], "carol's session outlives mallory's ended credentials")
	require.Len(t, s.sessions.owned, 3, "three tenants: %v", s.sessions.owned)
}

// TestVersions: a version 1 client is still served, without sessions (its
// ONCE flag is UNSUPPORTED); a server that speaks only version 1 refuses
// this client with an error matching rdma.ErrNotSupported.
func TestVersions(t *testing.T) {
	t.Run("old client", func(t *testing.T) {
		s := startServer(t, ServerConfig{})
		mem, r := s.export(t, 1, 4096)
		nc := rawConn(t, s.addr)
		_, err := nc.Write(appendHello(nil, hello{version: 1}))
		require.NoError(t, err)
		rep := readReply(t, nc)
		require.Equal(t, replyAccept, rep.code)
		require.EqualValues(t, 1, rep.version)
		h := reqHeader{id: 1, op: opFADD, seg: 1, key: r.Key, epoch: 1, length: 8, arg0: 3}
		_, err = nc.Write(requestFrame(t, &h))
		require.NoError(t, err)
		require.Equal(t, statusOK, readResponse(t, nc).status)
		h.id, h.flags, h.slot, h.seq = 2, reqFlagOnce, 1, 1
		_, err = nc.Write(requestFrame(t, &h))
		require.NoError(t, err)
		require.Equal(t, statusUnsupported, readResponse(t, nc).status)
		require.EqualValues(t, 3, binary.NativeEndian.Uint64(mem))
	})
	t.Run("old server", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer l.Close()
		go func() {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			defer nc.Close()
			var b [helloSize]byte
			io.ReadFull(nc, b[:])
			encodeReply(b[:], reply{version: 1, code: replyBadVersion, maxPayload: MaxPayload})
			nc.Write(b[:])
		}()
		_, err = Dial(t.Context(), l.Addr().String())
		require.ErrorIs(t, err, rdma.ErrNotSupported)
		require.ErrorContains(t, err, "speaks version 1")
	})
}

// TestSessionFreshOnAnyConnection: a client's first connection opens its
// session with a hello without RESUME, its second resumes it; when the
// session's first ONCE request comes over the second, the session still
// starts with known slots, so a RETRY of an op that never arrived (its
// connection broke before sending it) runs instead of being
// INDETERMINATE. After the table lost the session, a resumed one has
// unknown slots again.
func TestSessionFreshOnAnyConnection(t *testing.T) {
	s := startServer(t, ServerConfig{MaxSessions: 1})
	mem, r := s.export(t, 1, 4096)
	id := [sessionIDSize]byte{42}
	open := func(resume bool, sess [sessionIDSize]byte) net.Conn {
		nc := rawConn(t, s.addr)
		_, err := nc.Write(appendHello(nil, hello{version: Version, session: sess, resume: resume}))
		require.NoError(t, err)
		require.Equal(t, replyAccept, readReply(t, nc).code)
		return nc
	}
	fadd := func(nc net.Conn, slot uint16, seq uint32) uint16 {
		h := reqHeader{id: 1, op: opFADD, flags: reqFlagOnce | reqFlagRetry, slot: slot, seq: seq, seg: 1, key: r.Key, epoch: 1, length: 8, arg0: 1}
		_, err := nc.Write(requestFrame(t, &h))
		require.NoError(t, err)
		return readResponse(t, nc).status
	}
	open(false, id)
	second := open(true, id)
	require.Equal(t, statusOK, fadd(second, 3, 1), "a retry on a fresh session runs")
	require.Equal(t, statusOK, fadd(second, 3, 1), "and is answered from the cache when sent again")
	require.EqualValues(t, 1, le.Uint64(mem), "applied once")

	open(false, [sessionIDSize]byte{43})
	require.Equal(t, statusOK, fadd(open(true, [sessionIDSize]byte{43}), 0, 1)) // evicts session 42
	require.Equal(t, statusIndeterminate, fadd(open(true, id), 3, 2), "an evicted session resumed has unknown slots")
}

// TestOnceRefusalNotCached: an exactly-once op refused ACCESS_DENIED (a
// reader's write, as on a copy not yet promoted) applied nothing and is
// not cached: its retry with the same ticket runs once the segment is
// writable, and a retry after that is answered from the cache.
func TestOnceRefusalNotCached(t *testing.T) {
	cfg := fwdConfig()
	cfg.Identify = namedCreds
	s := startServer(t, cfg)
	mem, r := s.export(t, 1, 4096)
	require.NoError(t, s.Allow(1, []string{"app"}))
	require.NoError(t, s.AllowReaders(1, []string{"app"}))
	sess := rdma.NewSession()
	cl := dial(t, s.addr, WithCredential([]byte("app")), WithSession(sess), WithBusyPoll(-1))
	tk, err := sess.Acquire(t.Context())
	require.NoError(t, err)
	op := rdma.Op{Kind: rdma.OpFetchAdd, Region: r, Delta: 5, Once: tk}
	require.ErrorIs(t, cl.Do(t.Context(), &op), rdma.ErrAccessDenied)
	require.ErrorIs(t, cl.Do(t.Context(), &op), rdma.ErrAccessDenied, "still a reader")
	require.Zero(t, binary.NativeEndian.Uint64(mem))

	require.NoError(t, s.AllowReaders(1, nil))
	for range 2 {
		op.Prev = 1
		require.NoError(t, cl.Do(t.Context(), &op), "the retry runs once the segment is writable")
		require.Zero(t, op.Prev)
		require.EqualValues(t, 5, binary.NativeEndian.Uint64(mem), "applied once")
	}
	tk.Release()
}
