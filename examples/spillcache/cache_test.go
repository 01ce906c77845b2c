package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/size"
)

// newTestCache starts a pool, with room for o's cxl budget, and builds a
// cache on it.
func newTestCache(t testing.TB, o Options) *Cache {
	t.Helper()
	cfg := pooltest.Config(t)
	cfg.EmulateCXL = max(cfg.EmulateCXL, size.Size(2*o.CXLBytes))
	pooltest.Start(t, cfg)
	cl, err := alloc.Dial(t.Context(), cfg.Socket)
	require.NoError(t, err)
	t.Cleanup(func() { cl.Close() })
	c, err := NewCache(t.Context(), cl, o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

// settle waits until the far writer has indexed every queued record, so
// that the Gets after it read rdma records rather than queued buffers.
func settle(t *testing.T, c *Cache) {
	t.Helper()
	require.Eventually(t, func() bool {
		for i := range c.shards {
			sh := &c.shards[i]
			sh.mu.Lock()
			n := len(sh.pending)
			sh.mu.Unlock()
			if n > 0 {
				return false
			}
		}
		return true
	}, time.Minute, time.Millisecond)
}

// A far hit moves up only when it is used more often than the hot tier's
// victim: a key read once from far memory stays there, and the hot set is
// untouched; a key read often enough is promoted.
func TestAdmission(t *testing.T) {
	val := bytes.Repeat([]byte{7}, 100)
	// One shard, a heap for four entries, cxl only.
	c := newTestCache(t, Options{HotBytes: 4 * (2 + 100), CXLBytes: 64 << 10, Shards: 1, RecordBytes: 102})
	c.Set("cc", val)
	for i := range 4 {
		c.Set(fmt.Sprint("h", i), val) // cc, the oldest, leaves the heap
	}
	for range 5 {
		for i := range 4 {
			_, l := c.GetLevel(nil, fmt.Sprint("h", i))
			require.Equal(t, LevelHot, l)
		}
	}
	v, l := c.GetLevel(nil, "cc")
	require.Equal(t, LevelCXL, l)
	require.Equal(t, val, v)
	st := c.Stats()
	require.Equal(t, int64(0), st.Promoted, "a key used twice does not displace keys used six times")
	require.Equal(t, int64(1), st.Rejected)
	require.Equal(t, [numLevels]int64{4, 1, 0}, st.Entries)

	gets := 1
	for ; gets < 20; gets++ {
		if _, l := c.GetLevel(nil, "cc"); l == LevelHot {
			break
		}
	}
	require.Less(t, gets, 20, "a key used more often than the hot victim is promoted")
	require.Greater(t, gets, 5, "promoted only once used more often than the victim (6 uses)")
	st = c.Stats()
	require.Equal(t, int64(1), st.Promoted)
	require.Equal(t, int64(4), st.Entries[LevelHot])
}

// A Set of a cold key (one with a far record, used no more often than the
// hot tier's victim) keeps it off the heap, so the hot set stays: on the
// cxl tier its record is overwritten where it is, an rdma key is written
// to a far tier again. (A new key goes to the heap: TestFarCopyFollowsItsRecord.)
func TestSetKeepsColdKeysFar(t *testing.T) {
	v1, v2 := bytes.Repeat([]byte{1}, 100), bytes.Repeat([]byte{2}, 100)
	slot := int64(alloc.SizeClass(recordHeader + 2 + len(v1)))
	// One shard, a heap for two entries, cxl for two records.
	c := newTestCache(t, Options{HotBytes: 2 * (2 + 100), CXLBytes: 2 * slot, RDMABytes: 64 << 10, Shards: 1, RecordBytes: 102})
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
	for _, k := range keys {
		c.Set(k, v1) // each pushes older ones down a tier
	}
	settle(t, c)
	require.Equal(t, [numLevels]int64{2, 2, 2}, c.Stats().Entries)
	at := map[Level][]string{}
	for _, k := range keys {
		at[levelOf(c, k)] = append(at[levelOf(c, k)], k)
	}
	hot, cxl, rdma := at[LevelHot], at[LevelCXL][0], at[LevelRDMA][0]
	for range 5 {
		for _, k := range hot {
			_, l := c.GetLevel(nil, k)
			require.Equal(t, LevelHot, l)
		}
	}

	demoted := c.Stats().Demoted
	c.Set(cxl, v2)
	st := c.Stats()
	require.Equal(t, [numLevels]int64{2, 2, 2}, st.Entries)
	require.Equal(t, demoted, st.Demoted, "the cxl record is overwritten where it is")
	v, l := c.GetLevel(nil, cxl)
	require.Equal(t, LevelCXL, l)
	require.Equal(t, v2, v)

	c.Set(rdma, v2)
	settle(t, c)
	v, l = c.GetLevel(nil, rdma)
	require.Contains(t, []Level{LevelCXL, LevelRDMA}, l, "a cold rdma key stays in a far tier")
	require.Equal(t, v2, v)
	for _, k := range hot {
		v, l := c.GetLevel(nil, k)
		require.Equal(t, LevelHot, l, "the hot set stays")
		require.Equal(t, v1, v)
	}
}

// levelOf says where key is, without counting a use or moving it.
func levelOf(c *Cache, key string) Level {
	h, sh, si := c.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.hot.get(sh.entries, h, key); ok {
		return LevelHot
	}
	for _, t := range c.tiers {
		if t.table.find(t.table.region(si), h, func(r alloc.Ref) bool {
			k, _, _, err := c.mappedRecord(t, r, false)
			return !t.loadStore || err == nil && string(k) == key
		}) >= 0 {
			return t.level
		}
	}
	return LevelMiss
}

// A probe reads an rdma record only where the far index has the key's
// hash bits: Gets of absent keys read nothing remote, and a Get served
// from the rdma tier reads exactly one record.
func TestFingerprintProbe(t *testing.T) {
	c := newTestCache(t, Options{HotBytes: 4 << 10, RDMABytes: 1 << 20, Shards: 4, RecordBytes: 110})
	val := bytes.Repeat([]byte{1}, 100)
	for i := range 500 {
		c.Set(fmt.Sprint("key", i), val)
	}
	settle(t, c)
	st := c.Stats()
	require.Greater(t, st.Entries[LevelRDMA], int64(400))
	for i := range 2000 {
		_, l := c.GetLevel(nil, fmt.Sprint("absent", i))
		require.Equal(t, LevelMiss, l)
	}
	require.Zero(t, c.Stats().FarReads, "a miss reads no far record")
	rdma := int64(0)
	for i := range 500 {
		v, l := c.GetLevel(nil, fmt.Sprint("key", i))
		require.Equal(t, val, v)
		if l == LevelRDMA {
			rdma++
		}
	}
	require.Positive(t, rdma)
	require.Equal(t, rdma, c.Stats().FarReads, "one record read per rdma hit")
}

// No lock is held across far I/O: while one Get's rdma read is blocked,
// a Get of a hot key and a Delete on the same (only) shard complete; the
// blocked Get, once released, does not bring back the deleted key.
func TestFarReadHoldsNoLock(t *testing.T) {
	val := bytes.Repeat([]byte{3}, 100)
	c := newTestCache(t, Options{HotBytes: 2 * (1 + 100), RDMABytes: 64 << 10, Shards: 1, RecordBytes: 101})
	c.Set("a", val)
	c.Set("b", val)
	c.Set("c", val) // a leaves the heap for rdma
	settle(t, c)
	reading, release := make(chan struct{}), make(chan struct{})
	c.farReadHook = func(key string) {
		if key == "a" {
			close(reading)
			<-release
		}
	}
	type got struct {
		v []byte
		l Level
	}
	blocked := make(chan got, 1)
	go func() {
		v, l := c.GetLevel(nil, "a")
		blocked <- got{v, l}
	}()
	<-reading
	done := make(chan Level, 1)
	go func() {
		_, l := c.GetLevel(nil, "b")
		c.Delete("a")
		done <- l
	}()
	select {
	case l := <-done:
		require.Equal(t, LevelHot, l)
	case <-time.After(time.Minute):
		close(release)
		t.Fatal("a Get of a hot key and a Delete on the shard wait for another Get's far read")
	}
	close(release)
	g := <-blocked
	if g.l != LevelMiss { // it overlapped the Delete: the old value is a valid answer
		require.Equal(t, LevelRDMA, g.l)
		require.Equal(t, val, g.v)
	}
	_, l := c.GetLevel(nil, "a")
	require.Equal(t, LevelMiss, l, "the Get that read before the Delete did not promote the deleted key")
}

// Many goroutines Set, Get, GetMany and Delete over small tiers, so
// entries move between all of them while far reads and writes are in
// flight unlocked. A key's owner sees its own latest Set or Delete; no
// Get returns another key's value or an older value of its own after a
// newer Set finished.
func TestConcurrentNoStaleValue(t *testing.T) {
	c := newTestCache(t, Options{HotBytes: 8 << 10, CXLBytes: 16 << 10, RDMABytes: 128 << 10, Shards: 2, RecordBytes: 120})
	const owners, perOwner, rounds = 4, 30, 2000
	encode := func(k, ver int) []byte {
		b := make([]byte, 100)
		binary.LittleEndian.PutUint32(b, uint32(k))
		binary.LittleEndian.PutUint32(b[4:], uint32(ver))
		return b
	}
	key := func(k int) string { return fmt.Sprint("k", k) }
	check := func(k int, v []byte) int {
		require.Len(t, v, 100)
		require.Equal(t, uint32(k), binary.LittleEndian.Uint32(v), "key %d got another key's value", k)
		return int(binary.LittleEndian.Uint32(v[4:]))
	}
	var owned, readers sync.WaitGroup
	stop := make(chan struct{})
	for o := range owners {
		owned.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(o), 1))
			ver := make([]int, perOwner)
			for r := range rounds {
				i := rng.IntN(perOwner)
				k := o*perOwner + i
				if r%10 == 9 {
					c.Delete(key(k))
					ver[i] = -1
				} else {
					ver[i] = r
					c.Set(key(k), encode(k, r))
				}
				j := rng.IntN(perOwner)
				v, ok := c.Get(nil, key(o*perOwner+j))
				if ver[j] < 0 {
					require.False(t, ok, "key %d was deleted by its owner", o*perOwner+j)
				} else if ok {
					require.Equal(t, ver[j], check(o*perOwner+j, v), "key %d: its owner's last Set", o*perOwner+j)
				}
			}
		})
	}
	for g := range 2 {
		readers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			for {
				select {
				case <-stop:
					return
				default:
				}
				reqs := make([]GetReq, 8)
				for i := range reqs {
					reqs[i].Key = key(rng.IntN(owners * perOwner))
				}
				c.GetMany(reqs)
				for i, r := range reqs {
					if r.Level != LevelMiss {
						var k int
						fmt.Sscanf(reqs[i].Key, "k%d", &k)
						check(k, r.Val)
					}
				}
			}
		})
	}
	owned.Wait()
	close(stop)
	readers.Wait()
	st := c.Stats()
	require.Positive(t, st.Hits[LevelRDMA]+st.Hits[LevelCXL], "entries were served from far tiers")
}

