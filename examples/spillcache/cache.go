package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/farmem/farmem/alloc"
)

// Level is where a Get found its key.
type Level int

// The levels, fastest first.
const (
	LevelHot  Level = iota // the Go heap
	LevelCXL               // a cxl arena
	LevelRDMA              // an rdma arena
	LevelMiss
	numLevels = LevelMiss
)

var levelNames = [...]string{"hot", "cxl", "rdma", "miss"}

func (l Level) String() string { return levelNames[l] }

// Options size a Cache. Every budget is in bytes.
type Options struct {
	// HotBytes bounds keys and values kept on the Go heap. Default: 64 MiB.
	HotBytes int64
	// CXLBytes bounds the slots of entries spilled to the cxl tier; 0 skips the tier.
	CXLBytes int64
	// RDMABytes bounds the slots of entries spilled to the rdma tier; 0 skips the tier.
	RDMABytes int64
	// Shards is the number of independently locked parts. Default: 64.
	Shards int
	// RecordBytes is the expected key+value size, which sizes the far
	// indexes (entries beyond it are evicted). Default: 1 KiB.
	RecordBytes int
	// Log receives lost-entry warnings. Default: discarded.
	Log *slog.Logger
}

// Cache maps string keys to byte values. Hot entries live on the Go heap;
// cold ones spill to CXL memory, then to remote memory, where the index
// (a far hash table) and the values are invisible to the garbage
// collector. A hit in a lower tier promotes the entry to the heap; each
// tier evicts by a clock sweep when full, demoting to the next tier or, at
// the last, dropping the entry.
//
// A Cache is safe for concurrent use. Get copies the value out, and Set
// copies it in: the caller keeps ownership of its slices.
type Cache struct {
	seed   maphash.Seed
	shards []shard
	tiers  []*farTier // cxl then rdma, those with a budget
	hotCap int64      // per shard
	log    *slog.Logger

	hits                             [numLevels + 1]atomic.Int64
	promoted, demoted, dropped, lost atomic.Int64
}

// farTier is one spill tier: an arena for records and a far index.
type farTier struct {
	level    Level
	arena    *alloc.Arena
	table    *farTable
	capBytes int64 // per shard, in slot bytes
	capCount int   // per shard, keeps the index below 75% full
}

type hotEntry struct {
	key  string
	val  []byte
	ref  bool
	used bool
	// far names an unchanged copy of the entry in spill tier farTier (-1:
	// none): a clean entry leaves the heap without being written again.
	far     alloc.Ref
	farTier int8
	hash    uint64
}

type shard struct {
	mu      sync.Mutex
	hot     map[string]int32
	entries []hotEntry
	holes   []int32
	hand    int
	bytes   int64
	far     [2]farShard
	scratch []byte
	spare   []byte // the value buffer of the last entry to leave the heap
	_       [64]byte
}

type farShard struct {
	bytes int64
	count int
	hand  uint64
	move  []byte // an entry on its way to the next tier (evictFar)
}

// recordHeader precedes key and value in a far record: key length, value length.
const recordHeader = 8

