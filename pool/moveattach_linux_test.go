package pool

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/rdma"
)

// authFault watches the Authorize calls that one host (node) serves for
// one client, once armed: at the first that gives the client access to a
// segment other than the client's own (a move's target authorizing the
// attachers, as the move begins; that segment is the move's copy) it runs
// during before serving it; the first that withdraws the client's access
// to the copy it refuses (UNAVAILABLE), after running refused. It then
// reports, on answered, whether each call that the host answered gave the
// client access to the copy. Safe for concurrent use.
type authFault struct {
	client   string
	answered chan bool

	mu              sync.Mutex
	node            string
	own             uint64 // the client's own segment there
	copy            uint64 // the move's copy there, once the move began
	state           int    // 0: not armed; 1: armed; 2: the move began; 3: refusing; 4: refused
	during, refused func()
}

// watch names the host and the client's own segment there.
func (f *authFault) watch(node string, own uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.node, f.own = node, own
}

// arm starts watching the next move; calls reported before are dropped.
func (f *authFault) arm(during, refused func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state, f.copy, f.during, f.refused = 1, 0, during, refused
	for len(f.answered) > 0 {
		<-f.answered
	}
}

// gives reports what ar says of the client's access to segment id: to
// give it or to withdraw it; ok is false when ar says nothing of it.
func (f *authFault) gives(ar *poolv1.AuthorizeRequest, id uint64) (give, ok bool) {
	if ar.ClientId == f.client && slices.Contains(ar.Ids, id) {
		return !ar.Withdraw, true
	}
	for _, set := range ar.Sets {
		if set.Id == id {
			return slices.Contains(set.ClientIds, f.client), true
		}
	}
	return false, false
}

// interceptor is f's gRPC server interceptor for host.
func (f *authFault) interceptor(host string) grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ar, ok := req.(*poolv1.AuthorizeRequest)
		if !ok {
			return h(ctx, req)
		}
		f.mu.Lock()
		state, copyID := f.state, f.copy
		give, says := f.gives(ar, copyID)
		switch {
		case host != f.node:
			f.mu.Unlock()
			return h(ctx, req)
		case state == 1 && ar.ClientId == f.client && !ar.Withdraw && len(ar.Ids) == 1 && ar.Ids[0] != f.own:
			f.state, f.copy = 2, ar.Ids[0]
			during := f.during
			f.mu.Unlock()
			during()
			return h(ctx, req)
		case state == 2 && says && !give:
			f.state = 3
			refused := f.refused
			f.mu.Unlock()
			if refused != nil {
				refused()
			}
			f.mu.Lock()
			f.state = 4
			f.mu.Unlock()
			return nil, status.Error(codes.Unavailable, "the test refuses the first withdrawal")
		}
		f.mu.Unlock()
		resp, err := h(ctx, req)
		if err == nil && state == 4 && says {
			f.answered <- give
		}
		return resp, err
	})
}

