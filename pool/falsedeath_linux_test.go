package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
)

// TestFalseDeathAtCrash: while one host crashes, an owner's failure
// detector declares a live home dead on its own (here its gossip with the
// home is cut, so its suspicion never reaches the home to be refuted; in
// the 200-host simulation an owner missed the home's refutation). The
// owner marks the segments there lost until the home is back, as it
// does for any death, so the scale simulation's check that nothing but
// the crashed host's segments is lost must tell them apart by the
// owner's view, not fail on them: they are lost as designed and restored
// when the home returns. A segment lost while its owner lists its home
// alive all along (its home no longer holds it, and the owner's
// reconciliation found that out) is still reported.
func TestFalseDeathAtCrash(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: 10 * time.Second, timing: fastDetection})
	// The owner is the host that lists the other two as seeds: it asks
	// them to join again while it lists them dead (rejoinSeeds), which
	// brings the home back in its view within seconds once gossip heals.
	victim, home, owner := sc.hosts[0], sc.hosts[1], sc.hosts[2]
	owner.cfg.ExportSize = 0 // its segments go to the two others
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	o := owner.daemon().pool
	on := map[string][]uint64{}
	for i := 0; len(on[home.name]) == 0 || len(on[victim.name]) == 0; i++ {
		require.Less(t, i, 60, "segments placed on %v only", on)
		// 1 MiB moves a host's free fraction by more than the 1/64 it
		// announces at, so placement alternates between the two.
		seg, err := o.Alloc(t.Context(), caller{}, allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_RDMA, Persist: true})
		require.NoError(t, err)
		require.False(t, seg.redundant())
		on[seg.Home] = append(on[seg.Home], seg.ID)
		time.Sleep(200 * time.Millisecond)
	}

	crashed := time.Now()
	sc.net.Cut(owner.name, home.name)
	sc.crash(victim)
	require.Eventually(t, func() bool {
		m, ok := o.cl.Member(home.name)
		return allLost(owner, on[victim.name]) && allLost(owner, on[home.name]) && ok && m.State != cluster.StateAlive
	}, 30*time.Second, 20*time.Millisecond, "the owner declares both the crashed host and the live home dead, and marks their segments lost")
	judged, unexplained := sc.lostElsewhere(victim.name, crashed)
	require.Empty(t, unexplained, "segments lost that were not on the crashed host, whose owners did not declare their homes dead since the crash")
	require.Len(t, judged, len(on[home.name]))
	for _, l := range judged {
		require.Contains(t, l.String(), "lists it dead", "the evidence names the owner's view")
		require.Contains(t, l.String(), "at home: held intact")
	}

	// The home returns in the owner's view, and the segments are restored.
	sc.net.Heal()
	require.Empty(t, sc.awaitRestored(judged, time.Minute), "segments whose home returned are restored")
	judged, unexplained = sc.lostElsewhere(victim.name, crashed)
	require.Empty(t, judged)
	require.Empty(t, unexplained)

	// A segment that its home no longer holds, found out by the owner's
	// reconciliation while it lists the home alive since before the
	// window checked, is reported.
	lost := on[home.name][0]
	r, err := o.Stat(lost)
	require.NoError(t, err)
	require.NoError(t, home.daemon().pool.Free(caller{}, r.HomeID, ""))
	since := time.Now()
	o.homeChanged(home.name, true)
	judged, unexplained = sc.lostElsewhere(victim.name, since)
	require.Empty(t, judged)
	require.Len(t, unexplained, 1)
	require.Contains(t, unexplained[0].String(), "lists it alive")
	require.Contains(t, unexplained[0].String(), "at home: gone")
}
