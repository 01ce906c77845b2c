package pool

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// TestRebuildUnsealAfterOriginRestart kills the origin of a replicas=2
// segment after a rebuild's switch committed the new home OK and before
// the primary took the ABORT that unseals it (the primary refuses every
// ABORT until the origin is down). The restarted origin has nothing to
// rebuild; it unseals the primary once it has set its forwarding again
// (replicateLater, unsealIdle), and a write there is applied.
func TestRebuildUnsealAfterOriginRestart(t *testing.T) {
	rs := newRedundantSim(t, 9, 1<<20, func(*simHost) {})
	sc, primary := rs.sc, rs.rep.Homes[0]
	pr := sc.host(primary.Node).daemon().pool
	var sealed, refuse atomic.Bool
	refuse.Store(true)
	refused := make(chan struct{}, 1)
	pr.cfg.sim.moveOutStep = func(_ caller, req *poolv1.MoveOutRequest) error {
		switch {
		case req.HomeId != primary.HomeID:
		case req.Phase == poolv1.MoveOutPhase_MOVE_OUT_SEAL:
			sealed.Store(true)
		case req.Phase == poolv1.MoveOutPhase_MOVE_OUT_ABORT && sealed.Load() && refuse.Load():
			select {
			case refused <- struct{}{}:
			default:
			}
			return fmt.Errorf("%w: the test stands for an origin killed before this ABORT", errs.ErrUnavailable)
		}
		return nil
	}
	sc.crash(sc.host(rs.rep.Homes[1].Node))
	select {
	case <-refused:
	case <-time.After(time.Minute):
		t.Fatal("the rebuild did not unseal the primary after its SEAL")
	}
	origin := rs.oh.daemon()
	r, _ := origin.pool.redundantRecord(rs.repID)
	require.Equal(t, poolv1.HomeState_HOME_STATE_OK, r.Homes[1].State, "the switch committed the new home OK")
	crashed := errors.New("killed by the test")
	origin.failErr.Store(&crashed) // no leave: the others do not hear it go
	require.NoError(t, origin.Close())
	refuse.Store(false)
	require.NoError(t, sc.start(rs.oh))
	require.Eventually(t, func() bool {
		pr.mu.Lock()
		defer pr.mu.Unlock()
		rec, ok := pr.segs[primary.HomeID]
		return ok && !rec.Sealed
	}, 30*time.Second, 10*time.Millisecond, "the restarted origin does not unseal the primary")
	c := homeConn(t, rs.oh.daemon(), primary)
	require.NoError(t, c.Do(t.Context(), &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(primary), Buf: []byte{1}}))
}
