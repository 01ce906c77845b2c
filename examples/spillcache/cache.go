package main

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
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
// collector. Each tier evicts by a clock sweep when full, demoting to the
// next tier or, at the last, dropping the entry.
//
// A far hit moves its entry up only when the admission policy lets it: a
// frequency sketch (TinyLFU's) must count the entry as used more often
// lately than the victim it would push out of the tier above (onto the
// heap: by more than admitMargin uses), so a run of
// one-off far hits does not churn the hot tier. A promoted entry keeps its
// far copy, so a clean entry that leaves the heap again is not rewritten.
// A Set of a new key puts its entry on the heap: a value just written is
// likely read. A Set of a key that is cold (it has a far record, and is
// used no more often than the hot tier's victim) keeps it where it is (a
// cxl record of the same length is overwritten in place), so writes of
// cold keys do not push hotter ones out either.
//
// No lock is held across far I/O. A Get finds an rdma record under its
// shard's lock, by the far index's hash bits, then reads it unlocked; the
// record cannot change under it (records are written once, before they
// are indexed, and an arena Ref names one record for its life: a freed
// record fails the read with alloc.ErrBadRef and the Get looks again), and
// a promotion after the read first checks that the index still names the
// record it read, so a Set or Delete meanwhile is never undone by a stale
// value. A record on its way to an rdma tier is written unlocked too: it
// is indexed once written, served from its buffer until then, and a Set
// or Delete meanwhile cancels it.
//
// A Cache is safe for concurrent use. Get copies the value out, and Set
// copies it in: the caller keeps ownership of its slices.
type Cache struct {
	seed   maphash.Seed
	shards []shard
	tiers  []*farTier // cxl then rdma, those with a budget
	hotCap int64      // per shard
	// hotSlot is the size of a slot of a shard's slab: the expected key
	// and value size, at least a value's.
	hotSlot int
	log     *slog.Logger
	bufs    sync.Pool // *[]byte of RecordBytes+recordHeader capacity, for unlocked far reads
	// The far writer: records bound for a tier without load/store access
	// wait in queue (guarded by wmu) for writeLoop, which wake wakes.
	wmu       sync.Mutex
	queue     []queued
	wake      chan struct{}
	stop      chan struct{}
	writer    sync.WaitGroup
	closeOnce sync.Once

	// farReadHook, when set (by tests), runs before each unlocked far
	// read: a far read that blocks there holds no lock.
	farReadHook func(key string)
}

// farTier is one spill tier: an arena for records and a far index.
type farTier struct {
	level     Level
	arena     *alloc.Arena
	table     *farTable
	loadStore bool  // records are read and written in place, under the shard's lock
	capBytes  int64 // per shard, in slot bytes
	capCount  int   // per shard, keeps the index below 75% full
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
	slot    int32 // val's slot in the shard's slab; -1: its own heap slice
	hash    uint64
}

type shard struct {
	mu      sync.Mutex
	hot     hotIndex // of entries
	entries []hotEntry
	holes   []int32
	hand    int
	bytes   int64
	far     [2]farShard
	freq    sketch
	n       counters
	pending []*farWrite // records being written to an rdma tier, not yet indexed
	// pendingHash holds pending[i].hash at i: a lookup scans these words
	// instead of following a pointer per record.
	pendingHash []uint64
	untaken     int         // of them, those not yet queued for the far writer
	free        []*farWrite // done ones, for reuse
	// slab holds hot values of up to hotSlot bytes, a slot each: one
	// allocation without pointers instead of an object per value, so the
	// collector has next to nothing to mark and a new entry allocates
	// nothing. freeSlots are its unused slots.
	slab      []byte
	freeSlots []int32
	_         [64]byte
}

// counters are a shard's events, atomic so that Stats and the unlocked
// part of a Get need no lock; each shard's sit on its own cache lines.
type counters struct {
	hits                             [numLevels + 1]atomic.Int64
	promoted, demoted, dropped, lost atomic.Int64
	rejected, farReads               atomic.Int64
}

type farShard struct {
	bytes int64 // slot bytes of indexed and pending records
	count int   // indexed and pending records
	hand  uint64
}

// farWrite is a record on its way to a tier without load/store access. It
// is counted in the tier's budget from the start and indexed once its
// write is done, unless cancelled meanwhile by a Set or Delete of its key
// (or its write failed): then its record is freed.
type farWrite struct {
	ti        int
	ref       alloc.Ref
	hash      uint64
	rec       []byte
	taken     bool // queued for the far writer
	cancelled bool
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
	cc.bufs.New = func() any { b := make([]byte, 0, o.RecordBytes+recordHeader); return &b }
	cc.wake, cc.stop = make(chan struct{}, 1), make(chan struct{})
	cc.writer.Add(1)
	go cc.writeLoop()
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
		ft := &farTier{level: t.level, arena: a, loadStore: t.tier != alloc.TierRDMA, capBytes: perShard, capCount: int(buckets * 3 / 4)}
		cc.tiers = append(cc.tiers, ft)
		if ft.table, err = newFarTable(c, ctx, o.Shards, buckets); err != nil {
			cc.Close(ctx)
			return nil, err
		}
	}
	// The sketch tells apart the entries the hot tier and the first spill
	// tier hold; below them a far hit only competes with the first's victims.
	hotKeys := int(cc.hotCap / int64(o.RecordBytes))
	keys := hotKeys
	if len(cc.tiers) > 0 {
		keys += cc.tiers[0].capCount
	}
	cc.hotSlot = o.RecordBytes
	for i := range cc.shards {
		sh := &cc.shards[i]
		sh.hot.init(hotKeys)
		sh.freq = newSketch(keys)
		sh.slab = make([]byte, (hotKeys+1)*cc.hotSlot)
		sh.freeSlots = make([]int32, hotKeys+1)
		for j := range sh.freeSlots {
			sh.freeSlots[j] = int32(hotKeys - j) // slot 0 is taken first
		}
	}
	return cc, nil
}

