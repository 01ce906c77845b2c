package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// homeSwitchCase is a replicated segment whose primary on b moves to e:
// the record, linked in p's table and committed, the leaving home, the
// target and the intent.
func homeSwitchCase(t *testing.T, p *core) (leaving, target homeRef, in intent) {
	t.Helper()
	leaving = homeRef{Node: "b", HomeID: 70, DataAddr: "127.0.0.1:1", Key: rdma.Key{1}, Epoch: 1}
	target = homeRef{Node: "e", HomeID: 90, DataAddr: "127.0.0.1:3", Key: rdma.Key{3}, Epoch: 1, State: poolv1.HomeState_HOME_STATE_REBUILDING}
	r := &record{ID: 7, Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: 4096, Owner: "app", Redundancy: redundancy{Replicas: 2},
		Homes: []homeRef{leaving, {Node: "d", HomeID: 80, DataAddr: "127.0.0.1:2", Key: rdma.Key{2}, Epoch: 1}}}
	r.settle()
	require.NoError(t, p.st.put(r))
	p.mu.Lock()
	p.link(r)
	p.mu.Unlock()
	in = intent{ID: r.ID, From: leaving.Node, FromID: leaving.HomeID, To: target.Node, ToID: target.HomeID}
	require.NoError(t, p.st.putIntent(in))
	return leaving, target, in
}

// TestHomeSwitchCommit: the switch of a redundant segment's home commits
// without holding p.mu while its fsync runs: with the store's commit held
// open, the switch queues its own, and meanwhile p.mu is free, the table
// names the target (the writers are sealed: nobody writes before the
// commit is durable) and reconcile keeps the leaving home's copy. Once
// the store commits, the switch returns the record it committed, which a
// restarted daemon finds with the intent switched.
func TestHomeSwitchCommit(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	leaving, target, in := homeSwitchCase(t, p)

	release := holdCommit(p.st.storeFile)
	type result struct {
		rec record
		err error
	}
	done := make(chan result, 1)
	go func() {
		rec, err := p.commitHomeSwitch(in.ID, 0, leaving, target, in, 1)
		done <- result{rec, err}
	}()
	require.Eventually(t, queued(p.st.storeFile, 1), 10*time.Second, time.Millisecond, "the switch queued its commit")
	require.Eventually(t, func() bool {
		if !p.mu.TryLock() {
			return false
		}
		p.mu.Unlock()
		return true
	}, 10*time.Second, time.Millisecond, "p.mu is free while the switch's commit waits")
	rec, err := p.Stat(in.ID)
	require.NoError(t, err)
	require.Equal(t, "e", rec.Home, "the table names the target")
	known := map[uint64]bool{}
	p.moving.held(leaving.Node, known)
	require.True(t, known[leaving.HomeID], "reconcile keeps the leaving home's copy, which the table no longer names")
	select {
	case res := <-done:
		t.Fatalf("the switch returned before its commit: %+v", res)
	default:
	}
	require.NoError(t, release())
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, target.HomeID, res.rec.HomeID)
	require.Equal(t, poolv1.HomeState_HOME_STATE_OK, res.rec.Homes[0].State)

	require.NoError(t, p.close())
	p = newTestPool(t, cfg)
	defer p.close()
	rec, err = p.Stat(in.ID)
	require.NoError(t, err)
	require.Equal(t, []string{"e", "d"}, []string{rec.Homes[0].Node, rec.Homes[1].Node})
	require.Len(t, p.leftMoves, 1)
	require.True(t, p.leftMoves[0].Switched)
}

// TestHomeSwitchCommitFails: a switch whose commit fails (the store is
// closed under it) leaves the table naming the leaving home again, so
// that the move's undo frees a target no record names.
func TestHomeSwitchCommitFails(t *testing.T) {
	p := newTestPool(t, testConfig(t))
	defer p.close()
	leaving, target, in := homeSwitchCase(t, p)
	require.NoError(t, p.st.db.Close())
	_, err := p.commitHomeSwitch(in.ID, 0, leaving, target, in, 1)
	require.ErrorContains(t, err, "commit the switch-over")
	rec, err := p.Stat(in.ID)
	require.NoError(t, err)
	require.Equal(t, "b", rec.Home)
	require.Equal(t, leaving, rec.Homes[0])
}

// TestHomeSwitchAfterPromotion: the switch of a replicated segment's
// home is refused once a copy was promoted to primary since its fill
// began (the record's epoch passed the fill's): that copy, held by no
// seal, forwards the writes it acknowledges to the record's copies, the
// leaving home among them and not the target, so committing the target
// in the leaving home's place would drop writes. The record keeps the
// leaving home.
func TestHomeSwitchAfterPromotion(t *testing.T) {
	p := newTestPool(t, testConfig(t))
	defer p.close()
	leaving, target, in := homeSwitchCase(t, p)
	_, err := p.updateRecord(in.ID, func(r *record) error {
		r.Homes[1].Epoch = 2 // the backup, promoted under a new epoch
		r.Homes[0], r.Homes[1] = r.Homes[1], r.Homes[0]
		return nil
	})
	require.NoError(t, err)
	_, err = p.commitHomeSwitch(in.ID, 1, leaving, target, in, 1)
	require.ErrorIs(t, err, errs.ErrUnavailable)
	require.ErrorContains(t, err, "became its primary during the move")
	rec, err := p.Stat(in.ID)
	require.NoError(t, err)
	require.Equal(t, []string{"d", "b"}, []string{rec.Homes[0].Node, rec.Homes[1].Node})
	require.Equal(t, leaving, rec.Homes[1])
}