// GetMany answers as Get does, for hot, cxl, rdma and absent keys, in
// batches longer than the arena's MaxBatch too.
func TestGetMany(t *testing.T) {
	c := newTestCache(t, Options{HotBytes: 16 << 10, CXLBytes: 64 << 10, RDMABytes: 1 << 20, Shards: 4, RecordBytes: 60})
	const n = alloc.MaxBatch + 300
	for i := range n {
		c.Set(fmt.Sprint("key", i), []byte(fmt.Sprintf("value %d %040d", i, i)))
	}
	settle(t, c)
	reqs := make([]GetReq, n+10)
	for i := range reqs {
		reqs[i].Key = fmt.Sprint("key", i) // the last ten are absent
		reqs[i].Val = []byte("prefix:")
	}
	c.GetMany(reqs)
	levels := map[Level]int{}
	for i, r := range reqs {
		levels[r.Level]++
		if i >= n {
			require.Equal(t, LevelMiss, r.Level)
			require.Equal(t, []byte("prefix:"), r.Val)
			continue
		}
		require.NotEqual(t, LevelMiss, r.Level, "key%d", i)
		require.Equal(t, fmt.Sprintf("prefix:value %d %040d", i, i), string(r.Val))
	}
	require.Positive(t, levels[LevelRDMA])
	require.Positive(t, levels[LevelCXL])
	require.Positive(t, levels[LevelHot])
}

