package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/size"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSmoke runs the example small, against an in-test pool, with every
// comparison cache, and checks the JSON lines and that spillcache served
// every key from its three tiers.
func TestSmoke(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.EmulateCXL = 256 * size.MiB
	cfg.ExportSize = 256 * size.MiB
	pooltest.Start(t, cfg)
	var out, status bytes.Buffer
	err := run(t.Context(), &out, &status, config{
		socket: cfg.Socket, keys: 6000, value: 512, skew: 0.99, reads: 0.9, duration: 300 * time.Millisecond, warmup: 100 * time.Millisecond,
		threads: 2, hot: 1 << 20, cxl: 2 << 20, rdma: 4 << 20, compare: []string{"otter", "ristretto", "fastcache"},
		verify: 0, json: true,
	})
	require.NoError(t, err, status.String())
	var names []string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var r result
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		names = append(names, r.Name)
		require.Greater(t, r.GetsPerSec, 0.0, r.Name)
		require.Zero(t, r.Wrong, "%s returned a wrong value", r.Name)
		var raw map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &raw))
		for _, k := range []string{"name", "entries", "heap_inuse_bytes", "gc_cpu_fraction", "gets_per_sec", "get_p50_ns", "get_p99_ns", "warmup_ops", "warmup_gets_per_sec"} {
			require.Contains(t, raw, k)
		}
		if r.Name == "spillcache" {
			require.Equal(t, 1.0, r.Served, "spillcache serves every key")
			require.Equal(t, int64(6000), r.Entries)
			require.Positive(t, r.Spill.Entries[LevelRDMA], "the small budgets push entries to rdma")
			require.NotNil(t, r.ReadAt, "the rdma tier's own ReadAt is timed beside the Gets")
			require.Positive(t, r.ReadAt.Hits)
			var names []string
			for _, tg := range r.Targets {
				names = append(names, tg.Group+": "+tg.Name)
			}
			require.Equal(t, []string{"otter: Go heap in use", "otter: GC CPU seconds", "otter: Gets/s",
				"ristretto: Go heap in use", "ristretto: GC CPU seconds", "ristretto: Gets/s",
				"tiers: cxl Get p50 / hot Get p50", "tiers: rdma Get p50 / rdma ReadAt p50"}, names, "-json carries the targets")
		}
	}
	require.Equal(t, []string{"spillcache", "otter", "ristretto", "fastcache"}, names)
}

// TestCacheSemantics checks Get, Set and Delete across the tiers.
func TestCacheSemantics(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	cl, err := alloc.Dial(t.Context(), cfg.Socket)
	require.NoError(t, err)
	defer cl.Close()
	c, err := NewCache(t.Context(), cl, Options{HotBytes: 64 << 10, CXLBytes: 256 << 10, RDMABytes: 1 << 20, Shards: 4, RecordBytes: 300})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close(context.Background())) }()
	val := func(i, gen int) []byte { return []byte(fmt.Sprintf("value %d gen %d %0200d", i, gen, i)) }
	const n = 2000
	for i := range n {
		c.Set(fmt.Sprint("key", i), val(i, 0))
	}
	st := c.Stats()
	require.Positive(t, st.Entries[LevelCXL])
	require.Positive(t, st.Entries[LevelRDMA])
	levels := map[Level]int{}
	for i := range n {
		v, l := c.GetLevel(nil, fmt.Sprint("key", i))
		levels[l]++
		if l != LevelMiss {
			require.Equal(t, val(i, 0), v)
		}
	}
	require.Positive(t, levels[LevelCXL]+levels[LevelRDMA], "lower tiers served some keys")
	for i := 0; i < n; i += 3 {
		c.Set(fmt.Sprint("key", i), val(i, 1))
	}
	for i := 1; i < n; i += 3 {
		c.Delete(fmt.Sprint("key", i))
	}
	for i := range n {
		v, ok := c.Get(nil, fmt.Sprint("key", i))
		switch i % 3 {
		case 0:
			if ok {
				require.Equal(t, val(i, 1), v, "a Set replaces the value in every tier")
			}
		case 1:
			require.False(t, ok, "deleted key %d", i)
		}
	}
	_, ok := c.Get(nil, "never set")
	require.False(t, ok)
}

