package alloc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Ref is a handle to an object in an Arena: a plain integer, so a data
// structure of Refs holds no Go pointers and costs the garbage collector
// nothing to scan. The zero Ref is never valid.
//
// Layout, high bits first:
//
//	| generation 16 | arena 8 | slab 24 | slot 16 |
//
// The generation of a slot is odd while the slot is allocated and goes up
// by one on every Alloc and Free, so a Ref that was freed fails its check.
// A stale Ref is missed only if its slot was reused exactly a multiple of
// 32768 times since; a Ref of another arena is refused by the arena field
// (distinct for the first 256 arenas of a process).
type Ref uint64

func makeRef(gen uint16, tag uint8, slab uint32, slot uint16) Ref {
	return Ref(gen)<<48 | Ref(tag)<<40 | Ref(slab)<<16 | Ref(slot)
}

func (r Ref) gen() uint16  { return uint16(r >> 48) }
func (r Ref) tag() uint8   { return uint8(r >> 40) }
func (r Ref) slab() uint32 { return uint32(r>>16) & (1<<24 - 1) }
func (r Ref) slot() uint16 { return uint16(r) }

// String shows the Ref's fields, for logs.
func (r Ref) String() string {
	return fmt.Sprintf("ref(arena=%d slab=%d slot=%d gen=%d)", r.tag(), r.slab(), r.slot(), r.gen())
}

const (
	pageShift     = 20 // slabs are carved from segments in 1 MiB pages
	pageSize      = 1 << pageShift
	maxSegPages   = 64 // a segment's page bitmap is one uint64
	minSlabSlots  = 8  // large classes get slabs of several pages
	slabChunkBits = 12
	slabChunkLen  = 1 << slabChunkBits
	slabDirLen    = 1 << (24 - slabChunkBits)
	growTimeout   = 30 * time.Second
)

// arenaTags numbers the arenas of the process, for Ref's arena field.
var arenaTags atomic.Uint32

// ArenaOption configures NewArena. Options are immutable values, safe to share.
type ArenaOption func(*arenaOptions)

type arenaOptions struct {
	tier     Tier
	fallback []Tier
	segSize  int64
	limit    int64
}

// ArenaTier is the tier the arena's segments come from. Default: TierAny.
func ArenaTier(t Tier) ArenaOption { return func(o *arenaOptions) { o.tier = t } }

// ArenaFallback lists tiers to take segments from, in order, when the
// arena's tier is full (see WithFallback). Default: none.
func ArenaFallback(tiers ...Tier) ArenaOption {
	return func(o *arenaOptions) { o.fallback = append(o.fallback, tiers...) }
}

// ArenaSegmentSize is the size of the segments the arena allocates from the
// pool as it grows: a multiple of 1 MiB from 1 MiB to 64 MiB. Default: 64 MiB.
// Objects above 128 KiB need slabs of up to 8 MiB; a smaller segment size
// gives them fewer slots per slab.
func ArenaSegmentSize(n int64) ArenaOption { return func(o *arenaOptions) { o.segSize = n } }

// ArenaLimit caps the bytes of segments the arena holds; Alloc returns
// ErrNoCapacity beyond it. Default: 0, no cap but the pool's.
func ArenaLimit(n int64) ArenaOption { return func(o *arenaOptions) { o.limit = n } }

// Arena places many small objects (1 byte to MaxObjectSize) in far-memory
// segments, in size classes, and names them by Ref instead of pointer. It
// allocates segments from the pool as it grows, carves them into slabs of
// one size class, and returns a segment to the pool when none of its slabs
// is in use (keeping one empty segment in reserve; Trim returns that too).
//
// Alloc and Free touch only process memory: the daemon is asked for a new
// segment once per segment-size of growth. Metadata is kept in flat,
// pointer-free arrays per slab (6 bytes per slot), so the garbage collector's
// work grows with the number of slabs, not of objects.
//
// An Arena is safe for concurrent use. Alloc takes the first of several
// shards (each with its own lock and slabs) that no other goroutine holds,
// so goroutines allocating at once rarely wait; Free goes to the shard that
// owns the object's slab.
// Reading an object while another goroutine frees it returns an error or the
// object's old bytes, never another object's; writing to an object while it
// is freed is the caller's race, as with any allocator.
type Arena struct {
	c    *Client
	opts arenaOptions
	tag  uint8

	shards []arenaShard
	mask   uint32

	dir [slabDirLen]atomic.Pointer[slabChunk]

	mu       sync.Mutex // guards the fields below and slab/segment creation
	segs     []*arenaSeg
	freeIDs  []uint32
	nextID   uint32
	held     int64
	empty    int // segments with no slab
	slabs    map[Tier]int
	segTiers map[Tier]int
	heldTier map[Tier]int64
	closed   atomic.Bool
}

