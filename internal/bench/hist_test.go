package bench

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBucketsCoverEveryValueInOrder(t *testing.T) {
	prev := -1
	for _, v := range []int64{0, 1, 2, 63, 64, 65, 100, 1000, 1 << 20, 1<<40 + 12345, 1<<62 + 1, 1<<63 - 1} {
		i := bucket(v)
		require.Less(t, i, nBuckets, "value %d", v)
		require.GreaterOrEqual(t, i, prev, "value %d", v)
		lo, hi := bounds(i)
		require.LessOrEqual(t, lo, v, "value %d in bucket %d [%d,%d)", v, i, lo, hi)
		if v < 1<<63-1 {
			require.Less(t, v, hi, "value %d in bucket %d [%d,%d)", v, i, lo, hi)
		}
		require.LessOrEqual(t, float64(hi-lo), float64(lo)/32+1, "bucket %d [%d,%d) is wider than 1/32", i, lo, hi)
		prev = i
	}
}

func TestQuantilesMatchSortedSamples(t *testing.T) {
	for _, tc := range []struct {
		name string
		gen  func(r *rand.Rand) time.Duration
	}{
		{"uniform 1-100µs", func(r *rand.Rand) time.Duration { return time.Duration(1000 + r.IntN(99000)) }},
		{"exponential ~20µs", func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * 20000) }},
		{"two modes", func(r *rand.Rand) time.Duration {
			if r.IntN(10) == 0 {
				return time.Duration(500000 + r.IntN(1000))
			}
			return time.Duration(60 + r.IntN(20))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			var h Histogram
			var all []time.Duration
			for range 20000 {
				d := tc.gen(r)
				h.Record(d)
				all = append(all, d)
			}
			slices.Sort(all)
			require.EqualValues(t, len(all), h.Count())
			for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 1} {
				want := all[max(int(q*float64(len(all)))-1, 0)]
				got := h.Quantile(q)
				require.InDelta(t, float64(want), float64(got), float64(want)/32+1, "q %.2f", q)
			}
			require.Equal(t, all[len(all)-1], h.Quantile(1))
		})
	}
}

func TestMergeAndCDF(t *testing.T) {
	var a, b, all Histogram
	for i := range 1000 {
		d := time.Duration(100 + i*37)
		all.Record(d)
		if i%2 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	var m Histogram
	m.Merge(&a)
	m.Merge(&b)
	m.Merge(&Histogram{})
	require.Equal(t, all, m)

	cdf := m.CDF()
	require.Equal(t, CDFPoint{Latency: 100}, cdf[0])
	require.Equal(t, 1.0, cdf[len(cdf)-1].Fraction)
	require.Equal(t, time.Duration(100+999*37), cdf[len(cdf)-1].Latency)
	for i := 1; i < len(cdf); i++ {
		require.GreaterOrEqual(t, cdf[i].Latency, cdf[i-1].Latency)
		require.Greater(t, cdf[i].Fraction, cdf[i-1].Fraction)
	}
	var empty Histogram
	require.Nil(t, empty.CDF())
	require.Zero(t, empty.Quantile(0.5))
	require.Zero(t, empty.Mean())
}