// TestFarCopyFollowsItsRecord moves a hot entry's far copy down a tier and
// checks it stays the entry's one copy: counted once, dropped by a Set, gone
// after a Delete. One shard, a heap for one entry, cxl for one record.
func TestFarCopyFollowsItsRecord(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	cl, err := alloc.Dial(t.Context(), cfg.Socket)
	require.NoError(t, err)
	defer cl.Close()
	v1, v2 := bytes.Repeat([]byte{1}, 100), bytes.Repeat([]byte{2}, 100)
	slot := int64(alloc.SizeClass(recordHeader + 1 + len(v1)))
	c, err := NewCache(t.Context(), cl, Options{HotBytes: 150, CXLBytes: slot, RDMABytes: 4 * slot, Shards: 1, RecordBytes: 1 + len(v1)})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close(context.Background())) }()

	c.Set("a", v1)
	c.Set("b", v1) // a leaves the heap for cxl
	// The second Get finds a used more often than b by the admission
	// margin and promotes it.
	for range 1 + admitMargin {
		v, l := c.GetLevel(nil, "a")
		require.Equal(t, LevelCXL, l)
		require.Equal(t, v1, v)
	}
	// Promoting a pushed b to cxl, which moved a's record, its hot copy, to rdma.
	st := c.Stats()
	require.Equal(t, [numLevels]int64{1, 1, 1}, st.Entries)
	require.Equal(t, int64(1), st.Copies, "the moved record is still a's copy")

	c.Set("a", v2)
	st = c.Stats()
	require.Equal(t, [numLevels]int64{1, 1, 0}, st.Entries, "a Set frees the moved copy")
	require.Zero(t, st.Copies)

	c.Delete("a")
	_, ok := c.Get(nil, "a")
	require.False(t, ok, "a deleted key leaves no record behind")
	v, l := c.GetLevel(nil, "b")
	require.Equal(t, LevelCXL, l)
	require.Equal(t, v1, v)
}

// A target missed under other settings than the measured configuration
// says so on its line, naming the settings; under the measured
// configuration a miss is a plain "NOT met".
func TestVerdictNamesUnmeasuredSettings(t *testing.T) {
	results := func() []result {
		return []result{
			{Name: "spillcache", HeapInuse: 50 << 20, GCCPUSeconds: 1, GetsPerSec: 1e5, Spill: &CacheStats{}},
			{Name: "otter", HeapInuse: 100 << 20, GCCPUSeconds: 1, GetsPerSec: 1e6},
		}
	}
	quick := measured
	quick.keys, quick.duration, quick.warmup, quick.cxl, quick.rdma, quick.threads = 200_000, 3*time.Second, time.Second, -1, -1, 2
	require.NoError(t, quick.check())
	var out bytes.Buffer
	rs := results()
	setTargets(rs)
	report(&out, quick, rs)
	require.Contains(t, out.String(), "  Go heap in use                  0.500x  (target <= 0.10)  NOT met, but this run's settings are not the measured configuration (-keys 200000 -duration 3s -warmup 1s -threads 2; measured: the defaults)\n")

	full := measured
	require.NoError(t, full.check())
	require.Empty(t, full.unlikeMeasured())
	out.Reset()
	report(&out, full, rs)
	require.Contains(t, out.String(), "  Go heap in use                  0.500x  (target <= 0.10)  NOT met\n")
	require.Contains(t, out.String(), "  Gets/s                          0.100x  (target >= 0.70)  NOT met\n")
}

// The warm-up runs its operations however little time it is given, so
// every cache starts its measured run after the same operation stream;
// a negative count other than the default's -1 is refused.
func TestWarmupRunsItsOperations(t *testing.T) {
	cfg := config{keys: 1000, value: 64, skew: 0.99, reads: 0.9, threads: 2, warmupOps: -1, cxl: -1, rdma: -1}
	require.NoError(t, cfg.check())
	require.Equal(t, int64(warmupPerKey*1000), cfg.warmupOps)
	w := newWorkload(cfg)
	s := newOtter(cfg.keys)
	defer s.Close()
	gets, ops, wrong, _ := w.mix(s, 0, 20_000, nil, newProgress(io.Discard, false, s.Name()))
	require.GreaterOrEqual(t, ops, int64(20_000))
	require.Positive(t, gets)
	require.Zero(t, wrong)
	cfg.warmupOps = -2
	require.ErrorContains(t, cfg.check(), "-warmupops -2")
}

// The progress line goes only to a terminal: a buffer gets no \r.
func TestNoProgressOffTerminal(t *testing.T) {
	var out, status bytes.Buffer
	err := run(t.Context(), &out, &status, config{keys: 3000, value: 64, skew: 0.99, reads: 0.9, duration: 600 * time.Millisecond, warmup: 10 * time.Millisecond,
		threads: 1, compare: []string{"fastcache"}, noSpill: true, json: true, progress: true})
	require.NoError(t, err)
	require.NotContains(t, status.String(), "\r")
	require.False(t, isTerminal(&status))
}
