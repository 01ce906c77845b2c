package pool

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// rdmaNotes returns the notes of d's loopback rdma tier and of its peers'
// rdma tier ("" when absent), and the peers' free bytes, as Tiers answers.
func rdmaNotes(t *testing.T, d *Daemon) (loopback, peers string, peersFree int64) {
	resp, err := (&service{d: d}).Tiers(t.Context(), &poolv1.TiersRequest{})
	require.NoError(t, err)
	for _, ti := range resp.Tiers {
		switch {
		case ti.Tier == poolv1.Tier_TIER_RDMA && ti.Kind == "loopback":
			loopback = ti.Note
		case ti.Tier == poolv1.Tier_TIER_RDMA:
			peers, peersFree = ti.Note, ti.Free
		}
	}
	return loopback, peers, peersFree
}

// The loopback tier's note says whether peers exist at the moment it is
// shown, and the peers' tier says which peer's memory a drain leaves out of
// its free bytes.
func TestTierNotesFollowMembership(t *testing.T) {
	a, err := Start(clusterNodeConfig(t, "a"), nil)
	require.NoError(t, err)
	defer a.Close()
	loopback, peers, _ := rdmaNotes(t, a)
	require.Contains(t, loopback, "no peer offers rdma memory now")
	require.Empty(t, peers)

	b := startNode(t, clusterNodeConfig(t, "b"), a)
	require.Eventually(t, func() bool {
		loopback, _, _ = rdmaNotes(t, a)
		return strings.Contains(loopback, "go to a peer first (1 alive with rdma memory: b)")
	}, 20*time.Second, 20*time.Millisecond, "a's loopback note never named its peer: %q", loopback)
	require.NotContains(t, loopback, "no peer")

	// b drains itself, as the Drain call does for an administrator.
	_, changed, err := b.pool.drain(true, false)
	require.NoError(t, err)
	require.True(t, changed)
	var free int64
	require.Eventually(t, func() bool {
		_, peers, free = rdmaNotes(t, a)
		return strings.Contains(peers, "draining or leaving, so their free bytes are left out of FREE: b")
	}, 20*time.Second, 20*time.Millisecond, "a's peer tier never said b drains: %q", peers)
	require.Zero(t, free)

	require.NoError(t, b.Close())
	require.Eventually(t, func() bool {
		loopback, _, _ = rdmaNotes(t, a)
		return strings.Contains(loopback, "no peer offers rdma memory now")
	}, 20*time.Second, 20*time.Millisecond, "a's loopback note still names a peer after b left: %q", loopback)
}
