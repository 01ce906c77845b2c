package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/bench"
	"github.com/farmem/farmem/internal/embedded"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/pool"
)

// config is the workload and the caches' budgets.
type config struct {
	socket   string
	keys     int
	value    int
	skew     float64
	hotset   float64
	hotops   float64
	reads    float64
	duration time.Duration
	warmup   time.Duration
	// warmupOps is the least number of operations of the warm-up, the
	// same for every cache (-1: warmupPerKey per key; 0: -warmup alone).
	warmupOps int64
	threads   int
	hot       int64
	cxl       int64 // -1: derived from the dataset
	rdma      int64
	compare   []string
	noSpill   bool // measure only the compare caches, not spillcache itself
	verify    int
	json      bool
	progress  bool
}

func main() {
	var cfg config
	hot, cxl, rdma := size.Size(64*size.MiB), size.Size(-1), size.Size(-1)
	var compare string
	flag.StringVar(&cfg.socket, "socket", "", "poold socket (default: $FARMEM_SOCKET or the daemon's default; none running: start one in this process)")
	flag.IntVar(&cfg.keys, "keys", 1_000_000, "keys in the dataset (the default, with 1 KiB values, is 0.95 GiB)")
	flag.IntVar(&cfg.value, "value", 1024, "value size in bytes")
	flag.Float64Var(&cfg.skew, "skew", 0.99, "zipfian skew theta in [0,1): 0.99 is YCSB's, 0 is uniform")
	flag.Float64Var(&cfg.hotset, "hotset", 0, "instead of zipf, YCSB's hotspot: this fraction of keys gets -hotops of the operations (0: zipf)")
	flag.Float64Var(&cfg.hotops, "hotops", 0.99, "with -hotset, the fraction of operations on the hot keys")
	flag.Float64Var(&cfg.reads, "reads", 0.95, "fraction of operations that are Gets (the rest are Sets)")
	flag.DurationVar(&cfg.duration, "duration", 5*time.Second, "measured run per cache, after loading")
	flag.DurationVar(&cfg.warmup, "warmup", 3*time.Second, "unmeasured run per cache after loading, so hot entries reach the hot tier; it lasts at least this long and -warmupops operations")
	flag.Int64Var(&cfg.warmupOps, "warmupops", -1, "operations of the warm-up, the same for every cache, so each is measured in its steady state (default: 3 per key; 0: -warmup alone)")
	flag.IntVar(&cfg.threads, "threads", 64, "goroutines issuing operations to each cache, as a server with many requests in flight")
	flag.Var(&hot, "hot", "spillcache: bytes of entries on the Go heap")
	flag.Var(&cxl, "cxl", "spillcache: bytes of slots on the cxl tier (default: 60% of the dataset)")
	flag.Var(&rdma, "rdma", "spillcache: bytes of slots on the rdma tier (default: 60% of the dataset)")
	flag.StringVar(&compare, "compare", "otter,ristretto,fastcache", "caches to compare with, in order (otter, ristretto, fastcache; empty for none)")
	spill := flag.Bool("spill", true, "measure spillcache itself; false runs only the -compare caches (e.g. each in its own memory-limited process, as beyond-dram.sh does)")
	flag.IntVar(&cfg.verify, "verify", 100_000, "after the run, Get this many random keys (0: every key) and count those served")
	flag.BoolVar(&cfg.json, "json", false, "print one JSON object per cache instead of tables")
	flag.BoolVar(&cfg.progress, "progress", true, "print a progress line on stderr when it is a terminal")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof reads it)")
	memProfile := flag.String("memprofile", "", "write an allocation profile of the whole run to this file")
	flag.Parse()
	cfg.noSpill = !*spill
	cfg.hot, cfg.cxl, cfg.rdma = int64(hot), int64(cxl), int64(rdma)
	for _, name := range strings.Split(compare, ",") {
		if name = strings.TrimSpace(name); name != "" {
			cfg.compare = append(cfg.compare, name)
		}
	}
	stop, err := profile(*cpuProfile, *memProfile)
	if err == nil {
		err = run(context.Background(), os.Stdout, os.Stderr, cfg)
		err = errors.Join(err, stop())
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "spillcache: %v\n", err)
		os.Exit(1)
	}
}