// Close writes the records queued for the far writer, stops it, and
// returns the cache's far memory to the pool. Call it once every other
// call has returned.
func (c *Cache) Close(ctx context.Context) error {
	c.closeOnce.Do(func() { close(c.stop) })
	c.writer.Wait()
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

// retries bounds how often a Get looks again for a key whose record was
// freed under its unlocked read (moved, replaced or deleted meanwhile);
// past it the Get is a miss.
const retries = 4

// GetLevel is Get that also says where the key was found.
func (c *Cache) GetLevel(dst []byte, key string) ([]byte, Level) {
	h, sh, si := c.locate(key)
	// Start the DRAM misses a cxl hit takes first, its index bucket and
	// the key's sketch block, while this Get waits for the lock and looks
	// in the hot tier.
	if len(c.tiers) > 0 && c.tiers[0].loadStore {
		c.tiers[0].table.prefetch(si, h)
	}
	sh.freq.prefetch(h)
	sh.hot.prefetch(h)
	for try := range retries {
		sh.mu.Lock()
		if try == 0 {
			sh.freq.add(h)
		}
		var l lookup
		if dst, l = c.probe(sh, si, key, h, dst); !l.far {
			c.unlock(sh, si)
			sh.n.hits[l.level].Add(1)
			return dst, l.level
		}
		sh.mu.Unlock()
		if c.farReadHook != nil {
			c.farReadHook(key)
		}
		bp := c.bufs.Get().(*[]byte)
		rec, err := c.readFar(sh, l, (*bp)[:0])
		var level Level
		var again bool
		dst, level, again = c.finishFar(sh, si, key, h, l, rec, err, dst)
		*bp = rec[:0]
		c.bufs.Put(bp)
		if !again {
			return dst, level
		}
	}
	sh.n.hits[LevelMiss].Add(1)
	return dst, LevelMiss
}

// lookup is what probe found: a hit it served (level), or a record of
// tier ti to read unlocked (far).
type lookup struct {
	level Level
	far   bool
	ti    int
	ref   alloc.Ref
	up    bool // the admission policy would move the entry up a tier
}

// probe looks key up with sh locked. It serves hot entries, records on
// their way to a tier and records of load/store tiers itself, appending
// the value to dst; a record of another tier it returns to be read
// unlocked: the first whose index bucket has the key's hash bits, which
// stand in for a fingerprint of the key (62 bits, about 6 of them fixed by
// the shard: two keys of a shard share them once in some 2^56 pairs, and
// then the Get of the one indexed later misses).
func (c *Cache) probe(sh *shard, si int, key string, h uint64, dst []byte) ([]byte, lookup) {
	if i, ok := sh.hot.get(sh.entries, h, key); ok {
		e := &sh.entries[i]
		e.ref = true
		return append(dst, e.val...), lookup{level: LevelHot}
	}
	for i, ph := range sh.pendingHash {
		if w := sh.pending[i]; sameHash(ph, h) && !w.cancelled {
			if k, v, ok := parseRecord(w.rec); ok && string(k) == key {
				return append(dst, v...), lookup{level: c.tiers[w.ti].level}
			}
		}
	}
	for ti, t := range c.tiers {
		reg := t.table.region(si)
		if !t.loadStore {
			b := t.table.find(reg, h, func(alloc.Ref) bool { return true })
			if b < 0 {
				continue
			}
			reg[2*b] |= bucketRef
			r := alloc.Ref(reg[2*b+1])
			n, err := t.arena.Len(r)
			if err != nil {
				c.loseEntry(sh, si, ti, uint64(b), err)
				continue
			}
			return dst, lookup{level: t.level, far: true, ti: ti, ref: r, up: c.wantsUp(sh, si, ti, h, n)}
		}
		var val []byte
		var ferr error
		b := t.table.find(reg, h, func(r alloc.Ref) bool {
			var k []byte
			k, val, _, ferr = c.mappedRecord(t, r, true)
			return ferr != nil || string(k) == key
		})
		if b < 0 {
			continue
		}
		if ferr != nil {
			c.loseEntry(sh, si, ti, uint64(b), ferr)
			continue
		}
		reg[2*b] |= bucketRef
		start := len(dst)
		dst = append(dst, val...)
		c.promote(sh, si, ti, uint64(b), key, dst[start:], h)
		return dst, lookup{level: t.level}
	}
	return dst, lookup{level: LevelMiss}
}

// readFar reads the record l names into buf's spare capacity, unlocked.
func (c *Cache) readFar(sh *shard, l lookup, buf []byte) ([]byte, error) {
	a := c.tiers[l.ti].arena
	n, err := a.Len(l.ref)
	if err != nil {
		return buf, err
	}
	buf = slices.Grow(buf, n)[:n]
	sh.n.farReads.Add(1)
	_, err = a.ReadAt(l.ref, buf, 0)
	return buf, err
}

// finishFar takes the outcome of an unlocked read of the record l names:
// it appends the value to dst and, when the admission policy said so and
// the index still names the record, promotes the entry. It returns the
// level the key was found at; again says the record was freed under the
// read and the key is to be looked up again.
func (c *Cache) finishFar(sh *shard, si int, key string, h uint64, l lookup, rec []byte, err error, dst []byte) ([]byte, Level, bool) {
	if errors.Is(err, alloc.ErrBadRef) {
		return dst, LevelMiss, true
	}
	if err != nil {
		sh.mu.Lock()
		b := c.bucketOf(si, l.ti, h, l.ref)
		if b >= 0 {
			c.loseEntry(sh, si, l.ti, uint64(b), err)
		}
		sh.mu.Unlock()
		if b < 0 {
			return dst, LevelMiss, true // the record moved on under the read
		}
		sh.n.hits[LevelMiss].Add(1)
		return dst, LevelMiss, false
	}
	k, val, ok := parseRecord(rec)
	if !ok || string(k) != key {
		sh.n.hits[LevelMiss].Add(1)
		return dst, LevelMiss, false
	}
	sh.n.hits[l.level].Add(1)
	start := len(dst)
	dst = append(dst, val...)
	if !l.up {
		sh.n.rejected.Add(1)
		return dst, l.level, false
	}
	sh.mu.Lock()
	// Another Get of the key may have promoted it meanwhile, keeping the
	// record as its far copy: the key is then hot already.
	if _, hot := sh.hot.get(sh.entries, h, key); !hot {
		if b := c.bucketOf(si, l.ti, h, l.ref); b >= 0 {
			c.promote(sh, si, l.ti, uint64(b), key, dst[start:], h)
		}
	}
	c.unlock(sh, si)
	return dst, l.level, false
}

// bucketOf returns the bucket of tier ti that indexes record r, or -1.
func (c *Cache) bucketOf(si, ti int, h uint64, r alloc.Ref) int {
	t := c.tiers[ti]
	return t.table.find(t.table.region(si), h, func(x alloc.Ref) bool { return x == r })
}

// GetReq is one key of a GetMany: GetMany appends the key's value to Val
// and sets Level (LevelMiss: not found).
type GetReq struct {
	Key   string
	Val   []byte
	Level Level
}

// GetMany looks up many keys at once: what Get serves under a shard's
// lock it serves the same way, and the rdma records of all the others it
// reads in one alloc.Arena.GetMany, about one round trip for the batch.
func (c *Cache) GetMany(reqs []GetReq) {
	for len(reqs) > alloc.MaxBatch {
		c.GetMany(reqs[:alloc.MaxBatch])
		reqs = reqs[alloc.MaxBatch:]
	}
	type farReq struct {
		i int
		h uint64
		l lookup
	}
	var far []farReq
	for i := range reqs {
		r := &reqs[i]
		h, sh, si := c.locate(r.Key)
		sh.mu.Lock()
		sh.freq.add(h)
		var l lookup
		if r.Val, l = c.probe(sh, si, r.Key, h, r.Val); l.far {
			sh.mu.Unlock()
			far = append(far, farReq{i, h, l})
			continue
		}
		c.unlock(sh, si)
		sh.n.hits[l.level].Add(1)
		r.Level = l.level
	}
	for ti, t := range c.tiers {
		var gets []alloc.ArenaGet
		var which []farReq
		for _, f := range far {
			if f.l.ti == ti {
				bp := c.bufs.Get().(*[]byte)
				gets = append(gets, alloc.ArenaGet{Ref: f.l.ref, Buf: (*bp)[:0]})
				which = append(which, f)
			}
		}
		if len(gets) == 0 {
			continue
		}
		_ = t.arena.GetMany(context.Background(), gets) // each entry's Err is its outcome
		for j, f := range which {
			r := &reqs[f.i]
			_, sh, si := c.locate(r.Key)
			sh.n.farReads.Add(1)
			var again bool
			if r.Val, r.Level, again = c.finishFar(sh, si, r.Key, f.h, f.l, gets[j].Buf, gets[j].Err, r.Val); again {
				r.Val, r.Level = c.GetLevel(r.Val, r.Key)
			}
			if rec := gets[j].Buf[:0]; cap(rec) > 0 {
				c.bufs.Put(&rec)
			}
		}
	}
}

// mappedRecord returns the key, value and whole record of a record on a
// load/store tier, aliasing far memory: valid while the shard's lock is
// held. It reads the record's slot as the arena's SlotBytes gives it, by
// the record's own header and without the arena's metadata, which would
// be one more DRAM miss in turn before the record's: a record is freed
// only under its shard's lock, so the Ref the index names under that lock
// is live. whole says the caller reads the value too: the misses of all
// the slot's lines then start at once, not one after another as the copy
// walks it.
func (c *Cache) mappedRecord(t *farTier, r alloc.Ref, whole bool) (key, val, rec []byte, err error) {
	slot, err := t.arena.SlotBytes(r)
	if err != nil {
		return nil, nil, nil, err
	}
	if whole && len(slot) > 0 {
		prefetchLines(uintptr(unsafe.Pointer(&slot[0])), uintptr(len(slot)))
	}
	if len(slot) >= recordHeader {
		kl, vl := binary.LittleEndian.Uint32(slot), binary.LittleEndian.Uint32(slot[4:])
		if n := uint64(kl) + uint64(vl) + recordHeader; n <= uint64(len(slot)) {
			rec = slot[:n:n]
		}
	}
	k, v, ok := parseRecord(rec)
	if !ok {
		return nil, nil, nil, fmt.Errorf("far record %v in a %d-byte slot: its header does not fit the slot", r, len(slot))
	}
	return k, v, rec, nil
}

// parseRecord splits a record into key and value; ok is false when its
// header does not match its length.
func parseRecord(rec []byte) (key, val []byte, ok bool) {
	if len(rec) < recordHeader {
		return nil, nil, false
	}
	kl, vl := binary.LittleEndian.Uint32(rec), binary.LittleEndian.Uint32(rec[4:])
	if int(kl)+int(vl)+recordHeader != len(rec) {
		return nil, nil, false
	}
	return rec[recordHeader : recordHeader+kl], rec[recordHeader+kl:], true
}

// wantsUp says whether the admission policy moves the entry of hash h and
// record length n, hit in tier ti, up: to the heap, or to the tier above.
func (c *Cache) wantsUp(sh *shard, si, ti int, h uint64, n int) bool {
	return c.admitHot(sh, h, n-recordHeader) || (ti > 0 && c.admitFar(sh, si, ti-1, h, n))
}

// admitHot says whether an entry of hash h and n bytes of key and value is
// to enter the heap: there is room, or it is used more often than the hot
// tier's clock victim.
func (c *Cache) admitHot(sh *shard, h uint64, n int) bool {
	if sh.bytes+int64(n) <= c.hotCap {
		return true
	}
	est := sh.freq.estimate(h)
	if est <= admitMargin {
		return false // it beats no victim: spare the clock and the victim's misses
	}
	i, ok := c.hotVictim(sh)
	return !ok || est > sh.freq.estimate(sh.entries[i].hash)+admitMargin
}

// admitMargin is how many more uses than the hot tier's victim a far
// entry needs to replace it: estimates of keys used a few times apart
// are noise, and each exchange costs a copy onto the heap and a demotion.
const admitMargin = 1

// admitFar says the same of spill tier ti and a record of n bytes.
func (c *Cache) admitFar(sh *shard, si, ti int, h uint64, n int) bool {
	t, fs := c.tiers[ti], &sh.far[ti]
	if fs.count < t.capCount && fs.bytes+int64(alloc.SizeClass(n)) <= t.capBytes {
		return true
	}
	b, ok := c.farVictim(sh, si, ti)
	return !ok || sh.freq.estimate(h) > sh.freq.estimate(t.table.region(si)[2*b])
}

// promote moves the entry of bucket b of tier ti, whose value is val (not
// aliasing far memory), up as far as the admission policy lets it: to the
// heap, keeping its record as the hot entry's far copy, else to the tier
// above, freeing its record; or leaves it where it is.
func (c *Cache) promote(sh *shard, si, ti int, b uint64, key string, val []byte, h uint64) {
	switch {
	case c.admitHot(sh, h, len(key)+len(val)):
		sh.n.promoted.Add(1)
		c.putHot(sh, si, key, val, h, alloc.Ref(c.tiers[ti].table.region(si)[2*b+1]), int8(ti))
	case ti > 0 && c.admitFar(sh, si, ti-1, h, recordHeader+len(key)+len(val)):
		sh.n.promoted.Add(1)
		c.dropFar(sh, si, ti, b)
		c.demote(sh, si, ti-1, key, val, h)
	default:
		sh.n.rejected.Add(1)
	}
}

// maxQueued bounds the records queued for the far writer: past it the
// goroutine that queued one writes its own before it returns, so a tier
// slower than the demotions slows them down rather than heaping up
// buffers.
const maxQueued = 4 * alloc.MaxBatch

// maxWriteBatch bounds the records the far writer puts in one
// Arena.PutMany: enough to share round trips, few enough that the
// batches' working memory stays small.
const maxWriteBatch = 128

// queued is a record queued for the far writer, and its shard.
type queued struct {
	si int
	w  *farWrite
}

// unlock releases sh's lock and queues the records bound for a tier
// without load/store access for the far writer, which writes them
// unlocked and in batches, so a Get does not wait for the write of the
// entry its promotion pushed down.
func (c *Cache) unlock(sh *shard, si int) {
	if sh.untaken == 0 {
		sh.mu.Unlock()
		return
	}
	var own []queued
	c.wmu.Lock()
	inline := len(c.queue) >= maxQueued
	for _, w := range sh.pending {
		if !w.taken {
			w.taken = true
			if inline {
				own = append(own, queued{si, w})
			} else {
				c.queue = append(c.queue, queued{si, w})
			}
		}
	}
	c.wmu.Unlock()
	sh.untaken = 0
	sh.mu.Unlock()
	if inline {
		c.writeAll(own)
		return
	}
	select {
	case c.wake <- struct{}{}:
	default: // the writer is awake already
	}
}

// writeLoop is the far writer: it writes what unlock queues until Close.
func (c *Cache) writeLoop() {
	defer c.writer.Done()
	var batch []queued
	for {
		var stop bool
		select {
		case <-c.wake:
		case <-c.stop:
			stop = true
		}
		for {
			c.wmu.Lock()
			batch, c.queue = c.queue, batch[:0]
			c.wmu.Unlock()
			if len(batch) == 0 {
				break
			}
			c.writeAll(batch)
		}
		if stop {
			return
		}
	}
}

// writeAll writes records to their tiers in batches of at most
// maxWriteBatch (writeOut), and indexes them.
func (c *Cache) writeAll(qs []queued) {
	for len(qs) > 0 {
		n := min(len(qs), maxWriteBatch)
		c.writeOut(qs[:n])
		qs = qs[n:]
	}
}

// writeOut writes records to their tier, one arena batch per tier, and
// indexes them.
func (c *Cache) writeOut(qs []queued) {
	pb := putBatches.Get().(*putBatch)
	defer putBatches.Put(pb)
	for ti, t := range c.tiers {
		puts, which := pb.puts[:0], pb.which[:0]
		for _, q := range qs {
			if q.w.ti == ti {
				puts = append(puts, alloc.ArenaPut{Ref: q.w.ref, Buf: q.w.rec})
				which = append(which, q)
			}
		}
		if len(puts) == 0 {
			continue
		}
		_ = t.arena.PutMany(context.Background(), puts) // each entry's Err is its outcome
		for j, q := range which {
			sh := &c.shards[q.si]
			sh.mu.Lock()
			c.written(sh, q.si, q.w, puts[j].Err)
			sh.mu.Unlock()
		}
		clear(puts)
		clear(which)
		pb.puts, pb.which = puts[:0], which[:0]
	}
}

// putBatch is writeOut's working memory, reused through putBatches: the
// far writer leaves no garbage behind.
type putBatch struct {
	puts  []alloc.ArenaPut
	which []queued
}

var putBatches = sync.Pool{New: func() any { return new(putBatch) }}

// written indexes a record whose write is done, or frees it when it was
// cancelled or its write failed.
func (c *Cache) written(sh *shard, si int, w *farWrite, err error) {
	i, last := slices.Index(sh.pending, w), len(sh.pending)-1
	sh.pending[i], sh.pendingHash[i] = sh.pending[last], sh.pendingHash[last]
	sh.pending[last] = nil
	sh.pending, sh.pendingHash = sh.pending[:last], sh.pendingHash[:last]
	t := c.tiers[w.ti]
	switch {
	case w.cancelled:
		_ = t.arena.Free(w.ref) // cancel took it off the budget
	case err != nil:
		sh.n.lost.Add(1)
		c.log.Warn("spillcache: writing a far entry failed", "tier", t.level, "err", err)
		if k, _, ok := parseRecord(w.rec); ok {
			if j, hot := sh.hot.get(sh.entries, w.hash, string(k)); hot && sh.entries[j].far == w.ref {
				sh.entries[j].farTier = -1
			}
		}
		c.release(sh, w.ti, w.ref)
	default:
		t.table.insert(t.table.region(si), w.hash, w.ref)
	}
	*w = farWrite{rec: w.rec[:0]}
	sh.free = append(sh.free, w)
}

// cancel marks a queued record stale (a Set or Delete of its key came
// after it) and takes it off its tier's budget at once; written frees it.
func (c *Cache) cancel(sh *shard, w *farWrite) {
	if w.cancelled {
		return
	}
	w.cancelled = true
	fs := &sh.far[w.ti]
	fs.count--
	fs.bytes -= int64(alloc.SizeClass(len(w.rec)))
}

// loseEntry forgets an entry whose far memory failed (its host died, say):
// a miss, counted and logged, never a crash.
func (c *Cache) loseEntry(sh *shard, si, ti int, b uint64, err error) {
	sh.n.lost.Add(1)
	c.log.Warn("spillcache: far entry lost", "tier", c.tiers[ti].level, "err", err)
	c.dropFar(sh, si, ti, b)
}

// dropFar removes bucket b of tier ti and frees its record.
func (c *Cache) dropFar(sh *shard, si, ti int, b uint64) {
	t := c.tiers[ti]
	reg := t.table.region(si)
	r := alloc.Ref(reg[2*b+1])
	t.table.remove(reg, b)
	c.release(sh, ti, r)
}

// release frees record r of tier ti and takes it off the tier's budget.
func (c *Cache) release(sh *shard, ti int, r alloc.Ref) {
	fs := &sh.far[ti]
	fs.count--
	if n, err := c.tiers[ti].arena.Len(r); err == nil {
		fs.bytes -= int64(alloc.SizeClass(n))
	}
	_ = c.tiers[ti].arena.Free(r) // a lost record's Free fails; it is forgotten either way
}

// Set stores a copy of val under key.
func (c *Cache) Set(key string, val []byte) {
	h, sh, si := c.locate(key)
	sh.mu.Lock()
	sh.freq.add(h)
	if i, ok := sh.hot.get(sh.entries, h, key); ok {
		e := &sh.entries[i]
		c.dropFarCopy(sh, si, e)
		sh.bytes += int64(len(val) - len(e.val))
		if len(val) > cap(e.val) || e.slot < 0 && cap(e.val) > 2*len(val) {
			// It does not fit, or a slice of its own would hold more
			// than twice what the hot budget counts for it.
			c.freeSlot(sh, e.slot)
			e.val, e.slot = c.hotBuf(sh, len(val))
		}
		e.val = append(e.val[:0], val...)
		e.ref = true
		c.evictHot(sh, si)
	} else if len(c.tiers) == 0 || c.admitHot(sh, h, len(key)+len(val)) || !c.setFar(sh, si, key, val, h) {
		c.deleteFar(sh, si, h, key, 0)
		c.putHot(sh, si, key, val, h, 0, -1)
	}
	c.unlock(sh, si)
}

// setFar stores a Set's entry where the key's far record is, for a key
// the admission policy keeps off the heap (used no more often than the hot
// tier's victim): a key set again while it is cold does not push a hotter
// one out. A record of the same length on a load/store tier is overwritten
// where it is; else the entry is written to its record's tier, or the tier
// above when it is used more often than that tier's victim. It reports
// false when the entry is to go to the heap after all: the key has no far
// record (a new key goes to the heap, as a hit would), or no tier took it.
func (c *Cache) setFar(sh *shard, si int, key string, val []byte, h uint64) bool {
	for ti, t := range c.tiers {
		reg := t.table.region(si)
		var rec []byte
		b := t.table.find(reg, h, func(r alloc.Ref) bool {
			if !t.loadStore {
				return true // the hash bits stand for the key, as in deleteFar
			}
			k, _, whole, err := c.mappedRecord(t, r, false)
			if err == nil && string(k) == key {
				rec = whole
			}
			return err == nil && string(k) == key
		})
		if b < 0 {
			continue
		}
		n := recordHeader + len(key) + len(val)
		if len(rec) == n {
			putRecord(rec, key, val)
			reg[2*b] |= bucketRef
			c.deleteFar(sh, si, h, key, ti+1)
			return true
		}
		if ti > 0 && c.admitFar(sh, si, ti-1, h, n) {
			ti--
		}
		c.deleteFar(sh, si, h, key, 0)
		nt, _ := c.demote(sh, si, ti, key, val, h)
		return nt >= 0
	}
	return false
}

// Delete removes key.
func (c *Cache) Delete(key string) {
	h, sh, si := c.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if i, ok := sh.hot.get(sh.entries, h, key); ok {
		c.dropFarCopy(sh, si, &sh.entries[i])
		c.freeSlot(sh, c.removeHot(sh, i))
		return
	}
	c.deleteFar(sh, si, h, key, 0)
}

// farCopy reports whether a hot entry's far copy is still indexed or on
// its way (the far tier may have evicted it since).
func (c *Cache) farCopy(sh *shard, si int, e *hotEntry) bool {
	if e.farTier < 0 {
		return false
	}
	if c.bucketOf(si, int(e.farTier), e.hash, e.far) >= 0 {
		return true
	}
	return slices.ContainsFunc(sh.pending, func(w *farWrite) bool { return w.ref == e.far && !w.cancelled })
}

// dropFarCopy frees a hot entry's far copy, which a Set makes stale.
func (c *Cache) dropFarCopy(sh *shard, si int, e *hotEntry) {
	if e.farTier >= 0 {
		if b := c.bucketOf(si, int(e.farTier), e.hash, e.far); b >= 0 {
			c.dropFar(sh, si, int(e.farTier), uint64(b))
		}
		for _, w := range sh.pending {
			if w.ref == e.far {
				c.cancel(sh, w)
			}
		}
	}
	e.farTier = -1
}

// deleteFar removes every far record of key in tiers from on, and its
// records on their way to a tier. A record of a load/store tier
// is checked to be key's; one of an rdma tier is taken to be key's when
// its bucket has key's hash bits, so a Set or Delete reads nothing remote
// (the rare other key sharing them is evicted).
func (c *Cache) deleteFar(sh *shard, si int, h uint64, key string, from int) {
	for i, ph := range sh.pendingHash {
		if !sameHash(ph, h) {
			continue
		}
		w := sh.pending[i]
		if k, _, ok := parseRecord(w.rec); ok && string(k) == key {
			c.cancel(sh, w)
		}
	}
	for ti, t := range c.tiers[from:] {
		ti += from
		reg := t.table.region(si)
		for {
			b := t.table.find(reg, h, func(r alloc.Ref) bool {
				if !t.loadStore {
					return true
				}
				k, _, _, err := c.mappedRecord(t, r, false)
				return err != nil || string(k) == key
			})
			if b < 0 {
				break
			}
			c.dropFar(sh, si, ti, uint64(b))
		}
	}
}

// removeHot removes hot entry i and returns its value's slot, which the
// caller frees once done with the value.
func (c *Cache) removeHot(sh *shard, i int32) int32 {
	e := &sh.entries[i]
	slot := e.slot
	sh.hot.del(sh.entries, e.hash, i)
	sh.bytes -= int64(len(e.key) + len(e.val))
	*e = hotEntry{}
	sh.holes = append(sh.holes, i)
	return slot
}

// hotBuf returns an empty buffer for a value of n bytes: a free slot of
// the shard's slab where n fits one, else a slice of its own (slot -1).
func (c *Cache) hotBuf(sh *shard, n int) ([]byte, int32) {
	if k := len(sh.freeSlots); n <= c.hotSlot && k > 0 {
		slot := sh.freeSlots[k-1]
		sh.freeSlots = sh.freeSlots[:k-1]
		off := int(slot) * c.hotSlot
		return sh.slab[off : off : off+c.hotSlot], slot
	}
	return make([]byte, 0, n), -1
}

// freeSlot returns a slot of the shard's slab to its free list (-1: no slot).
func (c *Cache) freeSlot(sh *shard, slot int32) {
	if slot >= 0 {
		sh.freeSlots = append(sh.freeSlots, slot)
	}
}

// putHot adds a new hot entry (copying val) and evicts to the budget. far
// and farTier name an unchanged far copy (farTier -1: none).
func (c *Cache) putHot(sh *shard, si int, key string, val []byte, h uint64, far alloc.Ref, farTier int8) {
	buf, slot := c.hotBuf(sh, len(val))
	e := hotEntry{key: key, val: append(buf, val...), used: true, hash: h, far: far, farTier: farTier, slot: slot}
	var i int32
	if n := len(sh.holes); n > 0 {
		i = sh.holes[n-1]
		sh.holes = sh.holes[:n-1]
		sh.entries[i] = e
	} else {
		i = int32(len(sh.entries))
		sh.entries = append(sh.entries, e)
	}
	sh.hot.put(sh.entries, h, i)
	sh.bytes += int64(len(key) + len(val))
	c.evictHot(sh, si)
}

// hotVictim runs the hot tier's clock to the next entry not referenced
// since the hand last passed it, clearing the references it passes, and
// returns it; the hand stays on it.
func (c *Cache) hotVictim(sh *shard) (int, bool) {
	for range 2 * len(sh.entries) {
		if sh.hand >= len(sh.entries) {
			sh.hand = 0
		}
		e := &sh.entries[sh.hand]
		if e.used && !e.ref {
			return sh.hand, true
		}
		e.ref = false
		sh.hand++
	}
	return 0, false
}

// evictHot evicts clock victims until the shard fits its budget, demoting
// them to the first spill tier.
func (c *Cache) evictHot(sh *shard, si int) {
	for sh.bytes > c.hotCap && sh.hot.n > 0 {
		i, ok := c.hotVictim(sh)
		if !ok {
			return
		}
		sh.hand++
		e := &sh.entries[i]
		key, val, h, clean := e.key, e.val, e.hash, c.farCopy(sh, si, e)
		slot := c.removeHot(sh, int32(i))
		if !clean {
			c.demote(sh, si, 0, key, val, h)
		}
		c.freeSlot(sh, slot) // demote copied the value out
	}
}

// demote writes an entry into tier ti, making room there first; past the
// last tier the entry is dropped. It returns the tier and record the entry
// landed in, tier -1 when it was dropped or its write failed. On a tier
// without load/store access the record is only queued for unlock to write.
func (c *Cache) demote(sh *shard, si, ti int, key string, val []byte, h uint64) (int8, alloc.Ref) {
	n := recordHeader + len(key) + len(val)
	if ti >= len(c.tiers) || n > alloc.MaxObjectSize {
		sh.n.dropped.Add(1)
		return -1, 0
	}
	t := c.tiers[ti]
	fs := &sh.far[ti]
	slot := int64(alloc.SizeClass(n))
	for fs.count > 0 && (fs.bytes+slot > t.capBytes || fs.count >= t.capCount) && c.evictFar(sh, si, ti) {
	}
	if fs.bytes+slot > t.capBytes || fs.count >= t.capCount {
		// Nothing indexed is left to evict: records on their way to the
		// tier hold its budget. The entry moves on, so that the tier's
		// index never holds more than its capacity.
		return c.demote(sh, si, ti+1, key, val, h)
	}
	var r alloc.Ref
	var err error
	for {
		if r, err = t.arena.Alloc(n); err == nil || !errors.Is(err, alloc.ErrNoCapacity) || !c.evictFar(sh, si, ti) {
			break // evicted nothing: the pool is fuller than the budget said
		}
	}
	if err != nil {
		c.log.Warn("spillcache: tier full, entry moves on", "tier", t.level, "err", err)
		return c.demote(sh, si, ti+1, key, val, h)
	}
	fs.count++
	fs.bytes += slot
	sh.n.demoted.Add(1)
	if !t.loadStore {
		w := c.newWrite(sh)
		w.ti, w.ref, w.hash = ti, r, h
		w.rec = slices.Grow(w.rec[:0], n)[:n]
		putRecord(w.rec, key, val)
		sh.pending, sh.pendingHash = append(sh.pending, w), append(sh.pendingHash, h)
		sh.untaken++
		return int8(ti), r
	}
	b, err := t.arena.Bytes(r)
	if err != nil {
		c.release(sh, ti, r)
		sh.n.lost.Add(1)
		c.log.Warn("spillcache: a load/store tier's record has no mapping", "tier", t.level, "err", err)
		return -1, 0
	}
	putRecord(b, key, val)
	t.table.insert(t.table.region(si), h, r)
	return int8(ti), r
}

func (c *Cache) newWrite(sh *shard) *farWrite {
	if n := len(sh.free); n > 0 {
		w := sh.free[n-1]
		sh.free = sh.free[:n-1]
		return w
	}
	return &farWrite{}
}

func putRecord(b []byte, key string, val []byte) {
	binary.LittleEndian.PutUint32(b, uint32(len(key)))
	binary.LittleEndian.PutUint32(b[4:], uint32(len(val)))
	copy(b[recordHeader:], key)
	copy(b[recordHeader+len(key):], val)
}

// farVictim runs tier ti's clock over the shard's index to the next entry
// not referenced since the hand last passed it, clearing the references it
// passes, and returns its bucket; the hand stays on it.
func (c *Cache) farVictim(sh *shard, si, ti int) (uint64, bool) {
	t := c.tiers[ti]
	reg := t.table.region(si)
	fs := &sh.far[ti]
	for range 2*t.table.buckets + 1 {
		b := fs.hand & (t.table.buckets - 1)
		if w := reg[2*b]; w != 0 && w&bucketRef == 0 {
			return b, true
		}
		reg[2*b] &^= bucketRef
		fs.hand++
	}
	return 0, false
}

// evictFar evicts tier ti's clock victim, which moves down a tier (a
// record of a tier without load/store access, which the shard's lock does
// not cover reading, is dropped instead). It reports whether it evicted.
func (c *Cache) evictFar(sh *shard, si, ti int) bool {
	b, ok := c.farVictim(sh, si, ti)
	if !ok {
		return false
	}
	t := c.tiers[ti]
	reg := t.table.region(si)
	w, r := reg[2*b], alloc.Ref(reg[2*b+1])
	rec, err := t.arena.Bytes(r)
	if ti+1 >= len(c.tiers) || errors.Is(err, alloc.ErrNotSupported) {
		c.dropFar(sh, si, ti, b)
		sh.n.dropped.Add(1)
		return true
	}
	k, val, ok := parseRecord(rec)
	if err != nil || !ok {
		c.loseEntry(sh, si, ti, b, fmt.Errorf("far record %v: %w", r, cmp.Or(err, errors.New("its header does not match its length"))))
		return true
	}
	// key aliases the record, which demote copies into the next tier
	// before dropFar frees it.
	key := unsafe.String(unsafe.SliceData(k), len(k))
	nt, nr := c.demote(sh, si, ti+1, key, val, w&hashMask)
	// A record that is a hot entry's unchanged copy stays its copy where
	// it lands: else the entry, taken for dirty, would write a second
	// record when it leaves the heap, and a Set or Delete would leave the
	// moved one behind, stale.
	if i, ok := sh.hot.get(sh.entries, w&hashMask, key); ok {
		if e := &sh.entries[i]; int(e.farTier) == ti && e.far == r {
			e.farTier, e.far = nt, nr
		}
	}
	c.dropFar(sh, si, ti, b) // the hand stays: remove shifted a later entry into b
	return true
}

// CacheStats counts a Cache's entries and events.
type CacheStats struct {
	Entries                          [numLevels]int64     // far entries include Copies
	Copies                           int64                // hot entries whose unchanged copy is also in a spill tier
	Hits                             [numLevels + 1]int64 // by level; the last is misses
	Promoted, Demoted, Dropped, Lost int64
	// Rejected counts far hits the admission policy left where they were.
	Rejected int64
	// FarReads counts records read from tiers without load/store access:
	// a probe reads one only where the index has the key's hash bits.
	FarReads int64
	FarHeld  [2]int64 // bytes of segments each spill tier's arena holds
}

// Stats returns a snapshot.
func (c *Cache) Stats() CacheStats {
	var st CacheStats
	for si := range c.shards {
		sh := &c.shards[si]
		sh.mu.Lock()
		st.Entries[LevelHot] += int64(sh.hot.n)
		for i := range sh.entries {
			if e := &sh.entries[i]; e.used {
				if c.farCopy(sh, si, e) {
					st.Copies++
				}
			}
		}
		for ti, t := range c.tiers {
			st.Entries[t.level] += int64(sh.far[ti].count)
		}
		sh.mu.Unlock()
	}
	for si := range c.shards {
		n := &c.shards[si].n
		for i := range st.Hits {
			st.Hits[i] += n.hits[i].Load()
		}
		st.Promoted += n.promoted.Load()
		st.Demoted += n.demoted.Load()
		st.Dropped += n.dropped.Load()
		st.Lost += n.lost.Load()
		st.Rejected += n.rejected.Load()
		st.FarReads += n.farReads.Load()
	}
	for ti, t := range c.tiers {
		st.FarHeld[ti] = t.arena.Stats().Held
	}
	return st
}
