package alloc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// The erasure-coded side of redundant: where a logical byte lives, the
// per-shard batches, and the degraded read.

// errShardLost is the answer to a write or atomic on a chunk whose data
// shard's home is lost (the pool declared it dead, or rebuilds it
// elsewhere) that the daemon cannot make (fewer than k+1 other shards up,
// say): it waits for the rebuild. It matches ErrUnavailable.
var errShardLost = errs.Sub(ErrUnavailable, "alloc: the home of this chunk's data shard is lost, and its poold cannot write it now (fewer than k+1 other shards up, or a write its home left half done); writes and atomics on its chunks fail until the pool rebuilds it (reads decode it from the other shards)")

// errShardAway is errShardLost for a data shard whose home is not lost
// but does not answer now (HOME_STATE_UNREACHABLE): the pool keeps it,
// with its bytes, for its node's return, and nothing writes the shard
// meanwhile (a change made elsewhere would be missing from it): it waits
// for that node, not for a rebuild. It matches errs.ErrHomeUnreachable,
// and so ErrUnavailable.
var errShardAway = errs.Sub(errs.ErrHomeUnreachable, "alloc: the home of this chunk's data shard does not answer now (its node is down or cut off); the pool keeps it, with its bytes, for that node's return, so no poold writes the shard meanwhile: writes and atomics on its chunks fail until the node is back ('memctl nodes' shows which hosts are alive), and reads decode it from the other shards while k of them are up")

// lostWriteMax is the most bytes one WriteLostShard call carries (the
// daemon's bound).
const lostWriteMax = 1 << 20

// piece is the part of a span within one chunk: at offset off of its data
// shard's segment.
type piece struct {
	off int64
	buf []byte
}

// locate is where logical offset o lives: its data shard and the offset
// in that shard's segment.
func (r *redundant) locate(o int64) (shard int, at int64) {
	c := o / r.chunk
	return int(c % int64(r.k)), c/int64(r.k)*r.chunk + o%r.chunk
}

// pieces cuts spans at chunk boundaries, grouped by data shard.
func (r *redundant) pieces(spans []Span) [][]piece {
	by := make([][]piece, r.k)
	for _, sp := range spans {
		o, b := sp.Off, sp.Buf
		for len(b) > 0 {
			n := min(int64(len(b)), r.chunk-o%r.chunk)
			i, at := r.locate(o)
			by[i] = append(by[i], piece{off: at, buf: b[:n]})
			o, b = o+n, b[n:]
		}
	}
	return by
}

// codedAccess reads or writes spans of an erasure-coded segment: each
// touched data shard's pieces in one batch at its home, the shards in
// parallel.
func (r *redundant) codedAccess(ctx context.Context, spans []Span, write bool) error {
	if len(spans) == 1 && len(spans[0].Buf) > 0 && spans[0].Off%r.chunk+int64(len(spans[0].Buf)) <= r.chunk {
		return r.chunkAccess(ctx, spans[0].Off, spans[0].Buf, write)
	}
	by := r.pieces(spans)
	var shards []int
	for i, ps := range by {
		if len(ps) > 0 {
			shards = append(shards, i)
		}
	}
	kind := rdma.OpRead
	if write {
		kind = rdma.OpWrite
	}
	return parallel(len(shards), func(j int) error {
		i := shards[j]
		ops := make([]rdma.Op, len(by[i]))
		for p, pc := range by[i] {
			ops[p] = rdma.Op{Kind: kind, Offset: pc.off, Buf: pc.buf}
		}
		try := r.atShard(i)
		if !write {
			try = r.readShard(i, by[i])
		}
		return r.run(ctx, ptrs(ops), try)
	})
}