// profile starts a CPU profile into cpu and arranges an allocation
// profile into mem (either "" for none); stop writes them.
func profile(cpu, mem string) (stop func() error, err error) {
	var f *os.File
	if cpu != "" {
		if f, err = os.Create(cpu); err != nil {
			return nil, fmt.Errorf("-cpuprofile: %w", err)
		}
		if err = pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("-cpuprofile: %w", err)
		}
	}
	return func() error {
		var err error
		if f != nil {
			pprof.StopCPUProfile()
			err = f.Close()
		}
		if mem != "" {
			m, merr := os.Create(mem)
			if merr != nil {
				return errors.Join(err, fmt.Errorf("-memprofile: %w", merr))
			}
			err = errors.Join(err, pprof.Lookup("allocs").WriteTo(m, 0), m.Close())
		}
		return err
	}, nil
}

// warmupPerKey is the default warm-up in operations per key. A far entry
// moves up when it is hit, so a cache nears its steady state once the
// popular keys the load left on the slow tiers have been hit. The load
// leaves a random 40% of zipf 0.99's million keys on the rdma tier; those
// of them not hit yet draw, in expectation, 10% of the Gets after 300k
// operations, 6% after a million and 3.4% after three million, on top of
// the 3.7% the best placement of the default budgets sends to rdma.
const warmupPerKey = 3

func (cfg *config) dataset() int64 { return int64(cfg.keys) * int64(cfg.value+keyLen) }

func (cfg *config) check() error {
	switch {
	case cfg.keys < 1:
		return fmt.Errorf("-keys %d: need at least one key", cfg.keys)
	case cfg.value < 8 || cfg.value > alloc.MaxObjectSize-64:
		return fmt.Errorf("-value %d: use 8 to %d bytes", cfg.value, alloc.MaxObjectSize-64)
	case cfg.skew < 0 || cfg.skew >= 1:
		return fmt.Errorf("-skew %g: use a theta in [0,1)", cfg.skew)
	case cfg.hotset < 0 || cfg.hotset >= 1 || cfg.hotops < 0 || cfg.hotops > 1:
		return fmt.Errorf("-hotset %g -hotops %g: use fractions, -hotset below 1", cfg.hotset, cfg.hotops)
	case cfg.reads < 0 || cfg.reads > 1:
		return fmt.Errorf("-reads %g: use a fraction in [0,1]", cfg.reads)
	case cfg.threads < 1:
		return fmt.Errorf("-threads %d: need at least one", cfg.threads)
	case cfg.warmupOps < -1:
		return fmt.Errorf("-warmupops %d: use a count of operations, 0 for none beyond -warmup", cfg.warmupOps)
	case cfg.noSpill && len(cfg.compare) == 0:
		return fmt.Errorf("-spill=false with an empty -compare measures nothing; name a cache in -compare")
	}
	if cfg.cxl < 0 {
		cfg.cxl = cfg.dataset() * 6 / 10
	}
	if cfg.rdma < 0 {
		cfg.rdma = cfg.dataset() * 6 / 10
	}
	if cfg.warmupOps < 0 {
		cfg.warmupOps = warmupPerKey * int64(cfg.keys)
	}
	return nil
}