// The sketch never counts a key below its uses (up to 15), and aging
// halves the counts.
func TestSketch(t *testing.T) {
	s := newSketch(1000)
	rng := rand.New(rand.NewPCG(1, 2))
	uses := map[uint64]int{}
	for range 3000 {
		h := rng.Uint64N(1500) * 0x9e3779b97f4a7c15
		s.add(h)
		uses[h]++
	}
	for h, n := range uses {
		require.GreaterOrEqual(t, s.estimate(h), uint64(min(n, 15)))
	}
	hot := uint64(42)
	for range 20 {
		s.add(hot)
	}
	require.Equal(t, uint64(15), s.estimate(hot))
	for range s.sample {
		s.add(rng.Uint64())
	}
	require.Less(t, s.estimate(hot), uint64(15), "aging halved it")
}

// TestPendingWritesKeepIndexBounded: Sets that push records to a small
// rdma tier faster than the far writer writes them fill the tier's budget
// with records on their way; the entries past it move on (here: dropped,
// past the last tier) rather than growing the tier's index beyond its
// buckets, whose insert would then never find an empty one and spin with
// the shard's lock held.
func TestPendingWritesKeepIndexBounded(t *testing.T) {
	val := bytes.Repeat([]byte{1}, 100)
	slot := int64(alloc.SizeClass(recordHeader + 4 + len(val)))
	c := newTestCache(t, Options{HotBytes: 1, RDMABytes: 2 * slot, Shards: 1, RecordBytes: 104})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2000 {
			c.Set(fmt.Sprintf("k%03d", i%1000), val)
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute): // they take milliseconds
		panic("the Sets did not finish: the far writer holds the shard's lock")
	}
	settle(t, c)
	sh, t0 := &c.shards[0], c.tiers[0]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	require.LessOrEqual(t, sh.far[0].count, t0.capCount)
	require.LessOrEqual(t, sh.far[0].bytes, t0.capBytes)
}

