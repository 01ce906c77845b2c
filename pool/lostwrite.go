// This file serves writes and atomics to the chunks of an erasure-coded
// segment's data shard whose home is lost (WriteLostShard). Only a data shard's home
// writes it and sends the parity shards the change, so with that home gone
// the daemon holding the record stands in: it decodes the shard's bytes
// from the other shards, checked against a spare, and sends each parity
// shard its part of the change (old XOR new) as an XOR, which commutes
// with the live data homes' own parity deltas to the same rows. Nothing
// else writes the lost shard, and these writes go one at a time per
// segment (stripeLock), so its bytes cannot change between the decode and
// the XORs, and an atomic on them is one. A write run again (a client's
// retry after a lost answer) computes its change from the bytes as they
// are then, so it is never applied twice; an atomic whose answer was lost
// is not run again (the client reports it indeterminate). A rebuild or a home's move holds the same lock from its
// seal to its switch (rebuildFill.run): no such write lands after its
// last round, and before that the parity shards' dirty tracking makes the
// copy decode the rows again. A home move switched but not finished (its
// finish retried, or left to a restarted origin) refuses them until it
// is, as its sealed writers do (errLostWriteMoving).

package pool

import (
	"context"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

const (
	// maxLostWrite is the most bytes one WriteLostShard writes.
	maxLostWrite = 1 << 20
	// lostWriteRetry is the first wait before the decode of a lost
	// shard's bytes is made again when a spare disagreed (a client's
	// write half applied across the shards read); it doubles up to
	// lostWriteRetryMax, until the caller's deadline.
	lostWriteRetry    = 20 * time.Microsecond
	lostWriteRetryMax = 5 * time.Millisecond
	// lostWriteTimeout bounds one WriteLostShard when its caller set no
	// deadline.
	lostWriteTimeout = 10 * time.Second
)

// errLostWriteMoving is a write to a lost data shard while a home move of
// the segment is switched and its leaving home not let go: the write
// would change the parity shards the record names, the new home and not
// the leaving one, which the move puts back should the new home be lost
// (keepLeaving). The writers are sealed meanwhile too; the client retries.
var errLostWriteMoving = errs.Sub(errs.ErrLimit, "a home of the segment moved and the home it left is not let go yet; the write waits for the move to finish (retry)")

// WriteLostShard writes bytes of a data shard whose home is lost (see the
// file comment).
func (s *service) WriteLostShard(ctx context.Context, req *poolv1.WriteLostShardRequest) (*poolv1.WriteLostShardResponse, error) {
	c, err := s.caller(ctx)
	var resp *poolv1.WriteLostShardResponse
	if err == nil {
		resp, err = s.d.pool.writeLostShard(ctx, c, req, s.d.moveTLS())
	}
	if err != nil {
		s.d.refused("write-lost-shard", c, req.Id, "", err)
		return nil, errs.ToStatus(err)
	}
	return resp, nil
}

// stripe is a segment's state for writes to its lost data shards. Its
// mu orders them; a rebuild or a home's move holds it from its seal to
// its switch. Safe for concurrent use.
type stripe struct {
	mu sync.Mutex
	// reader is the last write's connections to the shards, kept while
	// the shard and the homes it read stay as they were (its i and r) and
	// closed once unused for lostReaderIdle (idle).
	reader *rebuildFill
	idle   *time.Timer
}

// lostReaderIdle is how long a stripe keeps its connections unused.
const lostReaderIdle = 30 * time.Second

// stripe is segment id's stripe.
func (p *core) stripe(id uint64) *stripe {
	st, _ := p.stripes.LoadOrStore(id, new(stripe))
	return st.(*stripe)
}

// readerFor is a reader of shard i of r for a write, st.mu held: the
// kept one if r's shards are where it reads them and none of its spares
// went down, else a new one, kept.
func (st *stripe) readerFor(ctx context.Context, p *core, r record, i int, tls moveTLS) (f *rebuildFill, kept bool, err error) {
	if f = st.reader; f != nil && f.i == i && sameShards(f.r.Homes, r.Homes) && !f.anyDown() {
		st.idle.Reset(lostReaderIdle)
		return f, true, nil
	}
	st.drop()
	if f, err = p.lostShardReader(ctx, r, i, tls); err != nil {
		return nil, false, err
	}
	st.reader = f
	if st.idle == nil {
		st.idle = time.AfterFunc(lostReaderIdle, st.close)
	} else {
		st.idle.Reset(lostReaderIdle)
	}
	return f, false, nil
}

// drop closes the kept reader, st.mu held.
func (st *stripe) drop() {
	if st.reader != nil {
		st.reader.close()
		st.reader = nil
	}
}

// close closes the kept reader (once idle, or the segment freed).
func (st *stripe) close() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.idle != nil {
		st.idle.Stop()
	}
	st.drop()
}

// sameShards reports whether a and b name the same homes in the same
// states (progress aside).
func sameShards(a, b []homeRef) bool {
	return slices.EqualFunc(a, b, func(x, y homeRef) bool {
		return x.Node == y.Node && x.HomeID == y.HomeID && x.Epoch == y.Epoch && x.State == y.State && x.DataAddr == y.DataAddr
	})
}