// chunkAccess reads or writes p at logical offset off, within one chunk,
// as an op on an unreplicated segment goes: one pooled op, on the calling
// goroutine, at the chunk's data shard's home (a read decoded from the
// others if that fails; the home of a write sends the parity deltas).
func (r *redundant) chunkAccess(ctx context.Context, off int64, p []byte, write bool) error {
	i, at := r.locate(off)
	c := chunkOps.Get().(*chunkOp)
	c.op = rdma.Op{Kind: rdma.OpRead, Offset: at, Buf: p}
	c.list[0] = &c.op
	var try func(context.Context, *homeView, *[]*rdma.Op) error
	if write {
		c.op.Kind, try = rdma.OpWrite, r.atShard(i)
	} else {
		c.ps[0] = piece{off: at, buf: p}
		try = r.readShard(i, c.ps[:])
	}
	err := r.run(ctx, c.list[:], try)
	*c = chunkOp{}
	chunkOps.Put(c)
	return err
}

// chunkOp is chunkAccess's op and piece, reused through chunkOps.
type chunkOp struct {
	single
	ps [1]piece
}

var chunkOps = sync.Pool{New: func() any { return new(chunkOp) }}

// atShard is a round of writes or atomics at data shard i's home.
func (r *redundant) atShard(i int) func(context.Context, *homeView, *[]*rdma.Op) error {
	return func(ctx context.Context, v *homeView, pending *[]*rdma.Op) error {
		if h := v.homes[i]; !h.ok {
			return r.writeLost(ctx, i, h, v.info.Homes[i].State == poolv1.HomeState_HOME_STATE_UNREACHABLE, pending)
		}
		return r.attempt(ctx, v.homes[i], pending)
	}
}

// writeLost makes the writes and atomics of *pending, on data shard i
// whose home h is lost (or, away, does not answer now), through the
// daemon (WriteLostShard), which decodes the shard's bytes from the other
// shards and sends the parity shards the change; done ops leave *pending.
// What the daemon cannot do (fewer than k+1 other shards up, say) fails
// at once (errShardLost, or errShardAway for a home that does not answer);
// an atomic whose answer is lost is indeterminate, never run again.
func (r *redundant) writeLost(ctx context.Context, i int, h *home, away bool, pending *[]*rdma.Op) error {
	for len(*pending) > 0 {
		op := (*pending)[0]
		var err error
		if op.Kind == rdma.OpWrite {
			for b, off := op.Buf, op.Offset; len(b) > 0 && err == nil; {
				n := min(len(b), lostWriteMax)
				_, err = r.callLost(ctx, &poolv1.WriteLostShardRequest{Id: r.info.Id, Shard: uint32(i), Offset: off, Data: b[:n]})
				b, off = b[n:], off+int64(n)
			}
		} else {
			var resp *poolv1.WriteLostShardResponse
			resp, err = r.callLost(ctx, &poolv1.WriteLostShardRequest{Id: r.info.Id, Shard: uint32(i), Offset: op.Offset,
				Atomic: uint32(op.Kind), Old: op.Old, New: op.New, Delta: op.Delta})
			if err == nil {
				op.Prev, op.Swapped = resp.Prev, resp.Swapped
			} else if !errs.Answered(err) {
				return fmt.Errorf("segment %d: %s on lost data shard %d: the daemon's answer was lost, and it may have run: %w (%w)", r.info.Id, op.Kind, i, ErrIndeterminate, errs.FromStatus(err))
			}
		}
		answered := errs.Answered(err)
		switch err = errs.FromStatus(err); {
		case err == nil:
			*pending = (*pending)[1:]
		case answered && (errors.Is(err, ErrUnavailable) || errors.Is(err, ErrAccessDenied) || errors.Is(err, ErrSegmentLost)):
			why := errShardLost
			if away {
				why = errShardAway
			}
			return fmt.Errorf("segment %d: data shard %d on %s: %w (%w)", r.info.Id, i, h.plane.node, why, err)
		default: // its home is back, or the daemon restarts: the next round asks for the homes
			return fmt.Errorf("segment %d: data shard %d through the daemon: %w", r.info.Id, i, err)
		}
	}
	return nil
}

// callLost sends one WriteLostShard request on the client's session.
func (r *redundant) callLost(ctx context.Context, req *poolv1.WriteLostShardRequest) (*poolv1.WriteLostShardResponse, error) {
	cctx, _, err := r.c.callCtx(ctx)
	if err != nil {
		return nil, err
	}
	return r.c.api.WriteLostShard(cctx, req)
}

