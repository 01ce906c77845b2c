package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"os"
	"slices"
	"text/tabwriter"
	"time"
	"unsafe"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/embedded"
	"github.com/farmem/farmem/internal/size"
)

func main() {
	segSize := size.Size(64 * size.MiB)
	socket := flag.String("socket", "", "poold socket (default: $FARMEM_SOCKET or the daemon's default)")
	flag.Var(&segSize, "size", "segment size per tier")
	flag.Parse()
	if err := run(os.Stdout, *socket, int64(segSize)); err != nil {
		fmt.Fprintf(os.Stderr, "quickstart: %v\n", err)
		os.Exit(1)
	}
}

func run(out io.Writer, socket string, segSize int64) error {
	ctx := context.Background()
	c, stop, err := embedded.Connect(ctx, out, socket, "quickstart", nil)
	if err != nil {
		return err
	}
	defer stop()
	defer c.Close()

	tiers, err := c.Tiers(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\npoold on node %q offers %d tiers:\n\n", c.Node(), len(tiers))
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TIER\tKIND\tHARDWARE\tSEGMENT\tVERIFIED\tReadAt 64B p50\tseq read (Bytes)\tDEVICE")
	for _, t := range tiers {
		row, err := exercise(ctx, c, t, segSize)
		if err != nil {
			fmt.Fprintf(w, "%s\t%s\t%s\t-\tfailed: %v\n", t.Tier, t.Kind, hardware(t.Emulated), err)
			continue
		}
		fmt.Fprintln(w, row)
	}
	if !slices.ContainsFunc(tiers, func(t alloc.TierInfo) bool { return t.Tier == alloc.TierRDMA }) {
		fmt.Fprintf(w, "rdma\t-\t-\t-\t-\t-\t-\tnot offered by this daemon (no peers)\n")
	}
	w.Flush()
	fmt.Fprintln(out, "\nLatency and bandwidth above were measured just now in this process.")
	for _, t := range tiers {
		if t.Note != "" {
			fmt.Fprintf(out, "%s: %s\n", t.Tier, t.Note)
		}
	}
	return nil
}

func hardware(emulated bool) string {
	if emulated {
		return "EMULATED"
	}
	return "real"
}

// exercise allocates on one tier, writes random bytes, verifies them, and
// measures 64-byte random reads and a sequential read.
func exercise(ctx context.Context, c *alloc.Client, t alloc.TierInfo, segSize int64) (string, error) {
	n := min(segSize, t.Free)
	if n < 1<<20 {
		return "", fmt.Errorf("only %d bytes free", t.Free)
	}
	seg, err := c.Alloc(ctx, n, alloc.WithTier(t.Tier))
	if err != nil {
		return "", err
	}
	defer seg.Free(ctx)
	want := make([]byte, n)
	rand.Read(want)
	if _, err := seg.WriteAt(want, 0); err != nil {
		return "", err
	}
	got := make([]byte, n)
	if _, err := seg.ReadAt(got, 0); err != nil {
		return "", err
	}
	verified := "yes"
	if !slices.Equal(want, got) {
		verified = "MISMATCH"
	}
	lat := readLatency(seg, n)
	bw := "-"
	if b, ok := seg.Bytes(); ok {
		bw = fmt.Sprintf("%.1f GB/s", seqRead(b)/1e9)
	}
	return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", seg.Tier(), seg.Kind(), hardware(seg.Emulated()),
		size.Size(n).Human(), verified, lat, bw, seg.Device()), nil
}

// seqRead is the best of three sequential passes over b that load every
// 8-byte word, in bytes per second.
func seqRead(b []byte) float64 {
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8)
	best := time.Duration(math.MaxInt64)
	var sum uint64
	for range 3 {
		start := time.Now()
		for _, w := range words {
			sum += w
		}
		best = min(best, time.Since(start))
	}
	sink = sum
	return float64(len(words)*8) / best.Seconds()
}

// sink keeps the compiler from dropping the summing loop.
var sink uint64

// readLatency is the median of 64-byte ReadAt calls at random offsets.
func readLatency(seg *alloc.Segment, n int64) time.Duration {
	const samples = 2001
	p := make([]byte, 64)
	d := make([]time.Duration, samples)
	for i := range d {
		off := mrand.Int64N(n/64) * 64
		start := time.Now()
		seg.ReadAt(p, off)
		d[i] = time.Since(start)
	}
	slices.Sort(d)
	return d[samples/2]
}
