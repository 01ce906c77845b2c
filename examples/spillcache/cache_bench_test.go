package main

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkGetTier times Gets of keys on the heap and of keys on the cxl
// tier, one goroutine, keys in a random order over sets larger than the
// CPU's caches, so each Get pays the DRAM misses it takes: the cost the
// example's "cxl Get p50 / hot Get p50" target compares. The cxl keys are
// each read once per pass and the hot keys once more after each pass, so
// the admission policy promotes few cxl keys; one it promotes leaves the
// set (the Get that found it on the heap is one of the timed Gets).
func BenchmarkGetTier(b *testing.B) {
	const keys, val = 120_000, 1024
	c := newTestCache(b, Options{HotBytes: 32 << 20, CXLBytes: 256 << 20, RecordBytes: keyLen + val})
	kt := newKeyTable(keys)
	buf := make([]byte, val)
	for i := range keys {
		value(buf, i)
		c.Set(kt.key(i), buf)
	}
	byLevel := func() map[Level][]string {
		m := map[Level][]string{}
		for i := range keys {
			k := kt.key(i)
			_, l := c.GetLevel(buf[:0], k)
			m[l] = append(m[l], k)
		}
		return m
	}
	// Hot keys used more often than cxl keys, as in a skewed load: the
	// cxl keys' Gets do not beat them for the heap.
	for range 8 {
		for _, k := range byLevel()[LevelHot] {
			c.GetLevel(buf[:0], k)
		}
	}
	tiers := byLevel()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, l := range []Level{LevelHot, LevelCXL} {
		ks := tiers[l]
		require.NotEmpty(b, ks, "no key on tier %s", l)
		b.Run(fmt.Sprint(l), func(b *testing.B) {
			rng.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
			dst := make([]byte, 0, val)
			i, n := 0, len(ks)
			for b.Loop() {
				var got Level
				dst, got = c.GetLevel(dst[:0], ks[i])
				switch {
				case got == l:
					i++
				case l == LevelCXL && got == LevelHot && len(ks) > n/2:
					// Read once a pass, a cxl key can come to count as
					// used as often as a hot one, then more, and move up:
					// it leaves the set, the timed Get counted as a cxl one.
					ks[i] = ks[len(ks)-1]
					ks = ks[:len(ks)-1]
				default:
					b.Fatalf("key %s found on %s, want %s (%d of %d keys left)", ks[i], got, l, len(ks), n)
				}
				if i >= len(ks) {
					i = 0
					if l == LevelCXL {
						// The pass read each cxl key once more: read the
						// hot keys once more too, untimed, so that few cxl
						// keys come to count as more used.
						b.StopTimer()
						for _, k := range tiers[LevelHot] {
							c.GetLevel(dst[:0], k)
						}
						b.StartTimer()
					}
				}
			}
		})
	}
}