// lostShardSubject finds the segment of a WriteLostShard request, a copy
// of its record, and checks the request against it.
func (p *core) lostShardSubject(c caller, req *poolv1.WriteLostShardRequest) (record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(req.Id, "")
	if err != nil {
		return record{}, err
	}
	what := fmt.Sprintf("write data shard %d of segment %d", req.Shard, r.ID)
	k := r.Redundancy.Data
	switch {
	case !mayUse(c, r):
		return record{}, fmt.Errorf("%s: %w", what, errs.ErrAccessDenied)
	case k == 0:
		return record{}, fmt.Errorf("%s: %w: the segment is not erasure coded; write it at its home", what, errs.ErrInvalid)
	case int64(req.Shard) >= int64(k):
		return record{}, fmt.Errorf("%s: %w: the segment's data shards are 0 to %d", what, errs.ErrInvalid, k-1)
	case req.Atomic != 0 && req.Atomic != uint32(rdma.OpCompareAndSwap) && req.Atomic != uint32(rdma.OpFetchAdd):
		return record{}, fmt.Errorf("%s: %w: atomic %d; use %d (compare-and-swap) or %d (fetch-and-add)", what, errs.ErrInvalid, req.Atomic, rdma.OpCompareAndSwap, rdma.OpFetchAdd)
	case req.Atomic != 0 && len(req.Data) > 0:
		return record{}, fmt.Errorf("%s: %w: an atomic carries no bytes, and this one carries %d", what, errs.ErrInvalid, len(req.Data))
	case req.Atomic != 0 && req.Offset%8 != 0:
		return record{}, fmt.Errorf("%s: %w: offset %d", what, errs.ErrUnaligned, req.Offset)
	case req.Atomic == 0 && (len(req.Data) == 0 || len(req.Data) > maxLostWrite):
		return record{}, fmt.Errorf("%s: %w: %d bytes; send 1 byte to %d at a time", what, errs.ErrInvalid, len(req.Data), maxLostWrite)
	case req.Offset < 0 || req.Offset > r.shardSize()-lostWriteLen(req):
		return record{}, fmt.Errorf("%s: %w: %d bytes at %d, and the shard holds %d", what, errs.ErrOutOfRange, lostWriteLen(req), req.Offset, r.shardSize())
	case r.Lost:
		return record{}, fmt.Errorf("%s: %w", what, errs.ErrSegmentLost)
	}
	switch h := r.Homes[req.Shard]; h.State {
	case poolv1.HomeState_HOME_STATE_LOST, poolv1.HomeState_HOME_STATE_REBUILDING:
	case poolv1.HomeState_HOME_STATE_OK:
		return record{}, fmt.Errorf("%s: %w: its home on %s is up; write it there (Stat names it)", what, errs.ErrInvalid, h.Node)
	default:
		// Unreachable: kept at its node, whose bytes would be served again
		// if it returns; a change made here would not be in them.
		return record{}, fmt.Errorf("%s: its home on %s may return with its bytes; the write waits for it: %w", what, h.Node, errs.ErrHomeUnreachable)
	}
	out := *r
	out.Homes = append([]homeRef(nil), r.Homes...)
	return out, nil
}

// lostWriteLen is how many bytes of the shard req changes: its data's,
// or an atomic's word.
func lostWriteLen(req *poolv1.WriteLostShardRequest) int64 {
	if req.Atomic != 0 {
		return 8
	}
	return int64(len(req.Data))
}

