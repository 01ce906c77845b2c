package probe

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/rdma"
)

// LineSize is the size of one probed load: a cache line.
const LineSize = 64

// chainChunk is how many dependent loads one timed sample covers, so the
// clock's own cost is spread thin.
const chainChunk = 256

// Result is a latency distribution: the median and 99th percentile of the
// per-operation latency over Samples timed samples. A plain value, safe to
// copy.
type Result struct {
	// P50 and P99 are per-operation latencies.
	P50, P99 time.Duration
	// Samples is how many timed samples the percentiles are over.
	Samples int
}

// sink keeps the chain's last index alive so the loads are not optimised
// away; atomic, since several probes may run at once (two daemons in one
// test process).
var sink atomic.Uint64

// LoadChain measures the latency of dependent 64-byte loads in random
// order over mem: it writes a random cyclic permutation of mem's cache lines
// into mem (each line holding the index of the next), then times samples
// chunks of dependent loads and reports the per-load latency. mem is
// overwritten. It fails when mem holds fewer than two cache lines or
// samples is not positive.
func LoadChain(mem []byte, samples int) (Result, error) {
	return chain(mem, samples, false)
}

// StoreChain is LoadChain with a store into every line the chain visits:
// the per-step latency of a dependent load followed by a 64-byte line's
// write (read for ownership, then dirty), the write latency of a load/store
// tier. mem is overwritten; it fails as LoadChain does.
func StoreChain(mem []byte, samples int) (Result, error) {
	return chain(mem, samples, true)
}

func chain(mem []byte, samples int, store bool) (Result, error) {
	lines := len(mem) / LineSize
	if lines < 2 {
		return Result{}, fmt.Errorf("%w: load chain over %d bytes needs at least %d", ErrSpan, len(mem), 2*LineSize)
	}
	if samples <= 0 {
		return Result{}, fmt.Errorf("%w: %d samples asked; ask for at least 1", ErrSpan, samples)
	}
	// Sattolo's algorithm: a random permutation that is one cycle, so the
	// chain visits every line before it repeats.
	perm := make([]uint32, lines)
	for i := range perm {
		perm[i] = uint32(i)
	}
	for i := lines - 1; i > 0; i-- {
		j := rand.IntN(i)
		perm[i], perm[j] = perm[j], perm[i]
	}
	for i, next := range perm {
		binary.LittleEndian.PutUint64(mem[i*LineSize:], uint64(next))
	}
	perm = nil
	idx := uint64(0)
	// Warm up: one pass over at most a chunk's worth per sample.
	for range min(lines, chainChunk*4) {
		idx = binary.LittleEndian.Uint64(mem[idx*LineSize:])
	}
	ds := make([]time.Duration, samples)
	for s := range ds {
		start := time.Now()
		if store {
			for range chainChunk {
				line := mem[idx*LineSize : idx*LineSize+LineSize]
				line[8]++
				idx = binary.LittleEndian.Uint64(line)
			}
		} else {
			for range chainChunk {
				idx = binary.LittleEndian.Uint64(mem[idx*LineSize:])
			}
		}
		ds[s] = time.Since(start) / chainChunk
	}
	sink.Add(idx)
	return Summarize(ds), nil
}

// Summarize sorts ds and returns its percentiles (nearest rank) and count.
func Summarize(ds []time.Duration) Result {
	slices.Sort(ds)
	return Result{P50: percentile(ds, 50), P99: percentile(ds, 99), Samples: len(ds)}
}

// percentile of sorted ds, nearest rank.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := (len(ds)*p + 99) / 100
	return ds[min(max(i-1, 0), len(ds)-1)]
}

// SeqRead measures sequential read bandwidth over mem in bytes per second,
// the best of three passes. It fails on an empty span.
func SeqRead(mem []byte) (int64, error) {
	if len(mem) < 8 {
		return 0, fmt.Errorf("%w: sequential read over %d bytes needs at least 8", ErrSpan, len(mem))
	}
	n := len(mem) &^ 7
	return best(n, func() {
		var x uint64
		for i := 0; i < n; i += 8 {
			x += binary.LittleEndian.Uint64(mem[i:])
		}
		sink.Add(x)
	}), nil
}

