package bench

import (
	"math"
	"math/bits"
	"time"
)

// subBits is log2 of the buckets per power of two: 32 buckets, so a value
// is known to within 1/32 (3 %) of itself, as HDR histograms do with two
// significant digits, in a fixed 15 KiB array and one add per sample.
const subBits = 5

const nBuckets = (64-subBits)<<subBits + 2<<subBits

// Histogram counts latencies in log-linear buckets. The zero value is
// empty and ready. Not safe for concurrent use: keep one per goroutine and
// Merge them.
type Histogram struct {
	counts   [nBuckets]uint64
	n        uint64
	sum      float64
	min, max int64
}

func bucket(v int64) int {
	if v < 0 {
		v = 0
	}
	u := uint64(v)
	b := bits.Len64(u)
	if b <= subBits+1 {
		return int(u)
	}
	shift := b - subBits - 1
	return shift<<subBits + int(u>>shift)
}

// bounds returns the values bucket i holds: [lo, hi).
func bounds(i int) (lo, hi int64) {
	if i < 2<<subBits {
		return int64(i), int64(i) + 1
	}
	shift := i>>subBits - 1
	m := int64(i - shift<<subBits)
	return m << shift, (m + 1) << shift
}

// Record adds one latency.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	h.counts[bucket(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// Count is how many latencies were recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Mean is the mean latency, 0 if empty.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the latency below which a fraction q (0..1) of the
// recorded latencies lie: the midpoint of the bucket that holds it,
// clamped to the exact minimum and maximum; the maximum itself for the
// last rank. 0 if empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	q = math.Max(0, math.Min(1, q))
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	if rank >= h.n {
		return time.Duration(h.max)
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := bounds(i)
			return time.Duration(min(max((lo+hi-1)/2, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}

// CDFPoint is one point of a cumulative distribution: a fraction of
// operations took at most Latency.
type CDFPoint struct {
	Latency  time.Duration
	Fraction float64
}

// CDF returns the cumulative distribution, one point per non-empty bucket
// (at the bucket's upper bound, clamped to the maximum), starting at the
// minimum with fraction 0.
func (h *Histogram) CDF() []CDFPoint {
	if h.n == 0 {
		return nil
	}
	pts := []CDFPoint{{Latency: time.Duration(h.min)}}
	var seen uint64
	for i, c := range h.counts {
		if c == 0 {
			continue
		}
		seen += c
		_, hi := bounds(i)
		pts = append(pts, CDFPoint{Latency: time.Duration(max(min(hi, h.max), h.min)), Fraction: float64(seen) / float64(h.n)})
	}
	return pts
}
