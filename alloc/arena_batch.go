package alloc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// ArenaGet is one object of an Arena.GetMany batch. A plain value; the
// caller owns Buf, which GetMany uses only until it returns.
type ArenaGet struct {
	// Ref names the object to read.
	Ref Ref
	// Buf receives the object: GetMany appends the whole object to it,
	// growing it when its capacity is short (give it room for the object
	// to read without allocating). A failed entry's Buf keeps its length.
	Buf []byte
	// Err is the entry's own outcome, set by GetMany: nil when Buf holds
	// the object.
	Err error
}

// ArenaPut is one object of an Arena.PutMany batch. A plain value; the
// caller owns Buf, which PutMany uses only until it returns.
type ArenaPut struct {
	// Ref names the object to write.
	Ref Ref
	// Buf is written at the start of the object; it may be shorter than
	// the object, not longer (ErrOutOfRange).
	Buf []byte
	// Err is the entry's own outcome, set by PutMany: nil when Buf was
	// written.
	Err error
}

// GetMany reads many objects in one call. Their reads are grouped by the
// segment that holds them and each group is one Segment.ReadBatch (on the
// rdma tier one train of frames, about one round trip); the groups of
// different segments are read at the same time, so a batch costs about
// one round trip however its objects are spread.
//
// A batch is refused whole, before any of it is read, only when the arena
// is closed (ErrClosed) or the batch has more than MaxBatch entries
// (ErrLimit); every entry's Err is then that error too. Otherwise each
// entry stands alone, unlike a Segment.ReadBatch whose bad span refuses
// its batch: a Ref is named by the caller's data and a concurrent Free
// may end it at any moment, so a Ref that names no live object, or whose
// object is freed during the read, fails its own entry with ErrBadRef and
// the others are read. A segment whose home fails (ErrUnavailable,
// ErrSegmentLost, or ctx's error) fails the entries it holds. An empty
// batch reads nothing and succeeds.
//
// GetMany returns nil only when every entry was read. Otherwise its error
// counts the failed entries and wraps each one's error (errors.Is finds
// any of them), and the failed entries' Err say which: a partial result
// is never reported as complete. Safe for concurrent use.
func (a *Arena) GetMany(ctx context.Context, gets []ArenaGet) error {
	sc := getManyScratch(len(gets))
	defer sc.put()
	ents := sc.ents
	for i := range gets {
		ents[i].ref, ents[i].start = gets[i].Ref, len(gets[i].Buf)
	}
	err := a.many(ctx, "GetMany", sc, func(i int, n int64) ([]byte, error) {
		g := &gets[i]
		g.Buf = slices.Grow(g.Buf, int(n))[:ents[i].start+int(n)]
		return g.Buf[ents[i].start:], nil
	}, (*Segment).ReadBatch)
	for i := range gets {
		if gets[i].Err = ents[i].err; ents[i].err != nil {
			gets[i].Buf = gets[i].Buf[:ents[i].start]
		}
	}
	return err
}

// PutMany writes many objects in one call, as GetMany reads them: one
// Segment.WriteBatch per segment, the segments at once, the same
// refusals of a whole batch and the same errors of single entries, and an
// entry whose Buf is longer than its object fails with ErrOutOfRange.
// Entries must name distinct objects (a repeated Ref fails the segment's
// group with ErrInvalid). A failed entry was written whole or not at all,
// as WriteBatch says; writing to an object while another goroutine frees
// it is the caller's race, as with WriteAt. Safe for concurrent use.
func (a *Arena) PutMany(ctx context.Context, puts []ArenaPut) error {
	sc := getManyScratch(len(puts))
	defer sc.put()
	ents := sc.ents
	for i := range puts {
		ents[i].ref = puts[i].Ref
	}
	err := a.many(ctx, "PutMany", sc, func(i int, n int64) ([]byte, error) {
		if int64(len(puts[i].Buf)) > n {
			return nil, fmt.Errorf("write of %d bytes to a %d-byte object %v: %w", len(puts[i].Buf), n, puts[i].Ref, ErrOutOfRange)
		}
		return puts[i].Buf, nil
	}, (*Segment).WriteBatch)
	for i := range puts {
		puts[i].Err = ents[i].err
	}
	return err
}

// manyEntry is one object of a GetMany or PutMany: its Ref, where its
// bytes begin in the caller's Buf (GetMany), what lookup found, and its
// outcome.
type manyEntry struct {
	ref   Ref
	start int
	s     *slab
	slot  uint16
	meta  uint32
	err   error
}

