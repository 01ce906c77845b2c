package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/rdma"
)

// withdrawFault refuses (UNAVAILABLE), at one host, the Authorize calls
// that would take one client's access to one segment there: a withdrawal
// naming it, or a set for it without the client (with grants: a set for
// it with the client, which gives the access). It refuses the next refuse
// of them (-1: every one) and then counts those it answers. Safe for
// concurrent use.
type withdrawFault struct {
	client string
	// noSets answers every Authorize with sets as a poold built before
	// them does: ErrInvalid (it reads a request with no client id).
	noSets bool
	grants bool

	mu       sync.Mutex
	node     string
	id       uint64
	refuse   int
	refused  int
	answered int
}

// arm watches segment id at node, refusing the next n withdrawals (-1:
// all).
func (f *withdrawFault) arm(node string, id uint64, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.node, f.id, f.refuse, f.refused, f.answered = node, id, n, 0, 0
}

// stopRefusing answers the withdrawals from now on.
func (f *withdrawFault) stopRefusing() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuse = 0
}

// counts is how many withdrawals were refused and answered so far.
func (f *withdrawFault) counts() (refused, answered int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused, f.answered
}

// hits reports whether req, served at host, takes f's client's access to
// f's segment (with grants: gives it).
func (f *withdrawFault) hits(host string, req *poolv1.AuthorizeRequest) bool {
	if host != f.node || f.id == 0 {
		return false
	}
	if !f.grants && req.Withdraw && req.ClientId == f.client && slices.Contains(req.Ids, f.id) {
		return true
	}
	for _, s := range req.Sets {
		if s.Id == f.id && slices.Contains(s.ClientIds, f.client) == f.grants {
			return true
		}
	}
	return false
}

// interceptor is f's gRPC server interceptor for host.
func (f *withdrawFault) interceptor(host string) grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ar, ok := req.(*poolv1.AuthorizeRequest)
		if !ok {
			return h(ctx, req)
		}
		if f.noSets && len(ar.Sets) > 0 {
			return nil, errs.ToStatus(fmt.Errorf("%w: delegated client id \"\"", errs.ErrInvalid))
		}
		f.mu.Lock()
		if !f.hits(host, ar) {
			f.mu.Unlock()
			return h(ctx, req)
		}
		if f.refuse != 0 {
			f.refuse--
			f.refused++
			f.mu.Unlock()
			return nil, status.Error(codes.Unavailable, "the test refuses the withdrawal")
		}
		f.mu.Unlock()
		resp, err := h(ctx, req)
		if err == nil {
			f.mu.Lock()
			f.answered++
			f.mu.Unlock()
		}
		return resp, err
	})
}

// detachFixture is an origin (the third of 3 simulated hosts) whose
// clients hold segments on one peer P: the reader's own, and a named
// segment of the owner's that the reader and the keeper attached.
type detachFixture struct {
	t      *testing.T
	sc     *simCluster
	origin *simHost
	fault  *withdrawFault
	conns  map[string]*session.Conn
	own    *poolv1.Segment // the reader's own segment, on P
	shared *poolv1.Segment // the owner's named segment, on P
}

func newDetachFixture(t *testing.T, fault ...func(*withdrawFault)) *detachFixture {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: 10 * time.Second})
	fx := &detachFixture{t: t, sc: sc, origin: sc.hosts[2], fault: &withdrawFault{client: "reader"}, conns: map[string]*session.Conn{}}
	for _, f := range fault {
		f(fx.fault)
	}
	for _, h := range sc.hosts {
		h.cfg.sim.grpc = append(slices.Clip(h.cfg.sim.grpc), fx.fault.interceptor(h.name))
	}
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	for _, id := range []string{"owner", "reader", "keeper"} {
		conn, err := session.Dial(t.Context(), "unix", fx.origin.cfg.Socket, session.Options{ClientID: id})
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		fx.conns[id] = conn
	}
	fx.own, err = fx.api("reader").Alloc(fx.call("reader"), &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA})
	require.NoError(t, errs.FromStatus(err))
	require.NotEmpty(t, fx.own.Node, "the reader's segment is on a peer")
	// The shared segment goes where the reader's own is: placed there, or
	// moved there (placement prefers the nearer peer by measured latency,
	// which can keep choosing the other one).
	seg, err := fx.api("owner").Alloc(fx.call("owner"), &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, Name: "shared"})
	require.NoError(t, errs.FromStatus(err))
	if seg.Node != fx.own.Node {
		moved, err := fx.api("owner").Move(fx.call("owner"), &poolv1.MoveRequest{Id: seg.Id, ToNode: fx.own.Node})
		require.NoError(t, errs.FromStatus(err))
		seg = moved.Segment
	}
	require.Equal(t, fx.own.Node, seg.Node)
	fx.shared = seg
	for _, id := range []string{"reader", "keeper"} {
		_, err := fx.api(id).Attach(fx.call(id), &poolv1.AttachRequest{Name: "shared"})
		require.NoError(t, errs.FromStatus(err), "attach by %s", id)
	}
	return fx
}