type slabChunk [slabChunkLen]atomic.Pointer[slab]

// arenaSeg is one segment of an arena and the pages its slabs occupy.
type arenaSeg struct {
	seg    *Segment
	tier   Tier
	pages  uint64 // bitmap of pages in use; guarded by Arena.mu
	npages int
}

// slab is a run of pages holding the objects of one size class. Its fields
// are fixed at creation except meta (read and written atomically) and the
// fields guarded by its shard's lock.
type slab struct {
	id        uint32
	seg       *arenaSeg
	base      int64  // offset of the slab in its segment
	mem       []byte // the slab's memory on load/store tiers, else nil
	size      uint32 // slot size
	nslots    uint32
	class     uint8
	shard     uint16
	firstPage int
	npages    int
	// meta holds each slot's generation<<16 | (size - requested length).
	meta []uint32

	// Guarded by arenaShard.mu.
	free       []uint16 // stack of free slots
	released   bool
	onList     bool
	prev, next *slab // the class's list of partly used slabs
}

type classList struct {
	cur     *slab // where Alloc takes slots
	partial *slab // slabs with free slots other than cur
}

type arenaShard struct {
	mu        sync.Mutex
	cls       [numClasses]classList
	objects   int64
	requested int64
	allocated int64
	_         [64]byte // keeps shards' locks on separate cache lines
}

// NewArena returns an empty arena that allocates its segments through c.
// It takes nothing from the pool until the first Alloc.
func NewArena(c *Client, opts ...ArenaOption) (*Arena, error) {
	o := arenaOptions{segSize: maxSegPages * pageSize}
	for _, opt := range opts {
		opt(&o)
	}
	if c == nil {
		return nil, fmt.Errorf("%w: NewArena needs a Client; get one from Dial", ErrInvalid)
	}
	if o.segSize < pageSize || o.segSize > maxSegPages*pageSize || o.segSize%pageSize != 0 {
		return nil, fmt.Errorf("%w: arena segment size %d; use a multiple of 1 MiB from 1 MiB to 64 MiB", ErrInvalid, o.segSize)
	}
	for _, t := range append([]Tier{o.tier}, o.fallback...) {
		if t < TierAny || t > TierRDMA {
			return nil, fmt.Errorf("%w: unknown tier %s; use TierLocal, TierCXL, TierRDMA or TierAny", ErrInvalid, t)
		}
	}
	if o.limit < 0 {
		return nil, fmt.Errorf("%w: arena limit %d is negative; use 0 for no limit", ErrInvalid, o.limit)
	}
	n := 1 << bits.Len(uint(2*runtime.GOMAXPROCS(0)-1))
	a := &Arena{
		c: c, opts: o, tag: uint8(arenaTags.Add(1)),
		shards: make([]arenaShard, n), mask: uint32(n - 1),
		nextID: 1, // slab 0 is never used, so a Ref with zero slab is forged
		slabs:  map[Tier]int{}, segTiers: map[Tier]int{}, heldTier: map[Tier]int64{},
	}
	return a, nil
}

// badRef builds the error for a Ref that does not name a live object.
func badRef(r Ref, why string) error {
	return fmt.Errorf("%v %s: %w", r, why, ErrBadRef)
}

// lockShard locks the first shard no other goroutine holds: a lone
// goroutine always uses shard 0, so an arena holds one partly used slab per
// size class and concurrent goroutine, not one per shard.
func (a *Arena) lockShard() (*arenaShard, uint16) {
	for j := range a.shards {
		if sh := &a.shards[j]; sh.mu.TryLock() {
			return sh, uint16(j)
		}
	}
	j := rand.Uint32() & a.mask
	a.shards[j].mu.Lock()
	return &a.shards[j], uint16(j)
}

