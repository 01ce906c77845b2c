package extent

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

var scaling = flag.Bool("scaling", false, "run TestAllocFreeScaling, which measures Alloc+Free cost at 10 and 100,000 live extents and logs the ratio")

// benchLive are the live-extent counts BenchmarkAllocFree measures; the
// first is the baseline of TestAllocFreeScaling.
var benchLive = []int{10, 1000, 100_000}

// BenchmarkAllocFree measures one Alloc and its Free on a device holding
// live allocated extents and as many free holes of 1 to 8 pages between
// them, so both free trees hold live entries. Each Alloc splits a hole by
// best fit and its Free coalesces it back, so the state is the same after
// every iteration.
func BenchmarkAllocFree(b *testing.B) {
	for _, live := range benchLive {
		b.Run(fmt.Sprintf("live=%d", live), benchAllocFree(live))
	}
}

// BenchmarkAllocFreePacked is BenchmarkAllocFree on a device filled by
// live back-to-back allocations with all free space in one extent at the
// end: the free trees stay tiny, so it measures the allocated-extent map
// and the fixed cost.
func BenchmarkAllocFreePacked(b *testing.B) {
	for _, live := range benchLive {
		b.Run(fmt.Sprintf("live=%d", live), benchAllocFreePacked(live))
	}
}

func benchAllocFree(live int) func(*testing.B) {
	return func(b *testing.B) { runAllocFree(b, fragmented(b, live)) }
}

func benchAllocFreePacked(live int) func(*testing.B) {
	return func(b *testing.B) {
		a, err := New(int64(live+64)*page, page)
		if err != nil {
			b.Fatal(err)
		}
		for range live {
			if _, err := a.Alloc(page); err != nil {
				b.Fatal(err)
			}
		}
		runAllocFree(b, a)
	}
}

// runAllocFree times Alloc+Free pairs of 1 to 8 pages on a.
func runAllocFree(b *testing.B, a *Allocator) {
	rng := rand.New(rand.NewPCG(1, uint64(a.Stats().Allocated)))
	sizes := make([]int64, 1024)
	for i := range sizes {
		sizes[i] = (1 + rng.Int64N(8)) * page
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		n := sizes[i%len(sizes)]
		i++
		off, err := a.Alloc(n)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(off, n); err != nil {
			b.Fatal(err)
		}
	}
}

// fragmented returns an allocator with live one-page extents, each
// followed by a free hole of 1 to 8 pages.
func fragmented(b *testing.B, live int) *Allocator {
	b.Helper()
	holes := make([]int64, live)
	var total int64
	for i := range holes {
		holes[i] = int64(1+i%8) * page
		total += page + holes[i]
	}
	a, err := New(total, page)
	if err != nil {
		b.Fatal(err)
	}
	offs := make([]int64, live)
	for i := range holes {
		if _, err := a.Alloc(page); err != nil {
			b.Fatal(err)
		}
		if offs[i], err = a.Alloc(holes[i]); err != nil {
			b.Fatal(err)
		}
	}
	for i, off := range offs {
		if err := a.Free(off, holes[i]); err != nil {
			b.Fatal(err)
		}
	}
	if st := a.Stats(); st.Allocated != live || st.FreeExtents != live {
		b.Fatalf("setup: %+v, want %d live extents and %d holes", st, live, live)
	}
	return a
}

// TestAllocFreeScaling is the comparison harness: it measures
// BenchmarkAllocFree at 10 and at 100,000 live extents in the same run,
// interleaved over several rounds, and logs the ratio of the fastest
// rounds (the least disturbed by other load on the machine) and the median
// of the per-round ratios. It asserts nothing about time, and it only runs
// when asked:
//
//	go test -run TestAllocFreeScaling -v ./internal/extent/ -scaling -test.benchtime=200ms
func TestAllocFreeScaling(t *testing.T) {
	if !*scaling {
		t.Skip("timing harness; run with: go test -run TestAllocFreeScaling -v ./internal/extent/ -scaling")
	}
	const rounds = 9
	for _, layout := range []struct {
		name  string
		bench func(int) func(*testing.B)
	}{{"fragmented", benchAllocFree}, {"packed", benchAllocFreePacked}} {
		var ratios []float64
		minBase, minBig := int64(math.MaxInt64), int64(math.MaxInt64)
		for range rounds {
			base := testing.Benchmark(layout.bench(10)).NsPerOp()
			big := testing.Benchmark(layout.bench(100_000)).NsPerOp()
			ratios = append(ratios, float64(big)/float64(base))
			minBase, minBig = min(minBase, base), min(minBig, big)
		}
		slices.Sort(ratios)
		t.Logf("%s: fastest live=10 %d ns/op, fastest live=100000 %d ns/op, ratio %.2f; per-round ratios %.2f..%.2f, median %.2f",
			layout.name, minBase, minBig, float64(minBig)/float64(minBase), ratios[0], ratios[rounds-1], ratios[rounds/2])
	}
}
