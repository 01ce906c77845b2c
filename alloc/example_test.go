package alloc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/pool"
)

// examplePool starts a poold inside this process for an example to dial,
// where a program would dial its host's daemon with alloc.Dial(ctx, ""):
// 64 MiB each of emulated CXL, local DRAM and rdma (over loopback, the
// daemon having no peers), on temporary directories that stop removes.
func examplePool() (socket string, stop func()) { return examplePoolWith(nil) }

// examplePoolWith is examplePool with set, when not nil, changing the
// daemon's configuration.
func examplePoolWith(set func(*pool.Config)) (socket string, stop func()) {
	dir, err := os.MkdirTemp("", "fmex")
	if err != nil {
		panic(fmt.Sprintf("example pool: %v", err))
	}
	shm := dir
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if shm, err = os.MkdirTemp("/dev/shm", "farmem-example"); err != nil {
			panic(fmt.Sprintf("example pool: %v", err))
		}
	}
	cfg := pool.DefaultConfig()
	cfg.Node = "example-node"
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.SysfsRoot = filepath.Join(dir, "no-sysfs") // no CXL found: the cxl tier is emulated
	cfg.ShmDir = shm
	cfg.Socket = filepath.Join(dir, "poold.sock")
	cfg.EmulateCXL, cfg.LocalSize, cfg.ExportSize = 64*size.MiB, 64*size.MiB, 64*size.MiB
	if set != nil {
		set(&cfg)
	}
	d, err := pool.Start(cfg, nil)
	if err != nil {
		panic(fmt.Sprintf("example pool: %v", err))
	}
	return cfg.Socket, func() {
		d.Close()
		os.RemoveAll(shm)
		os.RemoveAll(dir)
	}
}

