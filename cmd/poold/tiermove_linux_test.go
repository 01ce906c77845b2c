package main

import (
	"bytes"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// TestTierMoveDemoteAndPromote: on real poolds (a, whose clients' rdma
// segments live on the lenders b and c), a 4 MiB segment on a's local and
// on its (emulated) cxl tier moves to the rdma tier with Client.Move:
// refused with ErrInUse, nothing changed, while another client maps it;
// after that client's Close it moves while a writer of its owner writes
// and adds all along, keeps its bytes and every acknowledged write and
// add, and its owner goes on with ReadAt, WriteAt and atomics at the new
// home (Bytes says remote), also after a move to the other lender. Then
// it moves back to its tier under the writer again: every acknowledged
// write and add is there, the segment is mapped again, and the lenders
// hold nothing any more.
func TestTierMoveDemoteAndPromote(t *testing.T) {
	mc := startMoveCluster(t, "32MiB")
	ctx := t.Context()
	for _, tier := range []alloc.Tier{alloc.TierLocal, alloc.TierCXL} {
		t.Run(tier.String(), func(t *testing.T) {
			name := "tiered-" + tier.String()
			c := mc.client(t, "tier-app-"+tier.String())
			seg, err := c.Alloc(ctx, 4<<20, alloc.WithTier(tier), alloc.WithName(name))
			require.NoError(t, err)
			want := tierBytes(4 << 20)
			_, err = seg.WriteAt(want, 0)
			require.NoError(t, err)

			holder := mc.client(t, "tier-other-"+tier.String())
			att, err := holder.Attach(ctx, name)
			require.NoError(t, err)
			_, mapped := att.Bytes()
			require.True(t, mapped, "the other client maps it")
			err = c.Move(ctx, seg, alloc.ToTier(alloc.TierRDMA))
			require.ErrorIs(t, err, alloc.ErrInUse)
			require.ErrorIs(t, err, alloc.ErrInvalid)
			require.ErrorContains(t, err, "tier-other-"+tier.String(), "the refusal names who maps it")
			require.ErrorContains(t, err, "Segment.Close", "and how it lets go")
			require.Equal(t, tier, seg.Tier(), "a refused move changes nothing")
			mem, ok := seg.Bytes()
			require.True(t, ok)
			require.Equal(t, want[:64], mem[:64])
			requireWhole(t, seg, want)

			require.NoError(t, att.Close())
			w := startTierWriter(seg, want)
			w.waitOps(t, 50)
			before := w.ops.Load()
			require.NoError(t, c.Move(ctx, seg, alloc.ToTier(alloc.TierRDMA)), "demote under a writer")
			duringDemotion := w.ops.Load() - before
			w.waitOps(t, 50)
			w.stop(t)
			require.Equal(t, alloc.TierRDMA, seg.Tier())
			require.Contains(t, []string{"b", "c"}, seg.Node(), "its home is a lender")
			_, ok = seg.Bytes()
			require.False(t, ok, "an rdma segment has no mapping")
			requireWhole(t, seg, want)
			from := seg.Node()
			require.NoError(t, c.Move(ctx, seg, alloc.ToNode(other(from))), "a demoted segment moves on within the rdma tier")
			require.Equal(t, other(from), seg.Node())
			requireWhole(t, seg, want)

			w = startTierWriter(seg, want)
			w.waitOps(t, 50)
			before = w.ops.Load()
			require.NoError(t, c.Move(ctx, seg, alloc.ToTier(tier)), "promote back under a writer")
			during := w.ops.Load() - before
			w.waitOps(t, 50)
			w.stop(t)
			require.Equal(t, tier, seg.Tier())
			require.Equal(t, "a", seg.Node())
			mem, ok = seg.Bytes()
			require.True(t, ok, "mapped again")
			require.Equal(t, want, mem, "every acknowledged write and add is there")
			requireWhole(t, seg, want)
			t.Logf("%s: %d writes and adds while the demotion ran, %d while the promotion did", tier, duringDemotion, during)
			require.Eventually(t, func() bool {
				return len(lentTo(t, mc, "b"))+len(lentTo(t, mc, "c")) == 0
			}, 20*time.Second, 50*time.Millisecond, "the rdma home let the segment go")
			require.NoError(t, seg.Free(ctx))
		})
	}
}

// TestTierMoveTargetKilled: kill -9 of the lender that receives a 48 MiB
// segment's demotion from a's (emulated) cxl tier once it holds the
// copy's allocation (the bytes are being copied, or about to be). The segment is whole on one side: either the move fails
// and the segment is still on a's cxl tier, mapped again, every byte there and taking writes and
// atomics, or the move went on to the other lender and the segment is
// whole there. Once the killed lender is back, the copy it held is freed.
func TestTierMoveTargetKilled(t *testing.T) {
	mc := startMoveCluster(t, "80MiB", "--lease-ttl", "10s")
	ctx := t.Context()
	_, seg, want, done := startDemotion(t, mc, "tier-kill")
	var to string
	require.Eventually(t, func() bool {
		for _, n := range []string{"b", "c"} {
			if len(lentTo(t, mc, n)) > 0 {
				to = n
				return true
			}
		}
		return false
	}, 20*time.Second, 2*time.Millisecond, "no lender received the copy")
	target, tn, targetArgs := mc.lender(to)
	(*target).kill9(t)
	killed := time.Now()
	err := <-done
	t.Logf("move ended %v after the kill of %s: %v", time.Since(killed), to, err)
	if err != nil {
		require.Equal(t, alloc.TierCXL, seg.Tier(), "a failed demotion leaves the segment on its tier")
		require.Equal(t, "a", seg.Node())
		mem, ok := seg.Bytes()
		require.True(t, ok, "the segment is mapped again")
		require.True(t, bytes.Equal(want, mem), "every byte is there")
	} else {
		require.Equal(t, alloc.TierRDMA, seg.Tier())
		require.Equal(t, other(to), seg.Node(), "the demotion went on to the other lender")
	}
	requireWhole(t, seg, want)

	*target = mc.start(t, tn, targetArgs...)
	require.Eventually(t, func() bool {
		ids, err := lentIDs(t, tn.sock)
		return err == nil && len(ids) == 0
	}, 30*time.Second, 50*time.Millisecond, "the restarted lender still holds the failed demotion's copy")
	require.NoError(t, seg.Free(ctx))
}

// TestTierMoveOriginKilled: kill -9 of a, the daemon that demotes a
// 48 MiB segment from its (emulated) cxl tier, once a lender holds the
// copy's allocation (the bytes are being copied, or about to be). The
// Move call fails, and since a cannot say whether it moved the segment,
// the owner's Segment is closed: a write through its mapping could go to
// memory the segment left. The restarted a holds the segment once,
// whole: on its cxl tier, as before the move (its switch was not
// committed), where a fresh Open maps it and it takes writes and atomics;
// or, had the commit come before the kill, on the rdma tier. Nothing leaks: the lender frees
// the copy no record names, and once the segment is freed a holds nothing
// of its owner's.
func TestTierMoveOriginKilled(t *testing.T) {
	mc := startMoveCluster(t, "80MiB", "--lease-ttl", "10s")
	ctx := t.Context()
	const owner = "tier-origin-kill"
	c, seg, want, done := startDemotion(t, mc, owner)
	require.Eventually(t, func() bool {
		return len(lentTo(t, mc, "b"))+len(lentTo(t, mc, "c")) > 0
	}, 20*time.Second, 2*time.Millisecond, "no lender received the copy")
	mc.a.kill9(t)
	err := <-done
	require.ErrorContains(t, err, "open it again", "the demotion whose daemon was killed")
	_, err = seg.ReadAt(make([]byte, 8), 0)
	require.ErrorIs(t, err, alloc.ErrClosed, "the owner's segment is closed, not left mapped")
	restart := time.Now()
	// The restarted a joins b (it was the first node, which joined nobody).
	mc.a = mc.start(t, mc.na, append(mc.aArgs, "--join", mc.nb.gossip)...)

	ofOwner := func() []*poolv1.Segment {
		t.Helper()
		segs, err := listed(t, mc.na.sock)
		require.NoError(t, err)
		return slices.DeleteFunc(segs, func(s *poolv1.Segment) bool { return s.Owner != owner })
	}
	held := ofOwner()
	require.Len(t, held, 1, "a holds the segment once")
	require.Equal(t, seg.ID(), held[0].Id)
	again, err := c.Open(ctx, seg.ID())
	require.NoError(t, err)
	if held[0].Tier == poolv1.Tier_TIER_CXL {
		requireWhole(t, again, want)
		mem, ok := again.Bytes()
		require.True(t, ok, "a fresh Open maps it")
		require.True(t, bytes.Equal(want, mem), "the record names the memory the fresh mapping writes")
	} else {
		require.Equal(t, poolv1.Tier_TIER_RDMA, held[0].Tier)
		t.Logf("the demotion was committed before the kill: the segment is on %s", held[0].Node)
		requireWhole(t, again, want)
	}
	require.Eventually(t, func() bool {
		ids := append(lentTo(t, mc, "b"), lentTo(t, mc, "c")...)
		return held[0].Tier == poolv1.Tier_TIER_RDMA && len(ids) == 1 || len(ids) == 0
	}, 30*time.Second, 50*time.Millisecond, "a lender still holds the killed demotion's copy")
	t.Logf("demotion resolved %v after a's restart: the segment is on the %s tier", time.Since(restart), held[0].Tier)
	require.NoError(t, again.Free(ctx))
	require.Empty(t, ofOwner(), "a holds nothing of the owner's once it freed the segment")
	require.Eventually(t, func() bool {
		return len(lentTo(t, mc, "b"))+len(lentTo(t, mc, "c")) == 0
	}, 30*time.Second, 50*time.Millisecond, "a lender still holds a copy of the freed segment")
}

// startDemotion is the start of a kill test: a client of a (id owner)
// with a 48 MiB segment on a's cxl tier holding want, and its demotion to
// the rdma tier under way. done receives the move's outcome.
func startDemotion(t *testing.T, mc *moveCluster, owner string) (c *alloc.Client, seg *alloc.Segment, want []byte, done <-chan error) {
	c = mc.client(t, owner)
	seg, err := c.Alloc(t.Context(), 48<<20, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	want = tierBytes(48 << 20)
	_, err = seg.WriteAt(want, 0)
	require.NoError(t, err)
	moved := make(chan error, 1)
	go func() { moved <- c.Move(t.Context(), seg, alloc.ToTier(alloc.TierRDMA)) }()
	return c, seg, want, moved
}

// TestTierMoveRefusals: moves between tiers that cannot be done are
// refused with a typed error and change nothing: to a tier this host
// lacks, between two load/store tiers, of a shared attachment; a segment
// freed during its demotion makes the move fail with ErrNotFound and its
// new home's copy is freed. memctl move --tier demotes and promotes a
// segment nobody holds and says from where to where; it refuses to
// promote one whose owner holds a session, naming it.
func TestTierMoveRefusals(t *testing.T) {
	mc := startMoveCluster(t, "160MiB", "--emulate-cxl", "0", "--local-size", "160MiB")
	ctx := t.Context()
	c := mc.client(t, "tier-refused")

	rseg, err := c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierRDMA), alloc.WithName("tier-shared"))
	require.NoError(t, err)
	rwant := tierBytes(1 << 20)
	_, err = rseg.WriteAt(rwant, 0)
	require.NoError(t, err)
	home := rseg.Node()
	err = c.Move(ctx, rseg, alloc.ToTier(alloc.TierCXL))
	require.ErrorIs(t, err, alloc.ErrNoCapacity, "a tier this host lacks")
	require.ErrorContains(t, err, "emulation is disabled")
	require.Equal(t, alloc.TierRDMA, rseg.Tier())
	require.Equal(t, home, rseg.Node())
	requireWhole(t, rseg, rwant)

	sharer := mc.client(t, "tier-sharer")
	shared, err := sharer.Attach(ctx, "tier-shared", alloc.Shared())
	require.NoError(t, err)
	require.ErrorIs(t, sharer.Move(ctx, shared, alloc.ToTier(alloc.TierLocal)), alloc.ErrInvalid, "a shared attachment")
	require.NoError(t, shared.Close())

	lseg, err := c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierLocal))
	require.NoError(t, err)
	require.ErrorIs(t, c.Move(ctx, lseg, alloc.ToTier(alloc.TierCXL)), alloc.ErrNotSupported, "between load/store tiers")
	require.Equal(t, alloc.TierLocal, lseg.Tier())

	t.Run("freed during the move", func(t *testing.T) {
		freer, err := alloc.Dial(ctx, mc.na.sock, alloc.WithClientID("tier-refused"))
		require.NoError(t, err)
		defer freer.Close()
		for attempt := 0; ; attempt++ {
			require.Less(t, attempt, 3, "the copy always ended before the free")
			seg, err := c.Alloc(ctx, 128<<20, alloc.WithTier(alloc.TierLocal))
			require.NoError(t, err)
			before := len(lentTo(t, mc, "b")) + len(lentTo(t, mc, "c"))
			done := make(chan error, 1)
			go func() { done <- c.Move(ctx, seg, alloc.ToTier(alloc.TierRDMA)) }()
			require.Eventually(t, func() bool {
				return len(lentTo(t, mc, "b"))+len(lentTo(t, mc, "c")) > before
			}, 20*time.Second, time.Millisecond, "the copy's home is allocated")
			require.NoError(t, freer.FreeByID(ctx, seg.ID()))
			err = <-done
			if err == nil { // the copy won the race
				require.NoError(t, seg.Free(ctx))
				continue
			}
			require.ErrorIs(t, err, alloc.ErrNotFound)
			require.ErrorContains(t, err, "freed during the move")
			require.Eventually(t, func() bool {
				return len(lentTo(t, mc, "b"))+len(lentTo(t, mc, "c")) == before
			}, 20*time.Second, 50*time.Millisecond, "the copy at the new home is freed")
			return
		}
	})

	t.Run("memctl", func(t *testing.T) {
		cli, err := alloc.Dial(ctx, mc.na.sock, alloc.WithClientID("tier-cli"))
		require.NoError(t, err)
		seg, err := cli.Alloc(ctx, 2<<20, alloc.WithTier(alloc.TierLocal), alloc.WithName("tier-cli"))
		require.NoError(t, err)
		want := tierBytes(2 << 20)
		_, err = seg.WriteAt(want, 0)
		require.NoError(t, err)
		require.NoError(t, seg.Close(), "its owner lets go of the mapping")
		out, errOut, ok := memctlText(t, mc.na.sock, "move", "tier-cli", "--tier", "rdma")
		require.True(t, ok, "%s%s", out, errOut)
		require.Regexp(t, `^moved segment tier-cli from the local tier of a to the rdma tier of [bc]: 2\.0 MiB copied in 1 rounds, operations paused .*\n$`, out)

		out, errOut, ok = memctlText(t, mc.na.sock, "move", "tier-cli", "--tier", "local")
		require.False(t, ok, "refused while its owner holds a session: %s", out)
		require.Contains(t, errOut, "in use")
		require.Contains(t, errOut, "tier-cli")
		require.NoError(t, cli.Close())
		out, errOut, ok = memctlText(t, mc.na.sock, "move", "tier-cli", "--tier", "local")
		require.True(t, ok, "%s%s", out, errOut)
		require.Regexp(t, `^moved segment tier-cli from the rdma tier of [bc] to the local tier of a: 2\.0 MiB copied in \d+ rounds, operations paused .*\n$`, out)

		again := mc.client(t, "tier-cli")
		seg, err = again.Open(ctx, seg.ID())
		require.NoError(t, err)
		mem, ok := seg.Bytes()
		require.True(t, ok)
		require.Equal(t, want, mem)
		require.NoError(t, seg.Free(ctx))
	})
}