// TestMoveWithdrawsDetached: on 3 simulated hosts, a client (the reader)
// of the origin holds a segment of its own on a peer P, so it holds a
// credential P delegated to it, and attaches a segment of another client
// homed on the other peer. The segment moves to P; as the move begins
// (P's Authorize for the reader on the copy) the reader detaches, and P
// refuses the origin's first withdrawal of the reader's access at the
// switch-over. After the origin's retry, the reader's credential still
// reads its own segment on P and is refused (ACCESS_DENIED) on the moved
// one. Then, for a second segment, the reader attaches again before the
// retry (while P refuses the withdrawal): the retry reads the record
// then, gives the reader access rather than withdrawing it, and the
// reader reads the moved segment on P.
func TestMoveWithdrawsDetached(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: 10 * time.Second})
	f := &authFault{client: "reader", answered: make(chan bool, 16)}
	for _, h := range sc.hosts {
		h.cfg.sim.grpc = append(slices.Clip(h.cfg.sim.grpc), f.interceptor(h.name))
	}
	oh := sc.hosts[2] // places its clients' rdma segments on h0000 and h0001
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	ctx := t.Context()

	dial := func(id string) (*session.Conn, func() context.Context) {
		conn, err := session.Dial(ctx, "unix", oh.cfg.Socket, session.Options{ClientID: id})
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return conn, func() context.Context {
			cctx, _, err := conn.Call(ctx)
			if err != nil { // the call that follows fails, reported
				t.Errorf("a call on %s's session: %v", id, err)
				return ctx
			}
			return cctx
		}
	}
	owner, ownerCall := dial("owner")
	reader, readerCall := dial("reader")
	own, err := reader.API().Alloc(readerCall(), &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA})
	require.NoError(t, errs.FromStatus(err))
	require.Len(t, own.DataCredential, 16, "the reader's credential at %s", own.Node)
	f.watch(own.Node, own.HomeId)
	dc, err := dialHome(ctx, own.Node, own.DataAddr, false, nil, own.DataCredential)
	require.NoError(t, err)
	defer dc.Close()
	read := func(s *poolv1.Segment) error {
		return dc.Do(ctx, &rdma.Op{Kind: rdma.OpRead, Region: segRegion(s), Buf: make([]byte, 4096)})
	}

	// shared allocates a named segment of the owner's off P, attached by
	// the reader.
	shared := func(t *testing.T, name string) *poolv1.Segment {
		for try := 0; ; try++ {
			seg, err := owner.API().Alloc(ownerCall(), &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, Name: name})
			require.NoError(t, errs.FromStatus(err), "alloc %q", name)
			if seg.Node != own.Node {
				_, err = reader.API().Attach(readerCall(), &poolv1.AttachRequest{Name: name})
				require.NoError(t, errs.FromStatus(err), "attach %q", name)
				return seg
			}
			_, err = owner.API().Free(ownerCall(), &poolv1.FreeRequest{Id: seg.Id})
			require.NoError(t, errs.FromStatus(err), "free %q at %s", name, seg.Node)
			require.Less(t, try, 100, "placement put %q on %s at each of 100 tries", name, own.Node)
		}
	}
	// detach and attach run in P's interceptor: errors are reported, the
	// test goes on.
	detach := func(seg *poolv1.Segment) func() {
		return func() {
			_, err := reader.API().Detach(readerCall(), &poolv1.DetachRequest{Id: seg.Id})
			assert.NoError(t, errs.FromStatus(err), "detach during the move")
		}
	}
	attach := func(name string) func() {
		return func() {
			_, err := reader.API().Attach(readerCall(), &poolv1.AttachRequest{Name: name})
			assert.NoError(t, errs.FromStatus(err), "attach again before the retry")
		}
	}
	// move moves seg to P and waits for the first call for the reader
	// that P answers after the refusal (the origin's retry): it says
	// whether that call gave access.
	move := func(t *testing.T, seg *poolv1.Segment) (*poolv1.Segment, bool) {
		_, err := owner.API().Move(ownerCall(), &poolv1.MoveRequest{Id: seg.Id, ToNode: own.Node})
		require.NoError(t, errs.FromStatus(err))
		now, err := owner.API().Stat(ownerCall(), &poolv1.StatRequest{Id: seg.Id})
		require.NoError(t, errs.FromStatus(err))
		require.Equal(t, own.Node, now.Node)
		select {
		case give := <-f.answered:
			return now, give
		case <-time.After(30 * time.Second):
			t.Fatal("the origin did not tell the new home of the reader again after the refused withdrawal")
			return nil, false
		}
	}

	t.Run("detached", func(t *testing.T) {
		seg := shared(t, "detached-during-move")
		f.arm(detach(seg), nil)
		now, give := move(t, seg)
		require.False(t, give, "the retry withdraws the reader's access")
		require.NoError(t, read(own), "the reader's credential at %s is good for its own segment", own.Node)
		require.ErrorIs(t, read(now), rdma.ErrAccessDenied, "the detached reader at the moved segment's new home")
	})
	t.Run("reattached", func(t *testing.T) {
		seg := shared(t, "reattached-before-retry")
		f.arm(detach(seg), attach("reattached-before-retry"))
		now, give := move(t, seg)
		require.True(t, give, "the retry reads the record: the reader attached again")
		require.NoError(t, read(now), "the reader, attached again, at the moved segment's new home")
	})
}