// Dial connects to the local poold and opens a session; the session keeps
// the client's segments alive until Close (and one lease after a crash).
func ExampleDial() {
	socket, stop := examplePool() // a program passes "" for its host's poold
	defer stop()
	ctx := context.Background()

	c, err := alloc.Dial(ctx, socket, alloc.WithClientName("example"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	fmt.Println("node:", c.Node())
	tiers, err := c.Tiers(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, t := range tiers {
		fmt.Printf("%-5s %-8s emulated=%-5v %d MiB\n", t.Tier, t.Kind, t.Emulated, t.Capacity>>20)
	}
	// Output:
	// node: example-node
	// cxl   emulated emulated=true  64 MiB
	// local dram     emulated=false 64 MiB
	// rdma  loopback emulated=true  64 MiB
}

// Alloc places a segment on the tier asked for, or fails with
// ErrNoCapacity: never silently on another tier. Every segment says what it
// really is. Load/store tiers (local, cxl) hand out the memory itself;
// rdma segments are reached with ReadAt and WriteAt only.
func ExampleClient_Alloc() {
	socket, stop := examplePool()
	defer stop()
	ctx := context.Background()
	c, err := alloc.Dial(ctx, socket)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	for _, tier := range []alloc.Tier{alloc.TierLocal, alloc.TierCXL, alloc.TierRDMA} {
		seg, err := c.Alloc(ctx, 1<<20, alloc.WithTier(tier))
		if err != nil {
			fmt.Println(err)
			return
		}
		msg := []byte("hello from " + tier.String())
		if _, err := seg.WriteAt(msg, 4096); err != nil {
			fmt.Println(err)
			return
		}
		got := make([]byte, len(msg))
		if _, err := seg.ReadAt(got, 4096); err != nil {
			fmt.Println(err)
			return
		}
		_, loadStore := seg.Bytes()
		fmt.Printf("%s: %d KiB, kind %s, emulated %v, load/store %v, read back %q\n",
			seg.Tier(), seg.Size()>>10, seg.Kind(), seg.Emulated(), loadStore, got)
		if err := seg.Free(ctx); err != nil {
			fmt.Println(err)
			return
		}
	}

	// A tier that cannot hold the request says so.
	_, err = c.Alloc(ctx, 1<<30, alloc.WithTier(alloc.TierCXL))
	fmt.Println("1 GiB on cxl:", errors.Is(err, alloc.ErrNoCapacity))

	// WithFallback names the tiers to try next; the segment says where it went.
	seg, err := c.Alloc(ctx, 48<<20, alloc.WithTier(alloc.TierLocal), alloc.WithFallback(alloc.TierCXL))
	if err != nil {
		fmt.Println(err)
		return
	}
	seg2, err := c.Alloc(ctx, 48<<20, alloc.WithTier(alloc.TierLocal), alloc.WithFallback(alloc.TierCXL))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("first 48 MiB on", seg.Tier(), "then on", seg2.Tier())
	// Output:
	// local: 1024 KiB, kind dram, emulated false, load/store true, read back "hello from local"
	// cxl: 1024 KiB, kind emulated, emulated true, load/store true, read back "hello from cxl"
	// rdma: 1024 KiB, kind loopback, emulated true, load/store false, read back "hello from rdma"
	// 1 GiB on cxl: true
	// first 48 MiB on local then on cxl
}

// WithMaxLatency places a segment by what reading it costs: on the
// cheapest tier (rdma, then cxl, then local DRAM) whose read latency p50
// fits. Here poold emulates cxl at 300ns and rdma at 5µs, so the figures
// are known exactly; a host's poold measures its tiers at start, and
// 'memctl tiers' shows the figures placement goes by.
func ExampleWithMaxLatency() {
	socket, stop := examplePoolWith(func(cfg *pool.Config) {
		if err := cfg.EmulateLatency.Set("cxl=300ns,rdma=5us"); err != nil {
			panic(err)
		}
	})
	defer stop()
	ctx := context.Background()
	c, err := alloc.Dial(ctx, socket)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	// rdma is over 2µs; cxl fits and is cheaper than local DRAM.
	seg, err := c.Alloc(ctx, 1<<20, alloc.WithMaxLatency(2*time.Microsecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer seg.Free(ctx)
	p, _ := seg.Placement()
	fmt.Printf("on %s, judged by %dns p50 (%s) against %s\n", p.Tier, p.ReadLatency.P50Ns, p.ReadLatency.Source, p.MaxLatency)

	// No tier asked for fits: the error names the best one and its latency.
	_, err = c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierCXL), alloc.WithMaxLatency(100*time.Nanosecond))
	fmt.Println("over budget:", errors.Is(err, alloc.ErrOverBudget), strings.Contains(err.Error(), "the best tier, cxl, reads in 300ns p50 (injected)"))
	// Output:
	// on cxl, judged by 300ns p50 (injected) against 2µs
	// over budget: true true
}

// Attach opens a segment another client created with a name: two processes
// share memory through the pool. Named segments outlive their creator's
// session until freed.
func ExampleClient_Attach() {
	socket, stop := examplePool()
	defer stop()
	ctx := context.Background()

	// One process creates and fills the segment...
	producer, err := alloc.Dial(ctx, socket, alloc.WithClientName("producer"))
	if err != nil {
		fmt.Println(err)
		return
	}
	seg, err := producer.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierCXL), alloc.WithName("config/v1"))
	if err != nil {
		fmt.Println(err)
		return
	}
	b, _ := seg.Bytes() // cxl is a load/store tier: the memory itself
	copy(b, "max_conns=512")
	producer.Close() // named: the segment stays

	// ...another attaches to it by name and reads what the first wrote.
	consumer, err := alloc.Dial(ctx, socket, alloc.WithClientName("consumer"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer consumer.Close()
	shared, err := consumer.Attach(ctx, "config/v1")
	if err != nil {
		fmt.Println(err)
		return
	}
	got := make([]byte, len("max_conns=512"))
	if _, err := shared.ReadAt(got, 0); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s on %s: %s\n", shared.Name(), shared.Tier(), got)

	if err := shared.Free(ctx); err != nil {
		fmt.Println(err)
		return
	}
	_, err = consumer.Attach(ctx, "config/v1")
	fmt.Println("after Free, attach finds it:", err == nil)
	// Output:
	// config/v1 on cxl: max_conns=512
	// after Free, attach finds it: false
}

// ReadAt and WriteAt follow io.ReaderAt and io.WriterAt on every tier: a
// read that reaches the end of the segment returns what there is and
// io.EOF; a write that would not fit writes nothing.
func ExampleSegment_ReadAt() {
	socket, stop := examplePool()
	defer stop()
	ctx := context.Background()
	c, err := alloc.Dial(ctx, socket)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	for _, tier := range []alloc.Tier{alloc.TierCXL, alloc.TierRDMA} {
		seg, err := c.Alloc(ctx, 64<<10, alloc.WithTier(tier))
		if err != nil {
			fmt.Println(err)
			return
		}
		end := seg.Size()
		if _, err := seg.WriteAt([]byte("tail"), end-4); err != nil {
			fmt.Println(err)
			return
		}
		buf := make([]byte, 16)
		n, err := seg.ReadAt(buf, end-4)
		fmt.Printf("%s: read %d bytes %q, io.EOF %v\n", tier, n, buf[:n], errors.Is(err, io.EOF))

		_, err = seg.WriteAt([]byte("too long"), end-4)
		fmt.Printf("%s: write past the end: out of range %v\n", tier, errors.Is(err, alloc.ErrOutOfRange))

		// A Segment is an io.ReaderAt: the standard library reads it.
		r := io.NewSectionReader(seg, end-4, 4)
		all, err := io.ReadAll(r)
		fmt.Printf("%s: %q %v\n", tier, all, err)
		seg.Free(ctx)
	}
	// Output:
	// cxl: read 4 bytes "tail", io.EOF true
	// cxl: write past the end: out of range true
	// cxl: "tail" <nil>
	// rdma: read 4 bytes "tail", io.EOF true
	// rdma: write past the end: out of range true
	// rdma: "tail" <nil>
}

// ReadBatch reads many ranges of a segment in one call: on the rdma tier
// they travel to the home together and cost about one round trip. The
// batch is checked whole first: one span out of range refuses it all.
func ExampleSegment_ReadBatch() {
	socket, stop := examplePool()
	defer stop()
	ctx := context.Background()
	c, err := alloc.Dial(ctx, socket)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	seg, err := c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierRDMA))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer seg.Free(ctx)

	// Three records, written in one call.
	err = seg.WriteBatch(ctx, []alloc.Span{
		{Off: 0, Buf: []byte("alpha")},
		{Off: 4096, Buf: []byte("bravo")},
		{Off: 500_000, Buf: []byte("charlie")},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	spans := []alloc.Span{
		{Off: 0, Buf: make([]byte, 5)},
		{Off: 4096, Buf: make([]byte, 5)},
		{Off: 500_000, Buf: make([]byte, 7)},
	}
	if err := seg.ReadBatch(ctx, spans); err != nil {
		fmt.Println(err)
		return
	}
	for _, sp := range spans {
		fmt.Printf("%d: %s\n", sp.Off, sp.Buf)
	}

	bad := append(spans, alloc.Span{Off: seg.Size() - 2, Buf: make([]byte, 4)})
	err = seg.ReadBatch(ctx, bad)
	fmt.Println("past the end: out of range", errors.Is(err, alloc.ErrOutOfRange))
	// Output:
	// 0: alpha
	// 4096: bravo
	// 500000: charlie
	// past the end: out of range true
}

// Prefetch starts reading a range of an rdma segment ahead of need; the
// ReadAt calls that follow are served from the client's buffer instead of
// a round trip each. (A sequential scan like this one is also detected
// and read ahead without the hint.) Client.Stats counts the hits.
func ExampleSegment_Prefetch() {
	socket, stop := examplePool()
	defer stop()
	ctx := context.Background()
	c, err := alloc.Dial(ctx, socket)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	seg, err := c.Alloc(ctx, 4<<20, alloc.WithTier(alloc.TierRDMA))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer seg.Free(ctx)

	if err := seg.Prefetch(0, 1<<20); err != nil {
		fmt.Println(err)
		return
	}
	p := make([]byte, 4096)
	for off := int64(0); off < 1<<20; off += int64(len(p)) {
		if _, err := seg.ReadAt(p, off); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Println("reads served from read-ahead:", c.Stats().PrefetchHits)

	err = seg.Prefetch(seg.Size()-10, 20)
	fmt.Println("past the end: out of range", errors.Is(err, alloc.ErrOutOfRange))
	// Output:
	// reads served from read-ahead: 256
	// past the end: out of range true
}

// An Arena keeps many small objects in far-memory segments, named by Ref
// rather than by pointer, so that the garbage collector never scans them.
func ExampleArena() {
	socket, stop := examplePool()
	defer stop()
	ctx := context.Background()
	c, err := alloc.Dial(ctx, socket)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	a, err := alloc.NewArena(c, alloc.ArenaTier(alloc.TierCXL), alloc.ArenaSegmentSize(1<<20))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close(ctx)

	refs := map[string]alloc.Ref{}
	for _, v := range []string{"alpha", "a much longer value than the first", "γ"} {
		r, err := a.Alloc(len(v))
		if err != nil {
			fmt.Println(err)
			return
		}
		if _, err := a.WriteAt(r, []byte(v), 0); err != nil {
			fmt.Println(err)
			return
		}
		refs[v] = r
	}
	r := refs["a much longer value than the first"]
	n, _ := a.Len(r)
	buf := make([]byte, n)
	if _, err := a.ReadAt(r, buf, 0); err != nil {
		fmt.Println(err)
		return
	}
	tier, _ := a.Tier(r)
	fmt.Printf("%q (%d bytes) on %s\n", buf, n, tier)

	if err := a.Free(r); err != nil {
		fmt.Println(err)
		return
	}
	_, err = a.ReadAt(r, buf, 0)
	fmt.Println("read after Free is refused:", errors.Is(err, alloc.ErrBadRef))
	// Output:
	// "a much longer value than the first" (34 bytes) on cxl
	// read after Free is refused: true
}

// Attach with Shared joins a segment as a shared segment: every attachment,
// on any host, caches the pages it uses, and the home keeps the copies
// coherent, so a counter bumped through one attachment is seen by another
// that read it before. Shared segments live on the rdma tier.
func ExampleShared() {
	socket, stop := examplePool()
	defer stop()
	ctx := context.Background()
	c, err := alloc.Dial(ctx, socket)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close() // detaches the attachments, writing modified pages back
	if _, err := c.Alloc(ctx, 4096, alloc.WithName("board"), alloc.WithTier(alloc.TierRDMA)); err != nil {
		fmt.Println(err)
		return
	}
	a, err := c.Attach(ctx, "board", alloc.Shared())
	if err != nil {
		fmt.Println(err)
		return
	}
	b, err := c.Attach(ctx, "board", alloc.Shared()) // another process, another host: the same
	if err != nil {
		fmt.Println(err)
		return
	}
	v, _ := b.Load64(0) // b now holds the page shared
	a.Add64(0, 1)       // a takes it exclusive: the home invalidates b's copy first
	w, _ := b.Load64(0)
	fmt.Println("b read", v, "then", w)
	if err := a.Shared().Sync(ctx); err != nil { // a's writes now survive a's death
		fmt.Println(err)
	}
	// Output: b read 0 then 1
}

// GetMany reads many arena objects in one call: on the rdma tier the reads
// of each segment travel together, about one round trip for the batch.
// Each entry has its own outcome: a freed Ref fails its entry, not the
// batch.
func ExampleArena_GetMany() {
	socket, stop := examplePool()
	defer stop()
	ctx := context.Background()
	c, err := alloc.Dial(ctx, socket)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	a, err := alloc.NewArena(c, alloc.ArenaTier(alloc.TierRDMA), alloc.ArenaSegmentSize(1<<20))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close(ctx)

	var gets []alloc.ArenaGet
	for _, v := range []string{"alpha", "bravo", "charlie"} {
		r, err := a.Alloc(len(v))
		if err != nil {
			fmt.Println(err)
			return
		}
		if _, err := a.WriteAt(r, []byte(v), 0); err != nil {
			fmt.Println(err)
			return
		}
		gets = append(gets, alloc.ArenaGet{Ref: r, Buf: make([]byte, 0, 64)})
	}
	if err := a.Free(gets[1].Ref); err != nil {
		fmt.Println(err)
		return
	}
	err = a.GetMany(ctx, gets)
	fmt.Println("batch complete:", err == nil)
	for _, g := range gets {
		fmt.Printf("%q freed: %v\n", g.Buf, errors.Is(g.Err, alloc.ErrBadRef))
	}
	// Output:
	// batch complete: false
	// "alpha" freed: false
	// "" freed: true
	// "charlie" freed: false
}