// readShard is a round of the reads of data shard i (ps): at its home,
// or, when that fails or is lost, decoded from k other shards.
func (r *redundant) readShard(i int, ps []piece) func(context.Context, *homeView, *[]*rdma.Op) error {
	return func(ctx context.Context, v *homeView, pending *[]*rdma.Op) error {
		if h := v.homes[i]; h.up() {
			if err := r.attempt(ctx, h, pending); err == nil || answered(err) || ctx.Err() != nil {
				return err
			}
		}
		return r.decode(ctx, v, i, ps)
	}
}

// decode fills the pieces ps of data shard i from the same ranges of
// other shards whose homes hold them, read in parallel (one batch per
// home, into one pooled buffer), and Reed–Solomon, which rebuilds shard i
// only: each byte column decodes on its own, so only the pieces' ranges
// are read.
//
// The shards are read while clients may write the same stripes: a data
// home applies a write, then sends the parity deltas, so for a moment a
// parity shard lacks a write its data shard holds (or holds one whose
// data shard was read before it landed), and a decode from such a mix
// yields bytes nobody wrote. So decode reads one shard more than the k it
// needs when one is up, rebuilds that one too from the k others, and
// compares: a write half applied across the shards read never matches
// (any k+1 shards of the code detect one inconsistent shard, and a write
// changes one data shard and its parity), and the read is made again
// once the write has gone everywhere (decodeRetry). With exactly k shards
// left no spare can tell, and the reads are ordered instead
// (decodeInOrder): see docs/REDUNDANCY.md ("Degraded reads under
// writes").
func (r *redundant) decode(ctx context.Context, v *homeView, i int, ps []piece) error {
	wait := decodeRetry
	for try := 1; ; try++ {
		torn, err := r.decodeOnce(ctx, v, i, ps)
		if err != nil || !torn {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("segment %d: data shard %d: the other shards kept changing under its decode (writes to the same stripes), or disagree: %w", r.info.Id, i, errs.ErrTooFewHomes)
		case <-t.C:
		}
		wait = min(2*wait, decodeRetryMax)
		if try%decodeRefresh == 0 {
			// A shard that keeps disagreeing may be one the daemon has
			// marked lost meanwhile (it missed writes): ask.
			r.refresh(ctx, v)
			v = r.view.Load()
		}
	}
}

// decodeRefresh is how many decodes in a row that do not match make a
// degraded read ask the daemon for the homes again.
const decodeRefresh = 4

// decodeRetry is the first wait before a degraded read whose shards did
// not match is made again: a write's parity deltas land within a round
// trip or two. It doubles up to decodeRetryMax.
const (
	decodeRetry    = 20 * time.Microsecond
	decodeRetryMax = 5 * time.Millisecond
)