// Alloc reserves an n-byte object, 1 <= n <= MaxObjectSize, and returns its
// Ref. Its contents are undefined until written (a reused slot keeps old
// bytes). A larger n returns ErrTooLarge: nothing is ever truncated.
func (a *Arena) Alloc(n int) (Ref, error) {
	if n <= 0 {
		return 0, fmt.Errorf("%w: arena object of %d bytes; ask for 1 to %d", ErrInvalid, n, MaxObjectSize)
	}
	if n > MaxObjectSize {
		return 0, fmt.Errorf("arena object of %d bytes is over the largest size class (%d); allocate a Segment for it: %w", n, MaxObjectSize, ErrTooLarge)
	}
	if a.closed.Load() {
		return 0, fmt.Errorf("arena: %w", ErrClosed)
	}
	c := classOf(n)
	sh, si := a.lockShard()
	s := sh.cls[c].cur
	if s == nil || len(s.free) == 0 {
		var err error
		if s, err = a.refill(sh, si, c); err != nil {
			sh.mu.Unlock()
			return 0, err
		}
	}
	slot := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	m := &s.meta[slot]
	gen := uint16(atomic.LoadUint32(m)>>16) + 1 // even (free) to odd (live)
	atomic.StoreUint32(m, uint32(gen)<<16|(s.size-uint32(n)))
	sh.objects++
	sh.requested += int64(n)
	sh.allocated += int64(s.size)
	sh.mu.Unlock()
	return makeRef(gen, a.tag, s.id, slot), nil
}

// refill makes a slab with free slots the current one of class c in shard
// sh (locked): a partly used one, else a new one.
func (a *Arena) refill(sh *arenaShard, si uint16, c int) (*slab, error) {
	cl := &sh.cls[c]
	if old := cl.cur; old != nil && len(old.free) > 0 {
		return old, nil
	}
	if p := cl.partial; p != nil {
		cl.unlink(p)
		cl.cur = p
		return p, nil
	}
	s, err := a.newSlab(c, si)
	if err != nil {
		return nil, err
	}
	cl.cur = s
	return s, nil
}

func (cl *classList) push(s *slab) {
	s.prev, s.next, s.onList = nil, cl.partial, true
	if cl.partial != nil {
		cl.partial.prev = s
	}
	cl.partial = s
}

func (cl *classList) unlink(s *slab) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		cl.partial = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	}
	s.prev, s.next, s.onList = nil, nil, false
}

// slabShape returns the pages of a slab of class c and its slot count.
func (a *Arena) slabShape(c int) (npages int, nslots uint32) {
	size := int64(classSizes[c])
	npages = int((size*minSlabSlots + pageSize - 1) / pageSize)
	npages = min(npages, int(a.opts.segSize/pageSize))
	nslots = uint32(min(int64(npages)*pageSize/size, 1<<16))
	return npages, nslots
}

// newSlab carves a slab of class c for shard si, growing the arena if no
// segment has room.
func (a *Arena) newSlab(c int, si uint16) (*slab, error) {
	npages, nslots := a.slabShape(c)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return nil, fmt.Errorf("arena: %w", ErrClosed)
	}
	seg, first := a.findPages(npages)
	if seg == nil {
		var err error
		if seg, err = a.grow(); err != nil {
			return nil, err
		}
		first = 0
	}
	if seg.pages == 0 {
		a.empty--
	}
	seg.pages |= (uint64(1)<<npages - 1) << first
	id := a.nextID
	if n := len(a.freeIDs); n > 0 {
		id = a.freeIDs[n-1]
		a.freeIDs = a.freeIDs[:n-1]
	} else {
		if id >= 1<<24 {
			return nil, fmt.Errorf("arena has %d slabs, the most a Ref can name; use a second arena: %w", id, ErrNoCapacity)
		}
		a.nextID++
	}
	s := &slab{
		id: id, seg: seg, base: int64(first) * pageSize, size: classSizes[c], nslots: nslots,
		class: uint8(c), shard: si, firstPage: first, npages: npages,
		meta: make([]uint32, nslots), free: make([]uint16, nslots),
	}
	if mem, ok := seg.seg.Bytes(); ok {
		s.mem = mem[s.base : s.base+int64(npages)*pageSize]
	}
	for i := range s.free {
		s.free[i] = uint16(int(nslots) - 1 - i) // slot 0 first
	}
	ch := a.dir[id>>slabChunkBits].Load()
	if ch == nil {
		ch = new(slabChunk)
		a.dir[id>>slabChunkBits].Store(ch)
	}
	ch[id&(slabChunkLen-1)].Store(s)
	a.slabs[seg.tier]++
	return s, nil
}

