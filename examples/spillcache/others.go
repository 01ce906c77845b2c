package main

import (
	"math/rand/v2"
	"unsafe"

	"github.com/VictoriaMetrics/fastcache"
	"github.com/dgraph-io/ristretto/v2"
	"github.com/maypok86/otter/v2"

	"github.com/farmem/farmem/alloc"
)

// subject is a cache under test, as the workload driver drives it.
type subject interface {
	Name() string
	Get(dst []byte, key string) ([]byte, Level)
	Set(key string, val []byte)
	Entries() int64
	Close()
}

func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// spill adapts Cache. probe is an rdma segment whose ReadAt of a
// record's size (size bytes) the driver times beside the Gets.
type spill struct {
	c     *Cache
	probe *alloc.Segment
	size  int
}

// rawReader is a subject with a far tier whose own read the driver times
// under the same load as the subject's Gets.
type rawReader interface {
	rawRead(rng *rand.Rand, buf []byte) error
}

func (s spill) rawRead(rng *rand.Rand, buf []byte) error {
	off := rng.Int64N(s.probe.Size()-int64(s.size)) &^ 15
	_, err := s.probe.ReadAt(buf[:s.size], off)
	return err
}

func (s spill) Name() string                               { return "spillcache" }
func (s spill) Get(dst []byte, key string) ([]byte, Level) { return s.c.GetLevel(dst, key) }
func (s spill) Set(key string, val []byte)                 { s.c.Set(key, val) }
func (s spill) Close()                                     {}
func (s spill) Entries() int64 {
	st := s.c.Stats()
	return st.Entries[LevelHot] + st.Entries[LevelCXL] + st.Entries[LevelRDMA] - st.Copies
}

// otterCache holds the whole dataset on the Go heap.
type otterCache struct{ c *otter.Cache[string, []byte] }

func newOtter(entries int) subject {
	return otterCache{otter.Must(&otter.Options[string, []byte]{MaximumSize: entries + entries/10 + 16})}
}
func (o otterCache) Name() string { return "otter" }
func (o otterCache) Get(dst []byte, key string) ([]byte, Level) {
	v, ok := o.c.GetIfPresent(key)
	if !ok {
		return dst, LevelMiss
	}
	return append(dst, v...), LevelHot
}

// Set stores a copy: an on-heap cache keeps the slice it is given.
func (o otterCache) Set(key string, val []byte) { o.c.Set(key, append([]byte(nil), val...)) }
func (o otterCache) Entries() int64             { return int64(o.c.EstimatedSize()) }
func (o otterCache) Close()                     { o.c.InvalidateAll() }

// ristrettoCache holds the whole dataset on the Go heap.
type ristrettoCache struct {
	c *ristretto.Cache[string, []byte]
}

func newRistretto(entries int, bytes int64) (subject, error) {
	c, err := ristretto.NewCache(&ristretto.Config[string, []byte]{
		NumCounters: int64(entries) * 10, MaxCost: bytes + bytes/5, BufferItems: 64, Metrics: true,
	})
	return ristrettoCache{c}, err
}
func (r ristrettoCache) Name() string { return "ristretto" }
func (r ristrettoCache) Get(dst []byte, key string) ([]byte, Level) {
	v, ok := r.c.Get(key)
	if !ok {
		return dst, LevelMiss
	}
	return append(dst, v...), LevelHot
}
func (r ristrettoCache) Set(key string, val []byte) {
	r.c.Set(key, append([]byte(nil), val...), int64(len(key)+len(val)))
}
func (r ristrettoCache) Entries() int64 {
	r.c.Wait()
	m := r.c.Metrics
	return int64(m.KeysAdded() - m.KeysEvicted())
}
func (r ristrettoCache) Close() { r.c.Close() }

// fast is fastcache: values in large chunks allocated outside the Go heap.
type fast struct{ c *fastcache.Cache }

func newFastcache(bytes int64) subject { return fast{fastcache.New(int(bytes + bytes/2))} }
func (f fast) Name() string            { return "fastcache" }
func (f fast) Get(dst []byte, key string) ([]byte, Level) {
	v, ok := f.c.HasGet(dst, bytesOf(key))
	if !ok {
		return dst, LevelMiss
	}
	return v, LevelHot
}
func (f fast) Set(key string, val []byte) { f.c.Set(bytesOf(key), val) }
func (f fast) Entries() int64 {
	var s fastcache.Stats
	f.c.UpdateStats(&s)
	return int64(s.EntriesCount)
}
func (f fast) Close() { f.c.Reset() }