// NewCache builds a cache whose spill tiers allocate through c.
func NewCache(ctx context.Context, c *alloc.Client, o Options) (*Cache, error) {
	if o.HotBytes <= 0 {
		o.HotBytes = 64 << 20
	}
	if o.Shards <= 0 {
		o.Shards = 64
	}
	if o.RecordBytes <= 0 {
		o.RecordBytes = 1 << 10
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	cc := &Cache{seed: maphash.MakeSeed(), shards: make([]shard, o.Shards), hotCap: o.HotBytes / int64(o.Shards), log: o.Log}
	for i := range cc.shards {
		cc.shards[i].hot = map[string]int32{}
	}
	for _, t := range []struct {
		level  Level
		tier   alloc.Tier
		budget int64
	}{{LevelCXL, alloc.TierCXL, o.CXLBytes}, {LevelRDMA, alloc.TierRDMA, o.RDMABytes}} {
		if t.budget <= 0 {
			continue
		}
		perShard := t.budget / int64(o.Shards)
		count := int(perShard/int64(alloc.SizeClass(o.RecordBytes+recordHeader))) + 1
		buckets := uint64(1)
		for buckets*3 < uint64(count)*4 {
			buckets <<= 1
		}
		// An arena also holds partly used slabs; give it room beyond the budget.
		// Segments of about a sixteenth of the budget, 4 to 64 MiB.
		seg := int64(4 << 20)
		for seg < 64<<20 && seg*16 < t.budget {
			seg <<= 1
		}
		a, err := alloc.NewArena(c, alloc.ArenaTier(t.tier), alloc.ArenaSegmentSize(seg), alloc.ArenaLimit(t.budget+t.budget/4+256<<20))
		if err != nil {
			cc.Close(ctx)
			return nil, err
		}
		ft := &farTier{level: t.level, arena: a, capBytes: perShard, capCount: int(buckets * 3 / 4)}
		cc.tiers = append(cc.tiers, ft)
		if ft.table, err = newFarTable(c, ctx, o.Shards, buckets); err != nil {
			cc.Close(ctx)
			return nil, err
		}
	}
	return cc, nil
}

// Close returns the cache's far memory to the pool.
func (c *Cache) Close(ctx context.Context) error {
	var err error
	for _, t := range c.tiers {
		err = errors.Join(err, t.arena.Close(ctx))
		if t.table != nil {
			err = errors.Join(err, t.table.free(ctx))
		}
	}
	return err
}

func (c *Cache) locate(key string) (uint64, *shard, int) {
	h := maphash.String(c.seed, key)
	i := int((h >> 40) % uint64(len(c.shards)))
	return h, &c.shards[i], i
}

// Get appends key's value to dst.
func (c *Cache) Get(dst []byte, key string) ([]byte, bool) {
	dst, l := c.GetLevel(dst, key)
	return dst, l != LevelMiss
}

// GetLevel is Get that also says where the key was found.
func (c *Cache) GetLevel(dst []byte, key string) ([]byte, Level) {
	h, sh, si := c.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if i, ok := sh.hot[key]; ok {
		e := &sh.entries[i]
		e.ref = true
		c.hits[LevelHot].Add(1)
		return append(dst, e.val...), LevelHot
	}
	for ti, t := range c.tiers {
		reg := t.table.region(si)
		var val []byte
		var ferr error
		b := t.table.find(reg, h, func(r alloc.Ref) bool {
			var k []byte
			k, val, ferr = c.readRecord(sh, t, r)
			return ferr != nil || string(k) == key
		})
		if b < 0 {
			continue
		}
		if ferr != nil {
			c.loseEntry(sh, si, ti, uint64(b), ferr)
			continue
		}
		start := len(dst)
		dst = append(dst, val...)
		reg[2*b] |= bucketRef
		c.hits[t.level].Add(1)
		c.promoted.Add(1)
		c.putHot(sh, si, key, dst[start:], h, alloc.Ref(reg[2*b+1]), int8(ti))
		return dst, t.level
	}
	c.hits[LevelMiss].Add(1)
	return dst, LevelMiss
}

// readRecord returns a far record's key and value. On a load/store tier
// they alias far memory, valid until the record is freed; on rdma they are
// in sh.scratch, valid until the shard's next read.
func (c *Cache) readRecord(sh *shard, t *farTier, r alloc.Ref) ([]byte, []byte, error) {
	rec, err := t.arena.Bytes(r)
	if errors.Is(err, alloc.ErrNotSupported) {
		n, lerr := t.arena.Len(r)
		if lerr != nil {
			return nil, nil, lerr
		}
		if cap(sh.scratch) < n {
			sh.scratch = make([]byte, n)
		}
		rec = sh.scratch[:n]
		_, err = t.arena.ReadAt(r, rec, 0)
	}
	if err != nil {
		return nil, nil, err
	}
	if len(rec) < recordHeader {
		return nil, nil, fmt.Errorf("far record %v of %d bytes is shorter than its header", r, len(rec))
	}
	kl, vl := binary.LittleEndian.Uint32(rec), binary.LittleEndian.Uint32(rec[4:])
	if int(kl)+int(vl)+recordHeader != len(rec) {
		return nil, nil, fmt.Errorf("far record %v: key %d + value %d bytes do not fill its %d bytes", r, kl, vl, len(rec))
	}
	return rec[recordHeader : recordHeader+kl], rec[recordHeader+kl:], nil
}

// loseEntry forgets an entry whose far memory failed (its host died, say):
// a miss, counted and logged, never a crash.
func (c *Cache) loseEntry(sh *shard, si, ti int, b uint64, err error) {
	c.lost.Add(1)
	c.log.Warn("spillcache: far entry lost", "tier", c.tiers[ti].level, "err", err)
	c.dropFar(sh, si, ti, b)
}

// dropFar removes bucket b of tier ti and frees its record.
func (c *Cache) dropFar(sh *shard, si, ti int, b uint64) {
	t := c.tiers[ti]
	reg := t.table.region(si)
	r := alloc.Ref(reg[2*b+1])
	t.table.remove(reg, b)
	fs := &sh.far[ti]
	fs.count--
	if n, err := t.arena.Len(r); err == nil {
		fs.bytes -= int64(alloc.SizeClass(n))
	}
	_ = t.arena.Free(r) // a lost record's Free fails; it is forgotten either way
}

// Set stores a copy of val under key.
func (c *Cache) Set(key string, val []byte) {
	h, sh, si := c.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if i, ok := sh.hot[key]; ok {
		e := &sh.entries[i]
		c.dropFarCopy(sh, si, e)
		sh.bytes += int64(len(val) - len(e.val))
		e.val = append(e.val[:0], val...)
		e.ref = true
		c.evictHot(sh, si)
		return
	}
	c.deleteFar(sh, si, h, key)
	c.putHot(sh, si, key, val, h, 0, -1)
}

// Delete removes key.
func (c *Cache) Delete(key string) {
	h, sh, si := c.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if i, ok := sh.hot[key]; ok {
		c.dropFarCopy(sh, si, &sh.entries[i])
		c.removeHot(sh, i)
		return
	}
	c.deleteFar(sh, si, h, key)
}

// farCopy returns the bucket of a hot entry's far copy, if the far tier
// still holds it (it may have evicted it since).
func (c *Cache) farCopy(si int, e *hotEntry) (int, int) {
	if e.farTier < 0 {
		return -1, -1
	}
	ti := int(e.farTier)
	t := c.tiers[ti]
	return ti, t.table.find(t.table.region(si), e.hash, func(r alloc.Ref) bool { return r == e.far })
}

// dropFarCopy frees a hot entry's far copy, which a Set makes stale.
func (c *Cache) dropFarCopy(sh *shard, si int, e *hotEntry) {
	if ti, b := c.farCopy(si, e); b >= 0 {
		c.dropFar(sh, si, ti, uint64(b))
	}
	e.farTier = -1
}

func (c *Cache) deleteFar(sh *shard, si int, h uint64, key string) {
	for ti, t := range c.tiers {
		reg := t.table.region(si)
		b := t.table.find(reg, h, func(r alloc.Ref) bool {
			k, _, err := c.readRecord(sh, t, r)
			return err != nil || string(k) == key
		})
		if b >= 0 {
			c.dropFar(sh, si, ti, uint64(b))
			return
		}
	}
}

func (c *Cache) removeHot(sh *shard, i int32) {
	e := &sh.entries[i]
	delete(sh.hot, e.key)
	sh.bytes -= int64(len(e.key) + len(e.val))
	*e = hotEntry{}
	sh.holes = append(sh.holes, i)
}

// putHot adds a new hot entry (copying val) and evicts to the budget. far
// and farTier name an unchanged far copy (farTier -1: none).
func (c *Cache) putHot(sh *shard, si int, key string, val []byte, h uint64, far alloc.Ref, farTier int8) {
	buf := sh.spare[:0]
	sh.spare = nil
	if cap(buf) < len(val) || cap(buf) > 2*len(val)+64 {
		buf = make([]byte, 0, len(val))
	}
	e := hotEntry{key: key, val: append(buf, val...), used: true, hash: h, far: far, farTier: farTier}
	var i int32
	if n := len(sh.holes); n > 0 {
		i = sh.holes[n-1]
		sh.holes = sh.holes[:n-1]
		sh.entries[i] = e
	} else {
		i = int32(len(sh.entries))
		sh.entries = append(sh.entries, e)
	}
	sh.hot[key] = i
	sh.bytes += int64(len(key) + len(val))
	c.evictHot(sh, si)
}

// evictHot runs the clock over hot entries until the shard fits its budget,
// demoting victims to the first spill tier.
func (c *Cache) evictHot(sh *shard, si int) {
	for sh.bytes > c.hotCap && len(sh.hot) > 0 {
		if sh.hand >= len(sh.entries) {
			sh.hand = 0
		}
		e := &sh.entries[sh.hand]
		i := int32(sh.hand)
		sh.hand++
		if !e.used {
			continue
		}
		if e.ref {
			e.ref = false
			continue
		}
		key, val, h := e.key, e.val, e.hash
		if _, b := c.farCopy(si, e); b >= 0 {
			c.removeHot(sh, i) // clean: the far copy stands
		} else {
			c.removeHot(sh, i)
			c.demote(sh, si, 0, key, val, h)
		}
		sh.spare = val
	}
}

// demote writes an entry into tier ti, making room there first; past the
// last tier the entry is dropped. It returns the tier and record the entry
// landed in, tier -1 when it was dropped or its write failed.
func (c *Cache) demote(sh *shard, si, ti int, key string, val []byte, h uint64) (int8, alloc.Ref) {
	n := recordHeader + len(key) + len(val)
	if ti >= len(c.tiers) || n > alloc.MaxObjectSize {
		c.dropped.Add(1)
		return -1, 0
	}
	t := c.tiers[ti]
	fs := &sh.far[ti]
	slot := int64(alloc.SizeClass(n))
	for fs.count > 0 && (fs.bytes+slot > t.capBytes || fs.count >= t.capCount) {
		c.evictFar(sh, si, ti)
	}
	var r alloc.Ref
	var err error
	for {
		if r, err = t.arena.Alloc(n); err == nil || fs.count == 0 || !errors.Is(err, alloc.ErrNoCapacity) {
			break
		}
		c.evictFar(sh, si, ti) // the pool is fuller than the budget said
	}
	if err != nil {
		c.log.Warn("spillcache: tier full, entry moves on", "tier", t.level, "err", err)
		return c.demote(sh, si, ti+1, key, val, h)
	}
	if b, berr := t.arena.Bytes(r); berr == nil {
		putRecord(b, key, val)
	} else {
		if cap(sh.scratch) < n {
			sh.scratch = make([]byte, n)
		}
		putRecord(sh.scratch[:n], key, val)
		_, err = t.arena.WriteAt(r, sh.scratch[:n], 0)
	}
	if err != nil {
		t.arena.Free(r)
		c.lost.Add(1)
		c.log.Warn("spillcache: writing a far entry failed", "tier", t.level, "err", err)
		return -1, 0
	}
	t.table.insert(t.table.region(si), h, r)
	fs.count++
	fs.bytes += slot
	c.demoted.Add(1)
	return int8(ti), r
}

func putRecord(b []byte, key string, val []byte) {
	binary.LittleEndian.PutUint32(b, uint32(len(key)))
	binary.LittleEndian.PutUint32(b[4:], uint32(len(val)))
	copy(b[recordHeader:], key)
	copy(b[recordHeader+len(key):], val)
}

// evictFar runs tier ti's clock over the shard's index until it evicts one
// entry, which moves down a tier.
func (c *Cache) evictFar(sh *shard, si, ti int) {
	t := c.tiers[ti]
	reg := t.table.region(si)
	fs := &sh.far[ti]
	for range 2*t.table.buckets + 1 {
		b := fs.hand & (t.table.buckets - 1)
		w := reg[2*b]
		if w == 0 {
			fs.hand++
			continue
		}
		if w&bucketRef != 0 {
			reg[2*b] = w &^ bucketRef
			fs.hand++
			continue
		}
		r := alloc.Ref(reg[2*b+1])
		if ti+1 < len(c.tiers) {
			kb, val, err := c.readRecord(sh, t, r)
			if err != nil {
				c.loseEntry(sh, si, ti, b, err)
				return
			}
			// The record is freed below: move it through this tier's
			// buffer, reused from one eviction to the next, so the
			// cascade allocates nothing. key aliases the buffer; demote
			// only copies it into the next tier's record.
			fs.move = append(append(fs.move[:0], kb...), val...)
			key := unsafe.String(unsafe.SliceData(fs.move), len(kb))
			val = fs.move[len(kb):]
			c.dropFar(sh, si, ti, b)
			nt, nr := c.demote(sh, si, ti+1, key, val, w&hashMask)
			// A record that is a hot entry's unchanged copy stays its copy
			// where it lands: else the entry, taken for dirty, would write a
			// second record when it leaves the heap, and a Set or Delete
			// would leave the moved one behind, stale.
			if i, ok := sh.hot[key]; ok {
				if e := &sh.entries[i]; int(e.farTier) == ti && e.far == r {
					e.farTier, e.far = nt, nr
				}
			}
		} else {
			c.dropFar(sh, si, ti, b)
			c.dropped.Add(1)
		}
		return // the hand stays: remove shifted a later entry into b
	}
}

// CacheStats counts a Cache's entries and events.
type CacheStats struct {
	Entries                          [numLevels]int64     // far entries include Copies
	Copies                           int64                // hot entries whose unchanged copy is also in a spill tier
	Hits                             [numLevels + 1]int64 // by level; the last is misses
	Promoted, Demoted, Dropped, Lost int64
	FarHeld                          [2]int64 // bytes of segments each spill tier's arena holds
}

// i2s is a shard's index.
func i2s(sh *shard, c *Cache) int {
	return int((uintptr(unsafe.Pointer(sh)) - uintptr(unsafe.Pointer(&c.shards[0]))) / unsafe.Sizeof(*sh))
}

// Stats returns a snapshot.
func (c *Cache) Stats() CacheStats {
	var st CacheStats
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		st.Entries[LevelHot] += int64(len(sh.hot))
		for i := range sh.entries {
			if e := &sh.entries[i]; e.used {
				if _, b := c.farCopy(i2s(sh, c), e); b >= 0 {
					st.Copies++
				}
			}
		}
		for ti, t := range c.tiers {
			st.Entries[t.level] += int64(sh.far[ti].count)
		}
		sh.mu.Unlock()
	}
	for i := range st.Hits {
		st.Hits[i] = c.hits[i].Load()
	}
	for ti, t := range c.tiers {
		st.FarHeld[ti] = t.arena.Stats().Held
	}
	st.Promoted, st.Demoted, st.Dropped, st.Lost = c.promoted.Load(), c.demoted.Load(), c.dropped.Load(), c.lost.Load()
	return st
}