// findPages returns a segment with npages free pages in a row and the first
// of them; a.mu is held. Fuller segments are preferred, so empty ones can go back.
func (a *Arena) findPages(npages int) (*arenaSeg, int) {
	var best *arenaSeg
	bestFirst, bestUsed := 0, -1
	for _, seg := range a.segs {
		free := ^seg.pages
		if seg.npages < 64 {
			free &= uint64(1)<<seg.npages - 1
		}
		run := uint64(1)<<npages - 1
		for first := 0; first+npages <= seg.npages; first++ {
			if free>>first&run == run {
				if used := bits.OnesCount64(seg.pages); used > bestUsed {
					best, bestFirst, bestUsed = seg, first, used
				}
				break
			}
		}
	}
	return best, bestFirst
}

// grow allocates one more segment from the pool; a.mu is held.
func (a *Arena) grow() (*arenaSeg, error) {
	if a.opts.limit > 0 && a.held+a.opts.segSize > a.opts.limit {
		return nil, fmt.Errorf("arena holds %d bytes and its limit is %d; free objects or raise ArenaLimit: %w", a.held, a.opts.limit, ErrNoCapacity)
	}
	ctx, cancel := context.WithTimeout(context.Background(), growTimeout)
	defer cancel()
	opts := []AllocOption{WithTier(a.opts.tier)}
	if len(a.opts.fallback) > 0 {
		opts = append(opts, WithFallback(a.opts.fallback...))
	}
	seg, err := a.c.Alloc(ctx, a.opts.segSize, opts...)
	if err != nil {
		return nil, fmt.Errorf("arena grows by a %d-byte segment on tier %s: %w", a.opts.segSize, a.opts.tier, err)
	}
	s := &arenaSeg{seg: seg, tier: seg.Tier(), npages: int(a.opts.segSize / pageSize)}
	a.segs = append(a.segs, s)
	a.held += a.opts.segSize
	a.segTiers[s.tier]++
	a.heldTier[s.tier] += a.opts.segSize
	a.empty++
	return s, nil
}

// releaseSlab returns an empty slab's pages to its segment, and the
// segment, if empty and not the one kept in reserve, to the caller to free.
// The slab's shard lock is held.
func (a *Arena) releaseSlab(s *slab) *Segment {
	s.released = true
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return nil // Close freed the segments
	}
	a.dir[s.id>>slabChunkBits].Load()[s.id&(slabChunkLen-1)].Store(nil)
	a.freeIDs = append(a.freeIDs, s.id)
	a.slabs[s.seg.tier]--
	seg := s.seg
	seg.pages &^= (uint64(1)<<s.npages - 1) << s.firstPage
	if seg.pages != 0 {
		return nil
	}
	a.empty++
	if a.empty <= 1 {
		return nil
	}
	return a.dropSeg(seg)
}

// dropSeg forgets an empty segment; a.mu is held. The caller frees it.
func (a *Arena) dropSeg(seg *arenaSeg) *Segment {
	for i, s := range a.segs {
		if s == seg {
			a.segs = append(a.segs[:i], a.segs[i+1:]...)
			break
		}
	}
	a.empty--
	a.held -= a.opts.segSize
	a.segTiers[seg.tier]--
	a.heldTier[seg.tier] -= a.opts.segSize
	return seg.seg
}

// freeSegment returns a segment to the pool in the background of Free,
// which has no context to wait on the daemon with.
func freeSegment(seg *Segment) error {
	ctx, cancel := context.WithTimeout(context.Background(), growTimeout)
	defer cancel()
	return seg.Free(ctx)
}

// lookup finds the slab and slot a Ref names, without checking its generation.
func (a *Arena) lookup(r Ref) (*slab, uint16, error) {
	if r.tag() != a.tag {
		return nil, 0, badRef(r, "belongs to another arena")
	}
	id := r.slab()
	ch := a.dir[id>>slabChunkBits].Load()
	if ch == nil {
		return nil, 0, badRef(r, "names no slab of this arena")
	}
	s := ch[id&(slabChunkLen-1)].Load()
	if s == nil {
		return nil, 0, badRef(r, "names a slab this arena released (the object was freed)")
	}
	if uint32(r.slot()) >= s.nslots {
		return nil, 0, badRef(r, fmt.Sprintf("names slot %d of a %d-slot slab", r.slot(), s.nslots))
	}
	return s, r.slot(), nil
}

// live returns the slot's metadata if the Ref names a live object.
func (s *slab) live(r Ref) (uint32, error) {
	m := atomic.LoadUint32(&s.meta[r.slot()])
	if g := r.gen(); g&1 == 0 || uint16(m>>16) != g {
		return 0, badRef(r, "was freed, or never allocated")
	}
	return m, nil
}

