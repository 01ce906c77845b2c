package pool

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// TestMoveRate: a daemon with a move rate (--move-rate) paces the copy of
// a move it directs: a segment moved at the least rate counts all its
// bytes against it (the pacer's schedule ends at least the segment's size
// at that rate after the move began), and arrives whole at its new home;
// so does a segment promoted to the local tier, while a demotion is not
// paced.
func TestMoveRate(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: 10 * time.Second})
	oh := sc.hosts[2]
	oh.cfg.MoveRate = leastMoveRate
	c, seg, before := startHandover(t, sc, oh)
	from := seg.Node()
	began := time.Now()
	require.NoError(t, c.Move(t.Context(), seg))
	rate := oh.daemon().pool.moveRate
	require.NotNil(t, rate, "the daemon paces its moves")
	paced := func(since time.Time) time.Duration {
		rate.mu.Lock()
		defer rate.mu.Unlock()
		return rate.next.Sub(since)
	}
	least := time.Duration(float64(handoverSize) / float64(leastMoveRate) * float64(time.Second))
	require.GreaterOrEqual(t, paced(began), least, "the copy's bytes went through the pacer")
	r, err := oh.daemon().pool.Stat(seg.ID())
	require.NoError(t, err)
	require.NotEqual(t, from, r.Home, "moved")
	got := make([]byte, handoverSize)
	_, err = seg.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, before, got)

	// A demotion from the local tier is not paced: the segment is out of
	// use for the whole copy. Promoted back, it is.
	local, err := c.Alloc(t.Context(), handoverSize, alloc.WithTier(alloc.TierLocal))
	require.NoError(t, err)
	_, err = local.WriteAt(before, 0)
	require.NoError(t, err)
	rate.mu.Lock()
	prev := rate.next
	rate.mu.Unlock()
	require.NoError(t, c.Move(t.Context(), local, alloc.ToTier(alloc.TierRDMA)))
	rate.mu.Lock()
	require.Equal(t, prev, rate.next, "a demotion does not ask the pacer")
	rate.mu.Unlock()
	began = time.Now()
	require.NoError(t, c.Move(t.Context(), local, alloc.ToTier(alloc.TierLocal)))
	require.GreaterOrEqual(t, paced(began), least, "the promotion's bytes went through the pacer")
	_, err = local.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, before, got)
}

// TestMoveSealedRoundUnpaced: the last round of a promotion, copied while
// the source refuses writes, does not wait for its turn under the move
// rate, so other moves holding the pacer's next seconds (10 s of them
// here, taken at the seal) do not lengthen the pause: the pacer's
// schedule after the move is the one set at the seal, untouched.
func TestMoveSealedRoundUnpaced(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 2, leaseTTL: 10 * time.Second})
	oh, sh := sc.hosts[0], sc.hosts[1]
	oh.cfg.MoveRate = leastMoveRate
	var onSeal atomic.Pointer[func()]
	sh.cfg.sim.grpc = append(sh.cfg.sim.grpc, grpc.ChainUnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if mo, ok := req.(*poolv1.MoveOutRequest); ok && mo.Phase == poolv1.MoveOutPhase_MOVE_OUT_SEAL {
				if f := onSeal.Load(); f != nil {
					(*f)()
				}
			}
			return h(ctx, req)
		}))
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	ctx := t.Context()
	conn, call := appSession(t, oh)
	seg, err := conn.API().Alloc(call(), &poolv1.AllocRequest{Size: handoverSize, Tier: poolv1.Tier_TIER_RDMA})
	require.NoError(t, err)
	require.Equal(t, sh.name, seg.Node)
	dc, err := dialHome(ctx, seg.Node, seg.DataAddr, false, nil, seg.DataCredential)
	require.NoError(t, err)
	defer dc.Close()
	want := bytes.Repeat([]byte{0xa5}, handoverSize)
	require.NoError(t, dc.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: segRegion(seg), Buf: want}))
	rate := oh.daemon().pool.moveRate
	wrote := make(chan error, 1)
	sealedAt := make(chan time.Time, 1)
	seal := func() {
		// A write for the sealed round to copy, then other moves' turns:
		// the pacer's schedule 10 s ahead.
		select {
		case wrote <- dc.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: segRegion(seg), Offset: 8192, Buf: want[:4096]}):
		default:
		}
		rate.mu.Lock()
		rate.next = time.Now().Add(10 * time.Second)
		sealedAt <- rate.next
		rate.mu.Unlock()
	}
	onSeal.Store(&seal)
	_, err = conn.API().Move(call(), &poolv1.MoveRequest{Id: seg.Id, ToTier: poolv1.Tier_TIER_CXL})
	require.NoError(t, errs.FromStatus(err))
	require.NoError(t, <-wrote, "the write before the seal")
	rate.mu.Lock()
	after := rate.next
	rate.mu.Unlock()
	require.Equal(t, <-sealedAt, after, "the sealed round took no turn under the rate")
	r, err := oh.daemon().pool.Stat(seg.Id)
	require.NoError(t, err)
	require.Equal(t, poolv1.Tier_TIER_CXL, r.Tier, "promoted")
}