// TestInlineWritesBatched: when the far writer lags (its queue is full),
// the goroutine that demoted records writes them itself, in batches the
// arena takes: one operation that demotes more than alloc.MaxBatch
// records loses none.
func TestInlineWritesBatched(t *testing.T) {
	c := newTestCache(t, Options{HotBytes: 1 << 20, RDMABytes: 8 << 20, Shards: 2, RecordBytes: 120})
	val := bytes.Repeat([]byte{5}, 100)
	keysOf := func(si, n int) []string {
		var ks []string
		for i := 0; len(ks) < n; i++ {
			if k := fmt.Sprintf("s%d-%06d", si, i); func() bool { _, _, s := c.locate(k); return s == si }() {
				ks = append(ks, k)
			}
		}
		return ks
	}
	demote := func(si int, keys []string) *shard {
		sh := &c.shards[si]
		sh.mu.Lock()
		for _, k := range keys {
			h, _, _ := c.locate(k)
			c.demote(sh, si, 0, k, val, h)
		}
		return sh
	}
	// The writer lags: shard 1's records fill its queue, unwoken.
	sh1 := demote(1, keysOf(1, maxQueued))
	c.wmu.Lock()
	for _, w := range sh1.pending {
		w.taken = true
		c.queue = append(c.queue, queued{1, w})
	}
	c.wmu.Unlock()
	sh1.untaken = 0
	sh1.mu.Unlock()

	// One operation of shard 0 demotes 1100 records, which its unlock
	// writes inline.
	keys := keysOf(0, alloc.MaxBatch+76)
	c.unlock(demote(0, keys), 0)
	c.wake <- struct{}{}
	settle(t, c)
	for _, k := range keys {
		_, ok := c.Get(nil, k)
		require.True(t, ok, k)
	}
	require.Zero(t, c.Stats().Lost)
}

// TestHotVictimOfEmptyShard: a shard's first entry, larger than the
// shard's hot budget and used before (a cache-aside miss, then its Set),
// finds no hot victim to compare with, rather than a panic with the
// shard's lock held.
func TestHotVictimOfEmptyShard(t *testing.T) {
	c := newTestCache(t, Options{HotBytes: 100, CXLBytes: 64 << 10, Shards: 1, RecordBytes: 200})
	c.Get(nil, "x")
	c.Get(nil, "x")
	val := bytes.Repeat([]byte{1}, 200)
	c.Set("x", val)
	v, ok := c.Get(nil, "x")
	require.True(t, ok)
	require.Equal(t, val, v)
}

// TestHotBudgetCountsHeldBytes: a key set to a large value (a slice of its
// own) and then to a small one does not keep the large slice, which the
// hot budget, counting the value's length, would not see.
func TestHotBudgetCountsHeldBytes(t *testing.T) {
	const hot = 64 << 10
	c := newTestCache(t, Options{HotBytes: hot, CXLBytes: 1 << 20, Shards: 1, RecordBytes: 64})
	big, small := make([]byte, 32<<10), make([]byte, 8)
	for i := range 500 {
		k := fmt.Sprint("k", i)
		c.Set(k, big)
		c.Set(k, small)
	}
	sh := &c.shards[0]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	held := 0
	for i := range sh.entries {
		if e := &sh.entries[i]; e.used && e.slot < 0 {
			held += cap(e.val)
		}
	}
	require.LessOrEqual(t, held, 2*hot, "own slices of hot values, against a budget of %d", hot)
}