// Free releases the object. Freeing a Ref twice, or a Ref this arena did
// not hand out, returns ErrBadRef and changes nothing.
func (a *Arena) Free(r Ref) error {
	s, slot, err := a.lookup(r)
	if err != nil {
		return err
	}
	sh := &a.shards[s.shard]
	sh.mu.Lock()
	if s.released {
		sh.mu.Unlock()
		return badRef(r, "names a slab this arena released (the object was freed)")
	}
	m, err := s.live(r)
	if err != nil {
		sh.mu.Unlock()
		return err
	}
	atomic.StoreUint32(&s.meta[slot], uint32(r.gen()+1)<<16)
	s.free = append(s.free, slot)
	sh.objects--
	sh.requested -= int64(s.size - m&0xffff)
	sh.allocated -= int64(s.size)
	var drop *Segment
	if cl := &sh.cls[s.class]; s != cl.cur {
		switch {
		case len(s.free) == int(s.nslots):
			if s.onList {
				cl.unlink(s)
			}
			drop = a.releaseSlab(s)
		case !s.onList:
			cl.push(s)
		}
	}
	sh.mu.Unlock()
	if drop != nil {
		if err := freeSegment(drop); err != nil {
			return fmt.Errorf("object freed, but returning its empty segment to the pool failed: %w", err)
		}
	}
	return nil
}

// Len returns the length the object was allocated with.
func (a *Arena) Len(r Ref) (int, error) {
	_, _, _, n, err := a.object(r)
	return int(n), err
}

// object resolves a Ref to a live object: its slab, slot, the slot's
// metadata (to re-check after a copy) and the object's length.
func (a *Arena) object(r Ref) (s *slab, slot uint16, m uint32, n int64, err error) {
	if s, slot, err = a.lookup(r); err != nil {
		return nil, 0, 0, 0, err
	}
	if m, err = s.live(r); err != nil {
		return nil, 0, 0, 0, err
	}
	return s, slot, m, int64(s.size - m&0xffff), nil
}

// ReadAt reads len(p) bytes of the object at off, following io.ReaderAt:
// fewer bytes than len(p) come with io.EOF at the object's end. On the rdma
// tier it is one one-sided read.
func (a *Arena) ReadAt(r Ref, p []byte, off int64) (int, error) {
	s, slot, m, n, err := a.object(r)
	if err != nil {
		return 0, err
	}
	if off < 0 || off > n {
		return 0, fmt.Errorf("read at %d of a %d-byte object %v: %w", off, n, r, ErrOutOfRange)
	}
	want := p
	if int64(len(p)) > n-off {
		want = p[:n-off]
	}
	k, err := s.seg.seg.ReadAt(want, s.base+int64(slot)*int64(s.size)+off)
	// A Free during the read may also have returned the segment to the
	// pool, failing the read: the freed object is the error to report.
	if atomic.LoadUint32(&s.meta[slot]) != m {
		return 0, badRef(r, "was freed during the read")
	}
	if err != nil {
		return 0, err
	}
	if k < len(p) {
		return k, io.EOF
	}
	return k, nil
}

// WriteAt writes p into the object at off, following io.WriterAt; a write
// past the object's end writes nothing and returns ErrOutOfRange.
func (a *Arena) WriteAt(r Ref, p []byte, off int64) (int, error) {
	s, slot, _, n, err := a.object(r)
	if err != nil {
		return 0, err
	}
	if off < 0 || off > n || int64(len(p)) > n-off {
		return 0, fmt.Errorf("write of %d bytes at %d of a %d-byte object %v: %w", len(p), off, n, r, ErrOutOfRange)
	}
	return s.seg.seg.WriteAt(p, s.base+int64(slot)*int64(s.size)+off)
}

// Bytes returns the object's memory on load/store tiers (local, cxl), with
// the length it was allocated with, and ErrNotSupported on the rdma tier.
// The slice is valid until the object is freed; using it after that reads
// or corrupts whatever object reuses the slot.
func (a *Arena) Bytes(r Ref) ([]byte, error) {
	s, slot, _, n, err := a.object(r)
	if err != nil {
		return nil, err
	}
	return s.view(r, slot, int(n))
}

// view returns the first n bytes of slot's memory, or ErrNotSupported on a
// tier without a load/store mapping.
func (s *slab) view(r Ref, slot uint16, n int) ([]byte, error) {
	if s.mem == nil {
		return nil, fmt.Errorf("%v is on tier %s, which has no load/store mapping; use ReadAt and WriteAt: %w", r, s.seg.tier, ErrNotSupported)
	}
	off := int(slot) * int(s.size)
	return s.mem[off : off+n : off+n], nil
}