func (fx *detachFixture) api(client string) poolv1.PoolClient { return fx.conns[client].API() }

// call is a context carrying client's session, waiting for it while the
// origin restarts.
func (fx *detachFixture) call(client string) context.Context {
	ctx, cancel := context.WithTimeout(fx.t.Context(), 20*time.Second)
	fx.t.Cleanup(cancel)
	cctx, _, err := fx.conns[client].Call(ctx)
	require.NoError(fx.t, err, "%s's session with the origin", client)
	return cctx
}

// home dials P's data plane with client's credential there, as the
// origin hands it out now (a Stat of seg).
func (fx *detachFixture) home(client string, seg *poolv1.Segment) rdma.Conn {
	t := fx.t
	var now *poolv1.Segment
	require.Eventually(t, func() bool {
		var err error
		now, err = fx.api(client).Stat(fx.call(client), &poolv1.StatRequest{Id: seg.Id})
		require.NoError(t, errs.FromStatus(err))
		return len(now.DataCredential) == 16
	}, 20*time.Second, 50*time.Millisecond, "a credential at %s for %s", seg.Node, client)
	dc, err := dialHome(t.Context(), now.Node, now.DataAddr, false, nil, now.DataCredential)
	require.NoError(t, err)
	t.Cleanup(func() { dc.Close() })
	return dc
}

// read reads seg over dc.
func (fx *detachFixture) read(dc rdma.Conn, seg *poolv1.Segment) error {
	return dc.Do(fx.t.Context(), &rdma.Op{Kind: rdma.OpRead, Region: segRegion(seg), Buf: make([]byte, 4096)})
}

// detach detaches the reader from the shared segment; the origin answers
// it whatever its home said.
func (fx *detachFixture) detach() {
	_, err := fx.api("reader").Detach(fx.call("reader"), &poolv1.DetachRequest{Id: fx.shared.Id})
	require.NoError(fx.t, errs.FromStatus(err))
}

// restartOrigin closes the origin's daemon, runs between, and starts it
// again from its store.
func (fx *detachFixture) restartOrigin(between func()) {
	o := fx.origin
	o.mu.Lock()
	d := o.d
	o.d = nil
	o.mu.Unlock()
	require.NoError(fx.t, d.Close())
	between()
	require.NoError(fx.t, fx.sc.start(o))
}

// waitCounts waits until the fault refused and answered at least as many
// withdrawals as given.
func (fx *detachFixture) waitCounts(refused, answered int, why string) {
	require.Eventually(fx.t, func() bool {
		r, a := fx.fault.counts()
		return r >= refused && a >= answered
	}, 30*time.Second, 20*time.Millisecond, why)
}

// TestDetachWithdrawnAfterRefusal: on 3 simulated hosts, a client (the
// reader) of the origin holds a segment of its own on a peer P and has
// attached a segment of another client there. It detaches, and P refuses
// the origin's withdrawal. The origin retries in the background; after
// the retry, the reader's data-plane connection to P (opened with its
// credential there before the detach) is refused (ACCESS_DENIED) on the
// detached segment and still reads its own; a client still attached
// reads the segment throughout.
func TestDetachWithdrawnAfterRefusal(t *testing.T) {
	fx := newDetachFixture(t)
	dc := fx.home("reader", fx.own)
	require.NoError(t, fx.read(dc, fx.shared), "the attached reader")
	keeper := fx.home("keeper", fx.shared)
	require.NoError(t, fx.read(keeper, fx.shared), "the keeper")

	fx.fault.arm(fx.own.Node, fx.shared.HomeId, 1)
	fx.detach()
	fx.waitCounts(1, 1, "the origin tells P again after the refused withdrawal")
	require.ErrorIs(t, fx.read(dc, fx.shared), rdma.ErrAccessDenied, "the detached reader at P")
	require.NoError(t, fx.read(dc, fx.own), "the reader's own segment at P")
	require.NoError(t, fx.read(keeper, fx.shared), "the keeper, still attached")
}