func run(ctx context.Context, out, status io.Writer, cfg config) error {
	if err := cfg.check(); err != nil {
		return err
	}
	// The progress line redraws itself with \r: on a pipe or in a file it
	// would only garble the output.
	cfg.progress = cfg.progress && isTerminal(status)
	var c *alloc.Client
	if !cfg.noSpill {
		cl, stop, err := connect(ctx, status, cfg)
		if err != nil {
			return err
		}
		defer stop()
		defer cl.Close()
		c = cl
	}

	fmt.Fprintf(status, "building %d keys (dataset %s: %d-byte values), zipf %.2f, %.0f%% reads, %d goroutines, %s per cache\n",
		cfg.keys, size.Size(cfg.dataset()).Human(), cfg.value, cfg.skew, cfg.reads*100, cfg.threads, cfg.duration)
	w := newWorkload(cfg)
	var results []result
	var makers []func() (subject, error)
	if !cfg.noSpill {
		makers = append(makers, func() (subject, error) {
			sc, err := NewCache(ctx, c, Options{HotBytes: cfg.hot, CXLBytes: cfg.cxl, RDMABytes: cfg.rdma, RecordBytes: keyLen + cfg.value,
				Log: slog.New(slog.NewTextHandler(status, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			if err != nil {
				return nil, err
			}
			// The rdma tier's own ReadAt of a record's size, timed beside
			// the Gets under the same load.
			probe, err := c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierRDMA))
			if err != nil {
				sc.Close(ctx)
				return nil, fmt.Errorf("rdma segment to time ReadAt on: %w", err)
			}
			return spill{sc, probe, recordHeader + keyLen + cfg.value}, nil
		})
	}
	for _, name := range cfg.compare {
		switch name {
		case "otter":
			makers = append(makers, func() (subject, error) { return newOtter(cfg.keys), nil })
		case "ristretto":
			makers = append(makers, func() (subject, error) { return newRistretto(cfg.keys, cfg.dataset()) })
		case "fastcache":
			makers = append(makers, func() (subject, error) { return newFastcache(cfg.dataset()), nil })
		default:
			return fmt.Errorf("-compare: unknown cache %q; use otter, ristretto or fastcache", name)
		}
	}
	for _, mk := range makers {
		r, err := w.measure(ctx, mk, status)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	setTargets(results)
	if cfg.json {
		enc := json.NewEncoder(out)
		for _, r := range results {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	report(out, cfg, results)
	return nil
}

const keyLen = 16

// workload is the dataset and the operation mix, the same for every cache.
type workload struct {
	cfg     config
	keys    keyTable
	zipf    *zipf
	scatter scatter
}

func newWorkload(cfg config) *workload {
	return &workload{cfg: cfg, keys: newKeyTable(cfg.keys), zipf: newZipf(uint64(cfg.keys), cfg.skew), scatter: newScatter(uint64(cfg.keys))}
}

// keyTable holds the dataset's keys in one string, keyLen bytes each. A
// []string of a million keys would be a million objects the collector marks
// in every cycle of every cache's run — the harness's cost, not the cache's,
// and one that grows with the number of cycles, so it would punish the cache
// with the smaller heap. Keys handed out are substrings: no allocation.
type keyTable struct {
	all string
	n   int
}

func newKeyTable(n int) keyTable {
	b := make([]byte, 0, n*keyLen)
	for i := range n {
		b = fmt.Appendf(b, "k%015d", i)
	}
	return keyTable{all: string(b), n: n}
}

func (k keyTable) key(i int) string { return k.all[i*keyLen : (i+1)*keyLen] }
func (k keyTable) len() int         { return k.n }

// next draws the key index of the next operation.
func (w *workload) next(rng *rand.Rand) int {
	if w.cfg.hotset > 0 {
		n := w.keys.len()
		hot := max(1, int(w.cfg.hotset*float64(n)))
		var rank int
		if rng.Float64() < w.cfg.hotops || hot == n {
			rank = rng.IntN(hot)
		} else {
			rank = hot + rng.IntN(n-hot)
		}
		return int(w.scatter.key(uint64(rank)))
	}
	return int(w.scatter.key(w.zipf.rank(rng.Float64())))
}

// value fills buf as key i's value: its index, then a pattern.
func value(buf []byte, i int) {
	binary.LittleEndian.PutUint64(buf, uint64(i))
	for j := 8; j < len(buf); j++ {
		buf[j] = byte(i + j)
	}
}

// result is one cache's line of the comparison.
type result struct {
	Name          string  `json:"name"`
	Entries       int64   `json:"entries"`
	HeapInuse     int64   `json:"heap_inuse_bytes"`
	GCCPUFraction float64 `json:"gc_cpu_fraction"`
	GetsPerSec    float64 `json:"gets_per_sec"`
	GetP50        int64   `json:"get_p50_ns"`
	GetP99        int64   `json:"get_p99_ns"`
	GCCycles      uint64  `json:"gc_cycles"`
	GCCPUSeconds  float64 `json:"gc_cpu_seconds"`      // compulsory: without idle mark work
	GCIdleSeconds float64 `json:"gc_idle_cpu_seconds"` // mark work on otherwise idle processors
	LoadSeconds   float64 `json:"load_seconds"`
	// The warm-up after the load, started cold: its operations and Gets/s.
	WarmupOps        int64        `json:"warmup_ops"`
	WarmupGetsPerSec float64      `json:"warmup_gets_per_sec"`
	Served           float64      `json:"served_fraction"`
	Wrong            int64        `json:"wrong_values"`
	Tiers            []tierResult `json:"tiers,omitempty"`
	Spill            *CacheStats  `json:"spill,omitempty"`
	ReadAt           *tierResult  `json:"rdma_readat,omitempty"` // the rdma tier's ReadAt of a record's size, under the same load
	Targets          []target     `json:"targets,omitempty"`
	// CPUPerOp is the process's CPU time (user and system, every thread:
	// with an embedded pool the daemon's too) over the measured run,
	// divided by its operations (Gets and Sets): unlike Gets/s, barely
	// moved by what else the machine runs. 0 where getrusage is not
	// available.
	CPUPerOp int64 `json:"cpu_ns_per_op"`
}

type tierResult struct {
	Level string `json:"level"`
	Hits  int64  `json:"hits"`
	P50   int64  `json:"get_p50_ns"`
	P99   int64  `json:"get_p99_ns"`
}

// measure builds a cache, loads the dataset, runs the mix for the
// configured duration, and reads heap and GC counters around it.
func (w *workload) measure(ctx context.Context, mk func() (subject, error), status io.Writer) (result, error) {
	runtime.GC()
	debug.FreeOSMemory()
	before := readGC()
	s, err := mk()
	if err != nil {
		return result{}, err
	}
	res := result{Name: s.Name()}
	prog := newProgress(status, w.cfg.progress, s.Name())
	hists := make([][numLevels + 2]hist, w.cfg.threads)
	// Load: every key once, in parallel.
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range w.cfg.threads {
		wg.Go(func() {
			buf := make([]byte, w.cfg.value)
			for {
				i := int(next.Add(1) - 1)
				if i >= w.keys.len() {
					return
				}
				value(buf, i)
				s.Set(w.keys.key(i), buf)
				prog.load(i+1, w.keys.len())
			}
		})
	}
	wg.Wait()
	res.LoadSeconds = time.Since(start).Seconds()
	wgets, wops, _, welapsed := w.mix(s, w.cfg.warmup, w.cfg.warmupOps, nil, prog)
	res.WarmupOps, res.WarmupGetsPerSec = wops, float64(wgets)/welapsed.Seconds()
	mid := readGC()
	cpu0, cpuErr := bench.SelfCPU()
	gets, ops, wrong, elapsed := w.mix(s, w.cfg.duration, 0, hists, prog)
	cpu1, _ := bench.SelfCPU()
	after := readGC()
	if cpuErr == nil && ops > 0 {
		res.CPUPerOp = int64(cpu1-cpu0) / ops
	}
	prog.done()
	res.GetsPerSec = float64(gets) / elapsed.Seconds()
	res.Wrong = wrong
	res.GCCycles = after.cycles - before.cycles
	res.GCCPUSeconds = after.gcCPU - before.gcCPU
	res.GCIdleSeconds = after.gcIdle - before.gcIdle
	if cpu := after.totalCPU - mid.totalCPU; cpu > 0 {
		res.GCCPUFraction = (after.gcCPU - mid.gcCPU) / cpu
	}
	var all hist
	for l := range numLevels + 1 {
		var h hist
		for t := range hists {
			h.merge(&hists[t][l])
		}
		if Level(l) != LevelMiss {
			all.merge(&h)
		}
		if _, ok := s.(spill); ok {
			res.Tiers = append(res.Tiers, tierResult{Level: Level(l).String(), Hits: h.n * 16, P50: h.quantile(0.5), P99: h.quantile(0.99)})
		}
	}
	if _, ok := s.(spill); ok {
		var h hist
		for t := range hists {
			h.merge(&hists[t][readAtSlot])
		}
		res.ReadAt = &tierResult{Level: "rdma ReadAt", Hits: h.n, P50: h.quantile(0.5), P99: h.quantile(0.99)}
	}
	res.GetP50, res.GetP99 = all.quantile(0.5), all.quantile(0.99)
	res.Entries = s.Entries()
	runtime.GC()
	res.HeapInuse = int64(readGC().heapObjects) - int64(before.heapObjects)
	if sp, ok := s.(spill); ok {
		st := sp.c.Stats()
		res.Spill = &st
	}
	res.Served, res.Wrong = w.verify(s, res.Wrong)
	s.Close()
	if sp, ok := s.(spill); ok {
		if err := errors.Join(sp.c.Close(ctx), sp.probe.Free(ctx)); err != nil {
			return res, err
		}
	}
	return res, nil
}

// readAtSlot is the histogram of the rdma tier's own ReadAt.
const readAtSlot = numLevels + 1

// mix runs the Get/Set mix on every goroutine for d and at least minOps
// operations, timing one Get in 16 into hists (nil: none), and one
// operation in 1024 a raw rdma ReadAt of a record's size when s has a far
// tier; it returns the Gets, the operations (Gets and Sets), the wrong
// values and the time taken.
func (w *workload) mix(s subject, d time.Duration, minOps int64, hists [][numLevels + 2]hist, prog *progress) (int64, int64, int64, time.Duration) {
	raw, _ := s.(rawReader)
	var gets, ops, wrong atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	start := time.Now()
	for t := range w.cfg.threads {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(t), uint64(start.UnixNano())))
			buf := make([]byte, w.cfg.value+keyLen+recordHeader)
			dst := make([]byte, 0, w.cfg.value)
			var n, g int64
			for ; ; n++ {
				if n%256 == 0 {
					gets.Add(g)
					ops.Add(min(n, 256))
					g = 0
					if time.Now().After(deadline) && ops.Load() >= minOps {
						return
					}
					prog.run(time.Until(deadline), gets.Load(), time.Since(start))
				}
				if raw != nil && hists != nil && n%1024 == 0 {
					t0 := time.Now()
					if raw.rawRead(rng, buf) == nil {
						hists[t][readAtSlot].add(int64(time.Since(t0)))
					}
				}
				i := w.next(rng)
				if rng.Float64() >= w.cfg.reads {
					value(buf[:w.cfg.value], i)
					s.Set(w.keys.key(i), buf[:w.cfg.value])
					continue
				}
				g++
				var t0 time.Time
				timed := hists != nil && n%16 == 0
				if timed {
					t0 = time.Now()
				}
				v, level := s.Get(dst[:0], w.keys.key(i))
				if timed {
					hists[t][level].add(int64(time.Since(t0)))
				}
				if level != LevelMiss && (len(v) != w.cfg.value || binary.LittleEndian.Uint64(v) != uint64(i)) {
					wrong.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return gets.Load(), ops.Load(), wrong.Load(), time.Since(start)
}

// verify Gets cfg.verify random keys (every key if 0) and returns the
// fraction served with the right value.
func (w *workload) verify(s subject, wrong int64) (float64, int64) {
	n := w.cfg.verify
	if n <= 0 || n > w.keys.len() {
		n = w.keys.len()
	}
	var found, bad atomic.Int64
	var wg sync.WaitGroup
	per := (n + w.cfg.threads - 1) / w.cfg.threads
	for t := range w.cfg.threads {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(t), 99))
			dst := make([]byte, 0, w.cfg.value)
			for j := t * per; j < min(n, (t+1)*per); j++ {
				i := j
				if n < w.keys.len() {
					i = rng.IntN(w.keys.len())
				}
				v, level := s.Get(dst[:0], w.keys.key(i))
				if level == LevelMiss {
					continue
				}
				if len(v) != w.cfg.value || binary.LittleEndian.Uint64(v) != uint64(i) {
					bad.Add(1)
					continue
				}
				found.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(found.Load()) / float64(n), wrong + bad.Load()
}

// connect dials the local poold, or starts an embedded one sized for the
// budgets when none answers.
func connect(ctx context.Context, status io.Writer, cfg config) (*alloc.Client, func(), error) {
	return embedded.Connect(ctx, status, cfg.socket, "spillcache", func(pc *pool.Config) {
		// Room for the budgets, the arenas' partly used slabs and the far indexes.
		pc.EmulateCXL = size.Size(cfg.cxl + cfg.cxl/4 + cfg.rdma/8 + 512<<20)
		pc.ExportSize = size.Size(cfg.rdma + cfg.rdma/4 + 512<<20)
		pc.LocalSize = 64 * size.MiB
	})
}

// progress prints a line on stderr, at most twice a second, when stderr is
// a terminal.
type progress struct {
	mu   sync.Mutex
	w    io.Writer
	on   bool
	name string
	last time.Time
}

func newProgress(w io.Writer, on bool, name string) *progress {
	return &progress{w: w, on: on, name: name}
}

func (p *progress) tick() bool {
	if !p.on {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.last) < 500*time.Millisecond {
		return false
	}
	p.last = time.Now()
	return true
}

func (p *progress) load(i, n int) {
	if i%1024 == 0 && p.tick() {
		fmt.Fprintf(p.w, "\r%-11s load %3d%% (%d/%d keys)            ", p.name, i*100/n, i, n)
	}
}

func (p *progress) run(left time.Duration, gets int64, elapsed time.Duration) {
	if p.tick() {
		fmt.Fprintf(p.w, "\r%-11s run  %4.1fs left, %.2fM gets/s      ", p.name, max(left.Seconds(), 0), float64(gets)/elapsed.Seconds()/1e6)
	}
}

func (p *progress) done() {
	if p.on {
		fmt.Fprintf(p.w, "\r%-60s\r", "")
	}
}

// report prints the comparison tables.
func report(out io.Writer, cfg config, results []result) {
	dist := fmt.Sprintf("zipf %.2f", cfg.skew)
	if cfg.hotset > 0 {
		dist = fmt.Sprintf("hotspot: %.0f%% of ops on %.1f%% of keys", cfg.hotops*100, cfg.hotset*100)
	}
	fmt.Fprintf(out, "\n%d keys, %d-byte values (dataset %s), %s, %.0f%% Gets, %d goroutines, %s; spillcache budgets: hot %s, cxl %s, rdma %s\n\n",
		cfg.keys, cfg.value, size.Size(cfg.dataset()).Human(), dist, cfg.reads*100, cfg.threads, cfg.duration,
		size.Size(cfg.hot).Human(), size.Size(cfg.cxl).Human(), size.Size(cfg.rdma).Human())
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cache\tentries\tserved\tGo heap in use\tGC cycles\tGC CPU\tGC idle\tGets/s\tCPU/op\tGet p50\tGet p99\tload\twarm-up Gets/s\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%s\t%d\t%.1f%% (%.2fs)\t%.2fs\t%.2fM\t%s\t%s\t%s\t%.1fs\t%.2fM (%.1fM ops)\t\n", r.Name, r.Entries, r.Served*100,
			size.Size(r.HeapInuse).Human(), r.GCCycles, r.GCCPUFraction*100, r.GCCPUSeconds, r.GCIdleSeconds, r.GetsPerSec/1e6,
			time.Duration(r.CPUPerOp), time.Duration(r.GetP50), time.Duration(r.GetP99), r.LoadSeconds, r.WarmupGetsPerSec/1e6, float64(r.WarmupOps)/1e6)
	}
	tw.Flush()
	for _, r := range results {
		if r.Spill == nil {
			continue
		}
		fmt.Fprintf(out, "\nspillcache by tier (Get hits estimated from 1-in-16 timed samples):\n\n")
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "tier\tentries\thits\tGet p50\tGet p99\t")
		for i, t := range r.Tiers {
			entries := "-"
			if i < int(numLevels) {
				entries = fmt.Sprint(r.Spill.Entries[i])
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t\n", t.Level, entries, t.Hits, time.Duration(t.P50), time.Duration(t.P99))
		}
		if t := r.ReadAt; t != nil {
			fmt.Fprintf(tw, "%s\t-\t%d\t%s\t%s\t\n", t.Level, t.Hits, time.Duration(t.P50), time.Duration(t.P99))
		}
		tw.Flush()
		fmt.Fprintf(out, "promoted %d, not admitted %d, demoted %d, dropped %d, lost %d, rdma records read %d; far memory held: cxl %s, rdma %s\n",
			r.Spill.Promoted, r.Spill.Rejected, r.Spill.Demoted, r.Spill.Dropped, r.Spill.Lost, r.Spill.FarReads, size.Size(r.Spill.FarHeld[0]).Human(), size.Size(r.Spill.FarHeld[1]).Human())
	}
	var sp *result
	for i := range results {
		if results[i].Spill != nil {
			sp = &results[i]
		}
	}
	if sp == nil {
		return
	}
	group := ""
	for _, t := range sp.Targets {
		if t.Group != group {
			group = t.Group
			if r := find(results, group); r != nil {
				fmt.Fprintf(out, "\nspillcache vs %s (%.0f%% of the dataset on the heap):\n", group, 100*float64(r.Entries)/float64(cfg.keys))
			} else {
				fmt.Fprintf(out, "\nspillcache's tiers:\n")
			}
		}
		op := ">="
		if t.AtMost {
			op = "<="
		}
		fmt.Fprintf(out, "  %-30s %6.3fx  (target %s %.2f)  %s\n", t.Name, t.Value, op, t.Limit, verdict(t.Met, cfg))
		if r := find(results, t.Group); t.Name == "Gets/s" && r != nil && r.WarmupGetsPerSec > 0 {
			// The measured run starts warm; the warm-up is the cold start.
			fmt.Fprintf(out, "  %-30s %6.3fx  (no target)\n", "Gets/s in the warm-up, cold", sp.WarmupGetsPerSec/r.WarmupGetsPerSec)
		}
	}
}

func find(results []result, name string) *result {
	for i := range results {
		if results[i].Name == name {
			return &results[i]
		}
	}
	return nil
}

// target is one of the README's targets as this run measured it: a ratio
// of spillcache's figure to a baseline's, measured in the same run.
type target struct {
	Group  string  `json:"vs"` // the compared cache, or "tiers"
	Name   string  `json:"name"`
	Value  float64 `json:"ratio"`
	Limit  float64 `json:"limit"`
	AtMost bool    `json:"at_most"` // Value must be <= Limit; else >=
	Met    bool    `json:"met"`
}

// setTargets computes spillcache's targets against the on-heap caches and
// between its own tiers.
func setTargets(results []result) {
	sp := -1
	for i := range results {
		if results[i].Spill != nil {
			sp = i
		}
	}
	if sp < 0 {
		return
	}
	r := &results[sp]
	add := func(group, name string, v, limit float64, atMost bool) {
		r.Targets = append(r.Targets, target{Group: group, Name: name, Value: v, Limit: limit, AtMost: atMost, Met: atMost && v <= limit || !atMost && v >= limit})
	}
	for _, o := range results {
		if o.Name != "otter" && o.Name != "ristretto" {
			continue
		}
		gc := 0.0
		if o.GCCPUSeconds > 0 {
			gc = r.GCCPUSeconds / o.GCCPUSeconds
		}
		add(o.Name, "Go heap in use", ratio(r.HeapInuse, o.HeapInuse), 0.10, true)
		add(o.Name, "GC CPU seconds", gc, 0.20, true)
		add(o.Name, "Gets/s", r.GetsPerSec/o.GetsPerSec, 0.70, false)
	}
	if len(r.Tiers) > int(LevelRDMA) && r.ReadAt != nil {
		add("tiers", "cxl Get p50 / hot Get p50", ratio(r.Tiers[LevelCXL].P50, r.Tiers[LevelHot].P50), 2, true)
		add("tiers", "rdma Get p50 / rdma ReadAt p50", ratio(r.Tiers[LevelRDMA].P50, r.ReadAt.P50), 1.3, true)
	}
}

func ratio(a, b int64) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// verdict says whether a target is met; a miss under other settings than
// the targets were measured with says so, as such a run may miss them.
func verdict(ok bool, cfg config) string {
	if ok {
		return "met"
	}
	if d := cfg.unlikeMeasured(); len(d) > 0 {
		return "NOT met, but this run's settings are not the measured configuration (" + strings.Join(d, " ") + "; measured: " + measuredFlags + ")"
	}
	return "NOT met"
}

// measuredFlags names the settings the README's targets were measured
// with: every flag at its default. Other settings may miss them.
const measuredFlags = "the defaults"

// measured is the default configuration.
var measured = config{keys: 1_000_000, value: 1024, skew: 0.99, hotops: 0.99, reads: 0.95,
	duration: 5 * time.Second, warmup: 3 * time.Second, warmupOps: -1, threads: 64, hot: 64 << 20, cxl: -1, rdma: -1}

// unlikeMeasured lists, as flags, the settings of cfg that differ from the
// measured configuration.
func (cfg config) unlikeMeasured() []string {
	m := measured
	m.cxl, m.rdma = cfg.dataset()*6/10, cfg.dataset()*6/10 // the defaults, for cfg's dataset
	m.warmupOps = warmupPerKey * int64(cfg.keys)
	if err := m.check(); err != nil {
		return []string{err.Error()}
	}
	var d []string
	add := func(differs bool, flag string, v any) {
		if differs {
			d = append(d, fmt.Sprintf("-%s %v", flag, v))
		}
	}
	add(cfg.keys != m.keys, "keys", cfg.keys)
	add(cfg.value != m.value, "value", cfg.value)
	add(cfg.hotset != m.hotset, "hotset", cfg.hotset)
	add(cfg.hotset != 0 && cfg.hotops != m.hotops, "hotops", cfg.hotops)
	add(cfg.hotset == 0 && cfg.skew != m.skew, "skew", cfg.skew)
	add(cfg.reads != m.reads, "reads", cfg.reads)
	add(cfg.duration != m.duration, "duration", cfg.duration)
	add(cfg.warmup != m.warmup, "warmup", cfg.warmup)
	add(cfg.warmupOps != m.warmupOps, "warmupops", cfg.warmupOps)
	add(cfg.threads != m.threads, "threads", cfg.threads)
	add(cfg.hot != m.hot, "hot", size.Size(cfg.hot))
	add(cfg.cxl != m.cxl, "cxl", size.Size(cfg.cxl))
	add(cfg.rdma != m.rdma, "rdma", size.Size(cfg.rdma))
	return d
}