// manyGroup is the entries of a GetMany or PutMany on one segment.
type manyGroup struct {
	seg   *Segment
	idx   []int
	spans []Span
	err   error
}

// manyScratch is the working memory of one GetMany or PutMany, reused
// through manyScratches: a batch leaves no garbage behind.
type manyScratch struct {
	ents   []manyEntry
	groups []manyGroup
}

var manyScratches = sync.Pool{New: func() any { return new(manyScratch) }}

// getManyScratch returns a scratch with n zeroed entries and no group.
func getManyScratch(n int) *manyScratch {
	sc := manyScratches.Get().(*manyScratch)
	sc.ents = slices.Grow(sc.ents[:0], n)[:n]
	return sc
}

// group returns the group of seg, adding it (reusing an earlier batch's
// slices) when there is none.
func (sc *manyScratch) group(seg *Segment) *manyGroup {
	// A linear scan: an arena holds few segments, and a batch rarely
	// spans many of them.
	for k := range sc.groups {
		if sc.groups[k].seg == seg {
			return &sc.groups[k]
		}
	}
	if len(sc.groups) < cap(sc.groups) {
		sc.groups = sc.groups[:len(sc.groups)+1]
	} else {
		sc.groups = append(sc.groups, manyGroup{})
	}
	g := &sc.groups[len(sc.groups)-1]
	g.seg, g.idx, g.spans, g.err = seg, g.idx[:0], g.spans[:0], nil
	return g
}

// put clears sc (its entries and spans name the caller's objects and
// buffers) and returns it to manyScratches, unless it is large.
func (sc *manyScratch) put() {
	if cap(sc.ents) > maxPooledOps {
		return // a rare large batch's memory goes back to the collector
	}
	clear(sc.ents)
	for k := range sc.groups {
		g := &sc.groups[k]
		clear(g.spans)
		g.seg, g.err = nil, nil
	}
	sc.groups = sc.groups[:0]
	manyScratches.Put(sc)
}

// many runs a batch of GetMany or PutMany: it resolves each entry's Ref,
// asks span for the entry's bytes given the object's length, groups the
// spans by segment, runs each group through batch (the groups of
// different segments at once), and sets each entry's err.
func (a *Arena) many(ctx context.Context, what string, sc *manyScratch, span func(i int, n int64) ([]byte, error),
	batch func(*Segment, context.Context, []Span) error) error {
	ents := sc.ents
	var refused error
	switch {
	case a.closed.Load():
		refused = fmt.Errorf("arena: %w", ErrClosed)
	case len(ents) > MaxBatch:
		refused = fmt.Errorf("arena %s of %d objects: at most MaxBatch (%d) per call; split the batch: %w", what, len(ents), MaxBatch, ErrLimit)
	}
	if refused != nil {
		for i := range ents {
			ents[i].err = refused
		}
		return refused
	}
	for i := range ents {
		e := &ents[i]
		s, slot, m, n, err := a.object(e.ref)
		var buf []byte
		if err == nil {
			buf, err = span(i, n)
		}
		if e.err = err; err != nil {
			continue
		}
		e.s, e.slot, e.meta = s, slot, m
		g := sc.group(s.seg.seg)
		g.idx = append(g.idx, i)
		g.spans = append(g.spans, Span{Off: s.base + int64(slot)*int64(s.size), Buf: buf})
	}
	groups := sc.groups
	var wg sync.WaitGroup
	for k := 1; k < len(groups); k++ {
		wg.Go(func() { groups[k].err = batch(groups[k].seg, ctx, groups[k].spans) })
	}
	if len(groups) > 0 {
		groups[0].err = batch(groups[0].seg, ctx, groups[0].spans)
	}
	wg.Wait()
	for _, gr := range groups {
		for _, i := range gr.idx {
			e := &ents[i]
			// A Free during the batch may also have returned the segment
			// to the pool: the freed object's error is the one to report.
			switch {
			case atomic.LoadUint32(&e.s.meta[e.slot]) != e.meta:
				e.err = badRef(e.ref, "was freed during the batch")
			case gr.err != nil:
				e.err = fmt.Errorf("%v: %w", e.ref, gr.err)
			}
		}
	}
	var failed []error
	for i := range ents {
		if ents[i].err != nil {
			failed = append(failed, fmt.Errorf("entry %d: %w", i, ents[i].err))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("arena %s: %d of %d entries failed (each entry's Err says why): %w", what, len(failed), len(ents), errors.Join(failed...))
}