// writeLostShard applies a WriteLostShard request (see the file comment).
// An error but ErrSegmentLost and a deadline means nothing was changed.
func (p *core) writeLostShard(ctx context.Context, c caller, req *poolv1.WriteLostShardRequest, tls moveTLS) (*poolv1.WriteLostShardResponse, error) {
	if _, err := p.lostShardSubject(c, req); err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, lostWriteTimeout)
		defer cancel()
	}
	st := p.stripe(req.Id)
	st.mu.Lock()
	defer st.mu.Unlock()
	r, err := p.lostShardSubject(c, req) // again: a rebuild may have switched meanwhile
	if err != nil {
		return nil, err
	}
	if in, ok := p.moving.get(r.ID); ok && (in.Switched || in.switching) {
		return nil, fmt.Errorf("write data shard %d of segment %d: %w", req.Shard, r.ID, errLostWriteMoving)
	}
	i, n := int(req.Shard), lostWriteLen(req)
	what := fmt.Sprintf("write data shard %d of segment %d", i, r.ID)
	old := make([]byte, n)
	var f *rebuildFill
	for {
		var kept bool
		f, kept, err = st.readerFor(ctx, p, r, i, tls)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (%w)", what, err, errs.ErrTooFewHomes)
		}
		err = f.decodeChecked(ctx, old, req.Offset)
		if err == nil {
			break
		}
		st.drop()
		if !kept || ctx.Err() != nil { // a kept one may have gone stale: once more on new connections
			return nil, fmt.Errorf("%s: %w", what, err)
		}
	}
	resp := &poolv1.WriteLostShardResponse{}
	data := req.Data
	if req.Atomic != 0 {
		resp.Prev = binary.LittleEndian.Uint64(old)
		next := resp.Prev + req.Delta
		if req.Atomic == uint32(rdma.OpCompareAndSwap) {
			if resp.Prev != req.Old {
				return resp, nil
			}
			next, resp.Swapped = req.New, true
		}
		data = binary.LittleEndian.AppendUint64(nil, next)
	}
	delta := make([]byte, n)
	subtle.XORBytes(delta, old, data)
	k, m := r.Redundancy.Data, r.Redundancy.Parity
	parity := make([][]byte, m)
	for j := range parity {
		parity[j] = make([]byte, n)
	}
	if err := f.enc.EncodeIdx(delta, i, parity); err != nil {
		return nil, fmt.Errorf("%s: encode the change: %w", what, err)
	}
	var wg sync.WaitGroup
	failed := make([]error, m)
	for j := range m {
		h := r.Homes[k+j]
		if h.State == poolv1.HomeState_HOME_STATE_LOST {
			continue
		}
		wg.Go(func() {
			failed[j] = f.xorAt(ctx, k+j, h, req.Offset, parity[j])
		})
	}
	wg.Wait()
	for j, err := range failed {
		if err != nil {
			h := r.Homes[k+j]
			p.homeLost(r.ID, h.Node, h.HomeID, fmt.Sprintf("it missed a write to lost data shard %d: %v", i, err), true)
		}
	}
	if err := errors.Join(failed...); err != nil {
		if cur, ok := p.redundantRecord(r.ID); !ok || cur.Lost {
			return nil, fmt.Errorf("%s: parity shards failed the change (it may be in some), and the segment is lost: %w: %w", what, errs.ErrSegmentLost, err)
		}
	}
	return resp, nil
}

// lostShardReader connects to the OK shards of r other than data shard
// i, to decode i's bytes with at least one spare to check them.
func (p *core) lostShardReader(ctx context.Context, r record, i int, tls moveTLS) (*rebuildFill, error) {
	f := &rebuildFill{p: p, r: r, i: i}
	size := r.shardSize()
	f.m = &mover{p: p, rec: record{ID: r.ID, Size: size}, tls: tls, chunk: moveChunk(size)}
	from, err := p.okPeers(ctx, r, func(j int) bool { return j != i })
	if err != nil {
		return nil, err
	}
	if len(from) <= r.Redundancy.Data {
		return nil, fmt.Errorf("%d other shards are up, and a checked decode needs %d: the write waits for the rebuild", len(from), r.Redundancy.Data+1)
	}
	if err := f.dialShards(ctx, from, maxLostWrite); err != nil {
		return nil, err
	}
	return f, nil
}

// decodeChecked fills buf with shard f.i's bytes at off, decoded from the
// sources and matched by every spare still up, reading again while a
// spare disagrees (a client's write half applied across the shards),
// until ctx ends.
func (f *rebuildFill) decodeChecked(ctx context.Context, buf []byte, off int64) error {
	batch := [][2]int64{{off, off + int64(len(buf))}}
	wait := lostWriteRetry
	for {
		f.suspect = nil
		if err := f.decode(ctx, buf, batch); err != nil {
			return fmt.Errorf("decode its bytes: %w (%w)", err, errs.ErrTooFewHomes)
		}
		switch {
		case f.allDown():
			return fmt.Errorf("decode its bytes: no spare shard answered to check the decode: %w", errs.ErrTooFewHomes)
		case f.suspect == nil:
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("decode its bytes: the other shards kept disagreeing (writes to the same stripes, or a write a lost home left half done, which the rebuild settles): %w", errs.ErrTooFewHomes)
		case <-t.C:
		}
		wait = min(2*wait, lostWriteRetryMax)
	}
}

// anyDown reports whether a spare went down; allDown whether all did.
func (f *rebuildFill) anyDown() bool { return f.downs() > 0 }
func (f *rebuildFill) allDown() bool { return f.downs() == len(f.down) }

// downs counts the spares gone down.
func (f *rebuildFill) downs() int {
	n := 0
	for j := range f.down {
		if f.down[j].Load() {
			n++
		}
	}
	return n
}

// xorAt XORs b into the parity shard at home h (index j of the record)
// at off, on the connection the decode read it through or, for a home
// it did not read (being rebuilt), a new one.
func (f *rebuildFill) xorAt(ctx context.Context, j int, h homeRef, off int64, b []byte) error {
	op := &rdma.Op{Kind: rdma.OpXor, Region: homeRegion(h), Offset: off, Buf: b}
	for _, s := range slices.Concat(f.sources, f.spares) {
		if s.idx == j {
			return s.conn.Do(ctx, op)
		}
	}
	pc, err := f.p.homeSession(ctx, h.Node, "parity shard")
	if err != nil {
		return err
	}
	conn, err := f.m.dial(ctx, h.Node, h.DataAddr, h.DataTLS, pc)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Do(ctx, op)
}