// decodeOnce is one read of the shards and decode (see decode); torn
// reports that the spare shard read did not match the others.
func (r *redundant) decodeOnce(ctx context.Context, v *homeView, i int, ps []piece) (torn bool, err error) {
	total := 0
	for _, p := range ps {
		total += len(p.buf)
	}
	cands := v.order(i)
	if len(cands) == r.k {
		return r.decodeInOrder(ctx, v, i, ps, cands)
	}
	want := min(r.k+1, len(cands)) // k to decode, one more to check them
	// want slots of total bytes, one per shard read, and one to rebuild the
	// spare into: a try reads into a free one, which it keeps if it
	// succeeds and gives to the next try if not (a Read writes its buffer
	// only while it runs).
	bp := getDecodeBuf((want + 1) * total)
	defer putDecodeBuf(bp)
	buf := *bp
	l := opLists.Get().(*opList)
	defer l.put()
	src := make([]int, 0, want)     // the shards read, want of them once done
	bufs := make([][]byte, 0, want) // bufs[j]: shard src[j]'s bytes of every piece, in order
	got := make([][]byte, want)     // got[:want-len(src)]: the free slots
	for j := range got {
		got[j] = buf[j*total : (j+1)*total]
	}
	spare := buf[want*total:]
	failed := make([]error, want)
	for len(src) < want {
		need := want - len(src)
		if need > len(cands) {
			if len(src) >= r.k {
				break // no spare left to check with: decode from k
			}
			return false, fmt.Errorf("segment %d: data shard %d: only %d of the %d other shards needed to decode it could be read: %w", r.info.Id, i, len(src)+len(cands), r.k, errs.ErrTooFewHomes)
		}
		try := cands[:need]
		cands = cands[need:]
		l.readsInto(ps, got[:need])
		parallel(need, func(j int) error {
			pending := l.ptrs[j*len(ps) : (j+1)*len(ps) : (j+1)*len(ps)]
			failed[j] = r.attempt(ctx, v.homes[try[j]], &pending)
			return nil
		})
		free := 0
		for j, err := range failed[:need] {
			switch {
			case err == nil:
				src, bufs = append(src, try[j]), append(bufs, got[j])
			case answered(err) || ctx.Err() != nil:
				return false, err
			default:
				got[free] = got[j]
				free++
			}
		}
	}
	if len(src) == r.k { // the spare failed: none left to check with
		return r.decodeInOrder(ctx, v, i, ps, src)
	}
	return r.reconstruct(i, ps, src, bufs, spare)
}

// reconstruct fills the pieces ps of data shard i from the shards src[:k]
// read into bufs (bufs[j]: shard src[j]'s bytes of every piece, in order).
// With spare (room for one piece) it also rebuilds shard src[k] and
// reports torn when that differs from what was read of it.
func (r *redundant) reconstruct(i int, ps []piece, src []int, bufs [][]byte, spare []byte) (torn bool, err error) {
	shards := make([][]byte, r.k+r.m)
	want := make([]bool, r.k+r.m)
	want[i] = true
	at := 0
	for _, p := range ps {
		clear(shards)
		for j, s := range src[:r.k] {
			shards[s] = bufs[j][at : at+len(p.buf)]
		}
		shards[i] = p.buf[:0]
		if spare != nil {
			shards[src[r.k]], want[src[r.k]] = spare[:0:len(p.buf)], true
		}
		err := r.enc.ReconstructSome(shards, want)
		if spare != nil {
			want[src[r.k]] = false
		}
		if err != nil {
			return false, fmt.Errorf("segment %d: decode data shard %d at %d: %w (%w)", r.info.Id, i, p.off, err, errs.ErrTooFewHomes)
		}
		if spare != nil && !bytes.Equal(shards[src[r.k]], bufs[r.k][at:at+len(p.buf)]) {
			return true, nil
		}
		if len(shards[i]) > 0 && &shards[i][0] != &p.buf[0] {
			copy(p.buf, shards[i])
		}
		at += len(p.buf)
	}
	return false, nil
}

// decodeInOrder is decodeOnce with exactly k other shards up (cands), so
// none to check the decode with: it reads the data shards, then the
// parity shards, then the data shards again, and decodes only when the
// data shards did not change. A data home answers a read only once every
// write the read overlaps has reached the parity shards (rdma/tcp
// readSettled), so the parity read after it holds every write the data
// shards showed; and a write that reached a parity shard before its read
// was applied at its data shard before that, so the second read of the
// data shards shows it, and differs. A write and one that undoes it both
// landing between the first and last read would pass unseen.
func (r *redundant) decodeInOrder(ctx context.Context, v *homeView, i int, ps []piece, cands []int) (torn bool, err error) {
	total := 0
	for _, p := range ps {
		total += len(p.buf)
	}
	src := make([]int, 0, len(cands)) // the data shards, then the parity shards
	for _, c := range cands {
		if c < r.k {
			src = append(src, c)
		}
	}
	data := len(src)
	for _, c := range cands {
		if c >= r.k {
			src = append(src, c)
		}
	}
	bp := getDecodeBuf((len(src) + data) * total)
	defer putDecodeBuf(bp)
	buf := *bp
	slots := make([][]byte, len(src)+data) // src's, then the data shards' second read
	for j := range slots {
		slots[j] = buf[j*total : (j+1)*total]
	}
	for _, step := range []struct {
		shards []int
		into   [][]byte
	}{{src[:data], slots[:data]}, {src[data:], slots[data:len(src)]}, {src[:data], slots[len(src):]}} {
		if err := r.readShards(ctx, v, i, step.shards, step.into, ps); err != nil {
			return false, err
		}
	}
	for j := range data {
		if !bytes.Equal(slots[j], slots[len(src)+j]) {
			return true, nil
		}
	}
	return r.reconstruct(i, ps, src, slots[:len(src)], nil)
}

