package pool

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/rdma"
)

// TestMoveRollsForward: on 4 simulated hosts, the origin of a move is
// stopped dead right after it announced the switch-over (Stat names the
// target) and before it committed it (the announced hook), and crashes.
// Its store still names the source, and its intent is not switched. A
// client told the new home writes there meanwhile, acknowledged. The
// restarted origin asks the source, which is sealed and pushed its last
// chunks to the target, rolls the move forward: its record names the
// target, the source lets the segment go, the intent goes, and the
// client's write at the new home is there, with the bytes written before
// the move.
func TestMoveRollsForward(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 4, leaseTTL: 10 * time.Second})
	for _, h := range sc.hosts {
		h.cfg.GossipProfile = cluster.ProfileLocal // failure detection in about a second
	}
	// The origin is no seed: a restarted seed would join only itself.
	oh := sc.hosts[3]
	announced := make(chan uint64, 1)
	oh.cfg.sim.announced = func(seg uint64) bool {
		announced <- seg
		return true
	}
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	ctx := t.Context()

	const size = 1 << 20
	conn, call := appSession(t, oh)
	seg, err := conn.API().Alloc(call(), &poolv1.AllocRequest{Size: size, Tier: poolv1.Tier_TIER_RDMA, Name: "rolled"})
	require.NoError(t, err)
	before := bytes.Repeat([]byte{0xa5}, size)
	write := func(s *poolv1.Segment, off int64, b []byte) {
		c, err := dialHome(ctx, s.Node, s.DataAddr, false, nil, s.DataCredential)
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, c.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: segRegion(s), Offset: off, Buf: b}), "write at %s", s.Node)
	}
	write(seg, 0, before)

	moved := make(chan error, 1)
	go func() {
		_, err := conn.API().Move(call(), &poolv1.MoveRequest{Id: seg.Id})
		moved <- err
	}()
	select {
	case id := <-announced:
		require.Equal(t, seg.Id, id)
	case <-time.After(30 * time.Second):
		t.Fatal("the move did not reach its switch-over")
	}
	require.Error(t, <-moved, "the move whose origin stopped at the announcement")
	now, err := conn.API().Stat(call(), &poolv1.StatRequest{Id: seg.Id})
	require.NoError(t, err)
	require.NotEqual(t, seg.Node, now.Node, "Stat names the target once announced")
	after := bytes.Repeat([]byte{0x5a}, 4096)
	write(now, 8192, after)
	conn.Close()

	sc.crash(oh)
	st, err := openStore(oh.cfg.DataDir, false)
	require.NoError(t, err)
	recs, _, _, err := st.load()
	require.NoError(t, err)
	ins, err := st.intents()
	require.NoError(t, err)
	require.NoError(t, st.close())
	for _, r := range recs {
		if r.ID == seg.Id {
			require.Equal(t, seg.Node, r.Home, "the store names the source at the crash")
		}
	}
	require.Len(t, ins, 1)
	require.False(t, ins[0].Switched, "the intent is not switched at the crash")

	oh.cfg.sim.announced = nil
	sc.net.Heal() // a process crash: the host and its memory stayed
	require.NoError(t, sc.start(oh))
	origin := oh.daemon()
	require.Eventually(t, func() bool {
		ins, err := origin.pool.st.intents()
		return err == nil && len(ins) == 0
	}, 30*time.Second, 50*time.Millisecond, "the move is finished after the restart")
	r, err := origin.pool.Stat(seg.Id)
	require.NoError(t, err)
	require.Equal(t, now.Node, r.Home, "rolled forward: the record names the target")
	require.Equal(t, now.HomeId, r.HomeID)
	src := sc.host(seg.Node).daemon()
	_, err = src.pool.Stat(seg.HomeId)
	require.Error(t, err, "the source let the segment go")

	want := bytes.Clone(before)
	copy(want[8192:], after)
	got := homeBytes(ctx, t, origin, homeRef{Node: r.Home, HomeID: r.HomeID, DataAddr: r.DataAddr, Key: r.Key, Epoch: r.Epoch}, size)
	require.True(t, bytes.Equal(want, got), "the bytes at the new home: those written before the move and the client's write there")
}