// SlotBytes is Bytes for a caller that knows its objects' lengths and when
// they are freed: it returns the whole slot r names (SizeClass of the
// length the object was allocated with) without reading the slot's
// metadata, one cache miss fewer than Bytes, which matters where every
// read of an object starts cold (an index of records in far memory). It
// does not check r's generation: for an object freed meanwhile it returns
// the slot as it is now, perhaps another object's. Use it only where r
// cannot be freed while the slice is used (the caller frees under a lock it
// holds across the use) and keep the object's length in the object itself.
// A Ref of another arena, of a released slab or past a slab's slots is
// ErrBadRef; the rdma tier is ErrNotSupported.
func (a *Arena) SlotBytes(r Ref) ([]byte, error) {
	s, slot, err := a.lookup(r)
	if err != nil {
		return nil, err
	}
	return s.view(r, slot, int(s.size))
}

// Tier returns the tier holding the object.
func (a *Arena) Tier(r Ref) (Tier, error) {
	s, _, err := a.lookup(r)
	if err != nil {
		return 0, err
	}
	if _, err := s.live(r); err != nil {
		return 0, err
	}
	return s.seg.tier, nil
}

// Owns reports whether r was made by this arena (live or not): a cheap
// test of its arena field, for callers that keep Refs of several arenas.
func (a *Arena) Owns(r Ref) bool { return r.tag() == a.tag }

// ArenaTierStats is an arena's use of one tier. A plain value.
type ArenaTierStats struct {
	Slabs    int   // slabs on the tier
	Segments int   // segments held from the tier
	Held     int64 // bytes of those segments
}

// ArenaStats is a snapshot of an arena. A plain value.
type ArenaStats struct {
	Objects   int64 // live objects
	Requested int64 // bytes the live objects were allocated with
	Allocated int64 // bytes of their slots; Allocated-Requested is internal fragmentation
	Slabs     int   // slabs in use (a slab holds objects of one size class)
	Segments  int   // segments held from the pool, including one empty in reserve
	Held      int64 // bytes of those segments
	Tiers     map[Tier]ArenaTierStats
}

// Stats returns the arena's counters. It briefly locks every shard.
func (a *Arena) Stats() ArenaStats {
	var st ArenaStats
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		st.Objects += sh.objects
		st.Requested += sh.requested
		st.Allocated += sh.allocated
		sh.mu.Unlock()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	st.Segments = len(a.segs)
	st.Held = a.held
	st.Tiers = map[Tier]ArenaTierStats{}
	for t, n := range a.segTiers {
		if n > 0 || a.slabs[t] > 0 {
			st.Tiers[t] = ArenaTierStats{Slabs: a.slabs[t], Segments: n, Held: a.heldTier[t]}
		}
		st.Slabs += a.slabs[t]
	}
	return st
}

// Trim returns to the pool every segment with no object in it, including
// the one kept in reserve and those held only by empty current slabs.
func (a *Arena) Trim(ctx context.Context) error {
	var drop []*Segment
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		for c := range sh.cls {
			cl := &sh.cls[c]
			if s := cl.cur; s != nil && len(s.free) == int(s.nslots) {
				cl.cur = nil
				if seg := a.releaseSlab(s); seg != nil {
					drop = append(drop, seg)
				}
			}
		}
		sh.mu.Unlock()
	}
	a.mu.Lock()
	for _, seg := range append([]*arenaSeg(nil), a.segs...) {
		if seg.pages == 0 {
			drop = append(drop, a.dropSeg(seg))
		}
	}
	a.mu.Unlock()
	var err error
	for _, seg := range drop {
		err = errors.Join(err, seg.Free(ctx))
	}
	return err
}

// Close frees every segment of the arena; its Refs are then invalid and
// its methods return ErrClosed or ErrBadRef. Close is idempotent.
func (a *Arena) Close(ctx context.Context) error {
	if !a.closed.CompareAndSwap(false, true) {
		return nil
	}
	a.mu.Lock()
	segs := a.segs
	a.segs = nil
	a.held, a.empty = 0, 0
	clear(a.segTiers)
	clear(a.heldTier)
	clear(a.slabs)
	for i := range a.dir {
		a.dir[i].Store(nil)
	}
	a.mu.Unlock()
	var err error
	for _, seg := range segs {
		err = errors.Join(err, seg.seg.Free(ctx))
	}
	return err
}
