//go:build linux

package device

import (
	"cmp"
	"slices"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seqReadSize is far larger than the last-level cache, so the benchmark
// measures memory, not cache, bandwidth.
const seqReadSize = 256 << 20

var seqReadSink uint64

// sumWords reads b sequentially, 8 bytes at a time, with four independent
// accumulators so the loop is bound by memory, not by an add chain.
func sumWords(b []byte) uint64 {
	w := unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8)
	var s0, s1, s2, s3 uint64
	for len(w) >= 4 {
		s0 += w[0]
		s1 += w[1]
		s2 += w[2]
		s3 += w[3]
		w = w[4:]
	}
	return s0 + s1 + s2 + s3
}

func fillWords(b []byte) {
	w := unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8)
	for i := range w {
		w[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
}

// BenchmarkSeqRead reads a 256 MiB segment mapped with Map and, interleaved
// in the same iterations, an anonymous private mapping of the same size (the
// baseline); both are written in full first. It reports each side's GB/s and
// ratio = segment GB/s / anonymous GB/s (1.0 = no cost for the shared
// mapping): medians over the iterations, the ratio per back-to-back pair.
// ns/op and MB/s count the segment reads only (means).
//
//	go test -run '^$' -bench SeqRead -benchtime 20x ./internal/device/
func BenchmarkSeqRead(b *testing.B) {
	anon, err := unix.Mmap(-1, 0, seqReadSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := unix.Munmap(anon); err != nil {
			b.Error(err)
		}
	}()
	fillWords(anon)

	cases := []struct {
		name string
		open func(b *testing.B) (Device, error)
	}{
		{"emulated-tmpdir", func(b *testing.B) (Device, error) {
			return NewEmulated("emulated0", b.TempDir(), seqReadSize)
		}},
		{"emulated-shm", func(b *testing.B) (Device, error) {
			return NewEmulated("emulated0", shmDir(b), seqReadSize)
		}},
		{"dram-memfd", func(b *testing.B) (Device, error) { return NewDRAM(seqReadSize) }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			d, err := tc.open(b)
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := d.Close(); err != nil {
					b.Error(err)
				}
			}()
			bk, err := d.Create(1, 0, seqReadSize)
			if err != nil {
				b.Fatal(err)
			}
			m, err := Map(bk, MapOptions{Populate: true})
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := m.Close(); err != nil {
					b.Error(err)
				}
				if err := bk.File.Close(); err != nil {
					b.Error(err)
				}
			}()
			seg := m.Bytes()
			fillWords(seg)

			// Per-iteration times: the machine is shared, so the medians
			// (and the median of per-pair ratios) are reported, not means.
			segTimes := make([]time.Duration, 0, b.N)
			anonTimes := make([]time.Duration, 0, b.N)
			ratios := make([]float64, 0, b.N)
			readAnon := func() {
				b.StopTimer()
				t0 := time.Now()
				seqReadSink += sumWords(anon)
				anonTimes = append(anonTimes, time.Since(t0))
				b.StartTimer()
			}
			b.SetBytes(seqReadSize)
			b.ResetTimer()
			for i := range b.N {
				if i%2 == 1 { // alternate the order so neither side always runs first
					readAnon()
				}
				t0 := time.Now()
				seqReadSink += sumWords(seg)
				segTimes = append(segTimes, time.Since(t0))
				if i%2 == 0 {
					readAnon()
				}
				ratios = append(ratios, float64(anonTimes[i])/float64(segTimes[i]))
			}
			b.StopTimer()
			gbps := func(d time.Duration) float64 { return float64(seqReadSize) / d.Seconds() / 1e9 }
			b.ReportMetric(gbps(median(segTimes)), "seg-GB/s")
			b.ReportMetric(gbps(median(anonTimes)), "anon-GB/s")
			b.ReportMetric(median(ratios), "ratio")
		})
	}
}

// median returns the middle element of a sorted copy of xs.
func median[T cmp.Ordered](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