// SeqWrite measures sequential write bandwidth over mem in bytes per
// second, the best of three passes; mem is overwritten. It fails on an empty
// span.
func SeqWrite(mem []byte) (int64, error) {
	if len(mem) == 0 {
		return 0, fmt.Errorf("%w: sequential write over an empty span", ErrSpan)
	}
	pass := byte(0)
	return best(len(mem), func() {
		pass++
		clear(mem) // compiles to memclr: a streaming store loop
		mem[0] = pass
	}), nil
}

// best runs f three times and returns n bytes over the fastest run, in
// bytes per second.
func best(n int, f func()) int64 {
	var fastest time.Duration
	for i := range 3 {
		start := time.Now()
		f()
		d := time.Since(start)
		if i == 0 || d < fastest {
			fastest = d
		}
	}
	return bps(int64(n), fastest)
}

func bps(n int64, d time.Duration) int64 {
	if d <= 0 {
		d = 1
	}
	return int64(float64(n) / d.Seconds())
}

// Remote is what RemoteRead measured. A plain value, safe to copy.
type Remote struct {
	// Read64 and Read4K are the round-trip latencies of one-sided 64-byte
	// and 4 KiB reads, one in flight.
	Read64, Read4K Result
	// Write64 is the round-trip latency of one-sided 64-byte writes, one
	// in flight.
	Write64 Result
	// ReadBandwidth is in bytes per second, from 1 MiB reads (or the
	// region's size when smaller), one in flight.
	ReadBandwidth int64
}

// bigRead is the size of the reads that measure bandwidth.
const bigRead = 1 << 20

// RemoteRead measures one-sided reads of region (size bytes long) over
// conn: samples round trips each of 64 B and 4 KiB, then a bandwidth figure
// from up to 16 reads of 1 MiB. With write set it also times samples 64 B
// writes (Remote.Write64), which overwrite the region. It returns the first failed operation's
// error, or ctx's.
func RemoteRead(ctx context.Context, conn rdma.Conn, region rdma.Region, size int64, samples int, write bool) (Remote, error) {
	if size < 4096 {
		return Remote{}, fmt.Errorf("%w: remote region of %d bytes; the probe reads 4 KiB", ErrSpan, size)
	}
	if samples <= 0 {
		return Remote{}, fmt.Errorf("%w: %d samples asked; ask for at least 1", ErrSpan, samples)
	}
	var out Remote
	buf := make([]byte, min(size, bigRead))
	for _, c := range []struct {
		n   int
		res *Result
	}{{64, &out.Read64}, {4096, &out.Read4K}} {
		ds := make([]time.Duration, samples)
		for i := range ds {
			off := int64(rand.IntN(int(size/int64(c.n)))) * int64(c.n)
			start := time.Now()
			if err := conn.Read(ctx, region, off, buf[:c.n]); err != nil {
				return Remote{}, fmt.Errorf("probe: %d-byte read at %d of %s: %w", c.n, off, region, err)
			}
			ds[i] = time.Since(start)
		}
		*c.res = Summarize(ds)
	}
	if write {
		ds := make([]time.Duration, samples)
		for i := range ds {
			off := int64(rand.IntN(int(size/64))) * 64
			start := time.Now()
			if err := conn.Write(ctx, region, off, buf[:64]); err != nil {
				return Remote{}, fmt.Errorf("probe: 64-byte write at %d of %s: %w", off, region, err)
			}
			ds[i] = time.Since(start)
		}
		out.Write64 = Summarize(ds)
	}
	var total int64
	start := time.Now()
	for i := range 16 {
		off := (int64(i) * int64(len(buf))) % (size - int64(len(buf)) + 1)
		if err := conn.Read(ctx, region, off, buf); err != nil {
			return Remote{}, fmt.Errorf("probe: %d-byte read at %d of %s: %w", len(buf), off, region, err)
		}
		total += int64(len(buf))
	}
	out.ReadBandwidth = bps(total, time.Since(start))
	return out, nil
}