// TestAttachToldAfterRefusal: the reader detaches the shared segment and
// attaches it again while P refuses the grant. Attach answers
// ErrUnavailable (the attachment is recorded, P not told); the origin
// tells P again in the background, after which the reader's credential
// reads the segment at P and a retried Attach succeeds.
func TestAttachToldAfterRefusal(t *testing.T) {
	fx := newDetachFixture(t)
	fx.detach()
	fx.fault.mu.Lock()
	fx.fault.grants = true
	fx.fault.mu.Unlock()
	fx.fault.arm(fx.own.Node, fx.shared.HomeId, 1)
	_, err := fx.api("reader").Attach(fx.call("reader"), &poolv1.AttachRequest{Name: "shared"})
	err = errs.FromStatus(err)
	require.ErrorIs(t, err, errs.ErrUnavailable, "attach while P refuses the grant")
	require.ErrorContains(t, err, "retry Attach")
	fx.waitCounts(1, 1, "the origin tells P again after the refused grant")
	require.NoError(t, fx.read(fx.home("reader", fx.own), fx.shared), "the reader at P after the retry")
	_, err = fx.api("reader").Attach(fx.call("reader"), &poolv1.AttachRequest{Name: "shared"})
	require.NoError(t, errs.FromStatus(err), "attach again")
}

// TestRestartedOriginWithdrawsDetached: as TestDetachWithdrawnAfterRefusal,
// but P refuses every withdrawal until the origin is closed (its retries
// included), and the origin restarts from its store with the withdrawal
// pending. Once the new peer session is up, the reader's connection from
// before the restart is refused on the detached segment (before any
// client asks for a credential), and so is its new credential from P,
// which reads its own; the keeper, still attached, reads the segment
// before, meanwhile and after with its new credential.
func TestRestartedOriginWithdrawsDetached(t *testing.T) {
	fx := newDetachFixture(t)
	old := fx.home("reader", fx.own)
	require.NoError(t, fx.read(old, fx.shared), "the attached reader")
	keeper := fx.home("keeper", fx.shared)

	fx.fault.arm(fx.own.Node, fx.shared.HomeId, -1)
	fx.detach()
	fx.waitCounts(1, 0, "the detach's withdrawal refused")
	require.NoError(t, fx.read(keeper, fx.shared), "the keeper, while the withdrawal is pending")

	fx.restartOrigin(fx.fault.stopRefusing)

	// No client asks for a credential first: the new session tells P.
	require.Eventually(t, func() bool {
		return errors.Is(fx.read(old, fx.shared), rdma.ErrAccessDenied)
	}, 20*time.Second, 50*time.Millisecond, "the detached reader's connection from before the restart")
	now := fx.home("reader", fx.own)
	require.ErrorIs(t, fx.read(now, fx.shared), rdma.ErrAccessDenied, "the detached reader's new credential at P")
	require.NoError(t, fx.read(now, fx.own), "the reader's own segment at P")
	require.NoError(t, fx.read(fx.home("keeper", fx.shared), fx.shared), "the keeper, still attached, after the restart")
	_, answered := fx.fault.counts()
	require.Positive(t, answered, "P was told after the restart")
}

// TestOldHomeTakesAdds: the peers answer complete lists of who may use a
// segment as a poold built before them does (ErrInvalid: a request with
// no client id). After the origin restarts, its new session with P tells
// P who may use the segments there before P delegates: the origin adds
// each client instead of the lists, so the reader reads its own segment
// and the attached one at P, and the keeper the attached one.
func TestOldHomeTakesAdds(t *testing.T) {
	fx := newDetachFixture(t, func(f *withdrawFault) { f.noSets = true })
	fx.restartOrigin(func() {})
	dc := fx.home("reader", fx.own)
	require.NoError(t, fx.read(dc, fx.own), "the reader's own segment at P")
	require.NoError(t, fx.read(dc, fx.shared), "the attached segment at P")
	require.NoError(t, fx.read(fx.home("keeper", fx.shared), fx.shared), "the keeper")
}
