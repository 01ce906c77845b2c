package pool

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/errs"
)

// TestMoveHandover: on 4 simulated hosts, the origin of a move is held
// after the source answered its SEAL and before it announces the
// switch-over (the sealAnswered hook). The segment's client, told of the
// copy before the seal, writes meanwhile: the old home answers MOVED with
// the copy's token and the write lands at the new home at once, while the
// origin still holds (MoveHandovers counts it). The hook then fails the
// move there, as a SEAL whose answer was lost would: the origin asks the
// source, finds its last chunks pushed to the target, and rolls the move
// forward rather than undoing it, so the record names the new home and
// the write made there is kept, with the bytes from before the move.
func TestMoveHandover(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 4, leaseTTL: 10 * time.Second})
	oh := sc.hosts[3]
	held := make(chan uint64, 1)
	release := make(chan struct{})
	oh.cfg.sim.sealAnswered = func(seg uint64) error {
		held <- seg
		<-release
		return fmt.Errorf("the test failed the move after its SEAL answered: %w", errs.ErrUnavailable)
	}
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	ctx := t.Context()

	const size = 1 << 20
	c, err := alloc.Dial(ctx, oh.cfg.Socket, alloc.WithClientID("app"))
	require.NoError(t, err)
	defer c.Close()
	seg, err := c.Alloc(ctx, size, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	before := bytes.Repeat([]byte{0xa5}, size)
	_, err = seg.WriteAt(before, 0)
	require.NoError(t, err)
	from := seg.Node()

	moved := make(chan error, 1)
	go func() { moved <- c.Move(ctx, seg) }()
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	select {
	case id := <-held:
		require.Equal(t, seg.ID(), id)
	case <-time.After(30 * time.Second):
		t.Fatal("the move did not reach its switch-over")
	}
	require.Eventually(t, func() bool { return c.Stats().MovePreconnects == 1 }, 10*time.Second, 10*time.Millisecond,
		"the client was told of the move before the seal")
	after := bytes.Repeat([]byte{0x5a}, 4096)
	wrote := make(chan error, 1)
	go func() {
		_, err := seg.WriteAt(after, 8192)
		wrote <- err
	}()
	select {
	case err := <-wrote:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the write waited for the origin to announce the switch-over, which it holds")
	}
	require.NotEqual(t, from, seg.Node(), "the write went to the new home")
	require.EqualValues(t, 1, c.Stats().MoveHandovers)

	close(release)
	released = true
	require.Error(t, <-moved, "the move the test failed after its SEAL answered")
	origin := oh.daemon()
	require.Eventually(t, func() bool {
		ins, err := origin.pool.st.intents()
		return err == nil && len(ins) == 0
	}, 30*time.Second, 50*time.Millisecond, "the move is resolved")
	r, err := origin.pool.Stat(seg.ID())
	require.NoError(t, err)
	require.Equal(t, seg.Node(), r.Home, "rolled forward: the record names the new home")
	want := bytes.Clone(before)
	copy(want[8192:], after)
	got := make([]byte, size)
	_, err = seg.ReadAt(got, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "the bytes from before the move and the write made at the new home")
}
