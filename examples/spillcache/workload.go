package main

import (
	"math"
	"math/bits"
	"runtime/metrics"
)

// zipf draws ranks 0..n-1 with YCSB's zipfian distribution (Gray et al.,
// "Quickly generating billion-record synthetic databases"): rank 0 is the
// most popular; theta in (0,1) is the skew (YCSB uses 0.99), 0 is uniform.
type zipf struct {
	n                        uint64
	theta, alpha, zetan, eta float64
	half                     float64
}

func newZipf(n uint64, theta float64) *zipf {
	z := &zipf{n: n, theta: theta}
	if theta <= 0 {
		return z
	}
	for i := uint64(1); i <= n; i++ {
		z.zetan += 1 / math.Pow(float64(i), theta)
	}
	zeta2 := 1 + math.Pow(0.5, theta)
	z.alpha = 1 / (1 - theta)
	z.eta = (1 - math.Pow(2/float64(n), 1-theta)) / (1 - zeta2/z.zetan)
	z.half = 1 + math.Pow(0.5, theta)
	return z
}

// rank maps a uniform u in [0,1) to a rank.
func (z *zipf) rank(u float64) uint64 {
	if z.theta <= 0 {
		return uint64(u * float64(z.n))
	}
	uz := u * z.zetan
	if uz < 1 {
		return 0
	}
	if uz < z.half {
		return 1
	}
	return min(uint64(float64(z.n)*math.Pow(z.eta*u-z.eta+1, z.alpha)), z.n-1)
}

// scatter maps ranks to key indexes by a bijection, so popular keys are
// spread over the caches' shards.
type scatter struct{ n, a uint64 }

func newScatter(n uint64) scatter {
	a := uint64(2654435761)
	for gcd(a, n) != 1 {
		a += 2
	}
	return scatter{n, a}
}

func (s scatter) key(rank uint64) uint64 {
	hi, lo := bits.Mul64(rank, s.a)
	_, rem := bits.Div64(hi%s.n, lo, s.n)
	return rem
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// hist is a latency histogram in nanoseconds with 32 buckets per power of
// two (3% resolution). Not safe for concurrent use: one per goroutine.
type hist struct {
	n      int64
	counts [32 + 40*32]int64
}

func (h *hist) add(ns int64) {
	v := uint64(max(ns, 0))
	i := int(v)
	if v >= 32 {
		e := bits.Len64(v) - 6
		i = 32 + e*32 + int(v>>e) - 32
	}
	h.counts[min(i, len(h.counts)-1)]++
	h.n++
}

func (h *hist) merge(o *hist) {
	h.n += o.n
	for i, c := range o.counts {
		h.counts[i] += c
	}
}

// quantile returns the q-quantile's bucket midpoint, 0 without samples.
func (h *hist) quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	want := int64(math.Ceil(q * float64(h.n)))
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= want {
			if i < 32 {
				return int64(i)
			}
			e := (i - 32) / 32
			m := int64((i-32)%32 + 32)
			return m<<e + (int64(1)<<e)/2
		}
	}
	return -1
}

// gcSample reads the runtime's counters the comparison reports. gcCPU is
// the collector's compulsory CPU time: its total minus the idle mark work,
// which runs only on processors the scheduler had nothing else for (the
// runtime/metrics documentation says to subtract it for exactly this).
// A cache that waits on far memory leaves processors idle, and the
// collector fills them; that time is gcIdle, reported apart.
type gcSample struct {
	gcCPU, gcIdle, totalCPU float64 // seconds
	cycles                  uint64
	heapObjects             uint64 // bytes
}

var gcMetrics = []string{
	"/cpu/classes/gc/total:cpu-seconds",
	"/cpu/classes/gc/mark/idle:cpu-seconds",
	"/cpu/classes/total:cpu-seconds",
	"/gc/cycles/total:gc-cycles",
	"/memory/classes/heap/objects:bytes",
}

func readGC() gcSample {
	s := make([]metrics.Sample, len(gcMetrics))
	for i, name := range gcMetrics {
		s[i].Name = name
	}
	metrics.Read(s)
	idle := s[1].Value.Float64()
	return gcSample{gcCPU: s[0].Value.Float64() - idle, gcIdle: idle, totalCPU: s[2].Value.Float64(), cycles: s[3].Value.Uint64(), heapObjects: s[4].Value.Uint64()}
}
