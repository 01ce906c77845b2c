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
	var refused error
	switch {
	case a.closed.Load():
		refused = fmt.Errorf("arena: %w", ErrClosed)
	case len(gets) > MaxBatch:
		refused = fmt.Errorf("arena GetMany of %d objects: at most MaxBatch (%d) per call; split the batch: %w", len(gets), MaxBatch, ErrLimit)
	}
	if refused != nil {
		for i := range gets {
			gets[i].Err = refused
		}
		return refused
	}
	// One group per segment, found by a linear scan: an arena holds few
	// segments, and a batch rarely spans many of them.
	type group struct {
		seg   *Segment
		idx   []int
		spans []Span
		err   error
	}
	type entry struct {
		s     *slab
		slot  uint16
		meta  uint32
		start int
	}
	var groups []group
	ents := make([]entry, len(gets))
	for i := range gets {
		g := &gets[i]
		s, slot, m, n, err := a.object(g.Ref)
		if g.Err = err; err != nil {
			continue
		}
		start := len(g.Buf)
		g.Buf = slices.Grow(g.Buf, int(n))[:start+int(n)]
		ents[i] = entry{s: s, slot: slot, meta: m, start: start}
		k := slices.IndexFunc(groups, func(gr group) bool { return gr.seg == s.seg.seg })
		if k < 0 {
			k = len(groups)
			groups = append(groups, group{seg: s.seg.seg})
		}
		groups[k].idx = append(groups[k].idx, i)
		groups[k].spans = append(groups[k].spans, Span{Off: s.base + int64(slot)*int64(s.size), Buf: g.Buf[start:]})
	}
	var wg sync.WaitGroup
	for k := 1; k < len(groups); k++ {
		wg.Go(func() { groups[k].err = groups[k].seg.ReadBatch(ctx, groups[k].spans) })
	}
	if len(groups) > 0 {
		groups[0].err = groups[0].seg.ReadBatch(ctx, groups[0].spans)
	}
	wg.Wait()
	for _, gr := range groups {
		for _, i := range gr.idx {
			e := &ents[i]
			// A Free during the read may also have returned the segment
			// to the pool: the freed object's error is the one to report.
			switch {
			case atomic.LoadUint32(&e.s.meta[e.slot]) != e.meta:
				gets[i].Err = badRef(gets[i].Ref, "was freed during the read")
			case gr.err != nil:
				gets[i].Err = fmt.Errorf("%v: %w", gets[i].Ref, gr.err)
			}
			if gets[i].Err != nil {
				gets[i].Buf = gets[i].Buf[:e.start]
			}
		}
	}
	var failed []error
	for i := range gets {
		if gets[i].Err != nil {
			failed = append(failed, fmt.Errorf("entry %d: %w", i, gets[i].Err))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("arena GetMany: %d of %d entries failed (each entry's Err says why): %w", len(failed), len(gets), errors.Join(failed...))
}