// tierBytes is n bytes that differ from their neighbours.
func tierBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>12)
	}
	return b
}

// lentTo is what lender name holds for a's clients.
func lentTo(t *testing.T, mc *moveCluster, name string) []uint64 {
	_, n, _ := mc.lender(name)
	ids, err := lentIDs(t, n.sock)
	require.NoError(t, err)
	return ids
}

// tierWriter writes 8-byte words into a slot range and adds to a counter
// word of a segment, one call at a time, keeping want as the segment
// should be after every acknowledged call.
type tierWriter struct {
	seg  *alloc.Segment
	want []byte
	ops  atomic.Int64
	halt chan struct{}
	wg   sync.WaitGroup
	err  error
	mu   sync.Mutex // want, err
}

const (
	tierSlots   = 1 << 20 // the first slot's offset
	tierCounter = 2 << 20 // the counter word's offset
)

func startTierWriter(seg *alloc.Segment, want []byte) *tierWriter {
	w := &tierWriter{seg: seg, want: want, halt: make(chan struct{})}
	w.wg.Go(func() {
		var word [8]byte
		for i := uint64(1); ; i++ {
			select {
			case <-w.halt:
				return
			default:
			}
			off := int64(tierSlots + 8*(i%512))
			binary.LittleEndian.PutUint64(word[:], i)
			var err error
			if i%2 == 0 {
				_, err = w.seg.WriteAt(word[:], off)
			} else {
				var n uint64
				n, err = w.seg.Add64(tierCounter, 1)
				binary.LittleEndian.PutUint64(word[:], n)
				off = tierCounter
			}
			w.mu.Lock()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				return
			}
			copy(w.want[off:], word[:])
			w.mu.Unlock()
			w.ops.Add(1)
		}
	})
	return w
}

// waitOps waits until the writer acknowledged n more calls.
func (w *tierWriter) waitOps(t *testing.T, n int64) {
	t.Helper()
	from := w.ops.Load()
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.err != nil || w.ops.Load() >= from+n
	}, 20*time.Second, time.Millisecond)
}

// stop ends the writer and fails the test if a call failed.
func (w *tierWriter) stop(t *testing.T) {
	t.Helper()
	close(w.halt)
	w.wg.Wait()
	require.NoError(t, w.err, "every write and add succeeded across the move")
}