// readShards reads the ranges of ps at each shard of idx into the slot of
// the same index (its bytes of every piece, in order), in parallel, for
// the decode of data shard i.
func (r *redundant) readShards(ctx context.Context, v *homeView, i int, idx []int, slots [][]byte, ps []piece) error {
	l := opLists.Get().(*opList)
	defer l.put()
	l.readsInto(ps, slots[:len(idx)])
	read := func(j int) error {
		pending := l.ptrs[j*len(ps) : (j+1)*len(ps) : (j+1)*len(ps)]
		return r.attempt(ctx, v.homes[idx[j]], &pending)
	}
	var one [1]error
	failed := one[:]
	if len(idx) == 1 {
		one[0] = read(0) // on this goroutine, as a read of one shard goes
	} else {
		failed = make([]error, len(idx))
		parallel(len(idx), func(j int) error { failed[j] = read(j); return nil })
	}
	for j, err := range failed {
		switch {
		case err == nil:
		case answered(err) || ctx.Err() != nil:
			return err
		default:
			return fmt.Errorf("segment %d: data shard %d: shard %d, one of the last %d it decodes from, could not be read: %w (%w)", r.info.Id, i, idx[j], r.k, err, errs.ErrTooFewHomes)
		}
	}
	return nil
}

// readsInto makes l the reads of the ranges of ps from each of len(slots)
// shards, shard j's into slots[j] (its bytes of every piece, in order):
// ops j*len(ps) to (j+1)*len(ps) are shard j's.
func (l *opList) readsInto(ps []piece, slots [][]byte) {
	n := len(slots) * len(ps)
	l.ops, l.ptrs = slices.Grow(l.ops[:0], n)[:n], l.ptrs[:0]
	for j, slot := range slots {
		at := 0
		for p, pc := range ps {
			l.ops[j*len(ps)+p] = rdma.Op{Kind: rdma.OpRead, Offset: pc.off, Buf: slot[at : at+len(pc.buf)]}
			at += len(pc.buf)
		}
	}
	for j := range l.ops {
		l.ptrs = append(l.ptrs, &l.ops[j])
	}
}

// decodeBufs holds the buffers decode reads the other shards into.
var decodeBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledDecode bounds the buffers decodeBufs keeps: a rare large
// degraded read's memory goes back to the collector.
const maxPooledDecode = 1 << 20

// getDecodeBuf is a pooled buffer of n bytes; put it back with
// putDecodeBuf.
func getDecodeBuf(n int) *[]byte {
	bp := decodeBufs.Get().(*[]byte)
	if cap(*bp) < n {
		*bp = make([]byte, n)
	}
	*bp = (*bp)[:n]
	return bp
}

// putDecodeBuf returns bp to decodeBufs unless it is large.
func putDecodeBuf(bp *[]byte) {
	if cap(*bp) <= maxPooledDecode {
		decodeBufs.Put(bp)
	}
}

// parallel runs fn(0..n-1) at once (fn(0) on the calling goroutine) and
// joins their errors.
func parallel(n int, fn func(int) error) error {
	if n == 1 {
		return fn(0)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for j := 1; j < n; j++ {
		wg.Go(func() { errs[j] = fn(j) })
	}
	if n > 0 {
		errs[0] = fn(0)
	}
	wg.Wait()
	return errors.Join(errs...)
}
