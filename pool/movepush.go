// This file holds the copy of a live move (docs/MOVE.md) as the source
// runs it: the home a segment leaves reads the chunks from its own memory
// and writes them to the target's copy over the target's data plane, one
// round (PUSH, or the last one in SEAL) each time the origin asks. The
// bytes cross the network once, and the origin's CPU copies none of them.

package pool

import (
	"context"
	"fmt"
	"sync"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// pushers are the source's connections to the targets of the moves of
// segments homed here, by the segment's id here, from the first push of a
// move to its COMMIT or ABORT, or until the segment goes (freed, moved
// away), or until they have not pushed for pusherIdle (a move whose origin
// gave up, or whose ABORT came before a late PUSH): each holds pushLanes
// connections, and one left open holds them for good. A move that ends
// with its COMMIT or ABORT leaves its connections spare, for the next
// push to the same node with the same credential (an evacuation's moves
// of one origin to one target share one), which saves a connection and
// its TLS handshake per lane and move; spares not taken for pusherIdle
// are closed. Safe for concurrent use.
type pushers struct {
	mu     sync.Mutex
	m      map[uint64]*pusher
	spare  map[string][]spareConn // by pusher.lanes
	closed bool
}

// spareConn is a connection a finished push left for the next.
type spareConn struct {
	conn rdma.Conn
	node string
	left time.Time
}

// maxSpare bounds the spare connections kept for one node and credential:
// enough for the pushes of an evacuation's concurrent moves.
const maxSpare = 4 * pushLanes

// pusherIdle is how long a pusher may go without a push before closeIdle
// closes it; a move's rounds follow each other within seconds, and a push
// after it dials the target again.
const pusherIdle = time.Minute

// pusher writes one segment's chunks to its move's target, one round at a
// time, on pushLanes connections.
type pusher struct {
	mu     sync.Mutex // held for a round
	node   string     // the target's node
	lanes  string     // node, address, TLS and credential of the connections
	target string     // lanes and the id of the target's copy
	reused bool       // some connection was a spare
	conns  []rdma.Conn
	region rdma.Region
	bufs   [][]byte  // the batches' buffers, kept from round to round
	used   time.Time // the last get; under pushers.mu
}

// close closes the pusher's connections.
func (pu *pusher) close() {
	for _, c := range pu.conns {
		c.Close()
	}
}

// get returns the pusher of segment seg towards t, with spare
// connections to t's data plane under cred unless fresh, and dialing it
// for the others (over TLS when t serves it, verified with tls.ca under
// t's node name); a pusher towards another target is closed.
func (ps *pushers) get(ctx context.Context, seg uint64, t *poolv1.SegmentHome, cred []byte, tls moveTLS, fresh bool) (*pusher, error) {
	lanes := fmt.Sprintf("%s %s %t %x", t.Node, t.DataAddr, t.DataTls, cred)
	want := fmt.Sprintf("%s %d", lanes, t.HomeId)
	ps.mu.Lock()
	if pu := ps.m[seg]; pu != nil && pu.target == want {
		pu.used = time.Now()
		ps.mu.Unlock()
		return pu, nil
	}
	var key rdma.Key
	if len(t.Key) != len(key) || t.DataAddr == "" {
		ps.mu.Unlock()
		return nil, fmt.Errorf("%w: the target %q of the push has no data-plane address or key", errs.ErrInvalid, t.Node)
	}
	copy(key[:], t.Key)
	pu := &pusher{node: t.Node, lanes: lanes, target: want, region: rdma.Region{Segment: t.HomeId, Key: key, Epoch: t.Epoch}}
	if !fresh {
		spare := ps.spare[lanes]
		n := min(len(spare), pushLanes)
		for _, sc := range spare[len(spare)-n:] {
			pu.conns = append(pu.conns, sc.conn)
		}
		if n > 0 {
			ps.spare[lanes] = spare[:len(spare)-n]
			pu.reused = true
		}
	}
	ps.mu.Unlock()
	for len(pu.conns) < pushLanes {
		conn, err := dialHome(ctx, t.Node, t.DataAddr, t.DataTls, tls.ca, cred)
		if err != nil {
			pu.close()
			return nil, fmt.Errorf("the target of the push: %w", err)
		}
		pu.conns = append(pu.conns, conn)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		pu.close()
		return nil, fmt.Errorf("%w: the daemon is closing", errs.ErrUnavailable)
	}
	if ps.m == nil {
		ps.m, ps.spare = map[uint64]*pusher{}, map[string][]spareConn{}
	}
	if old := ps.m[seg]; old != nil {
		old.close()
	}
	pu.used = time.Now()
	ps.m[seg] = pu
	return pu, nil
}

// closeIdle closes the pushers not used since before, but for one in the
// middle of a round, and the spare connections left before it.
func (ps *pushers) closeIdle(before time.Time) {
	var idle []*pusher
	var stale []rdma.Conn
	ps.mu.Lock()
	for seg, pu := range ps.m {
		if pu.used.Before(before) && pu.mu.TryLock() {
			delete(ps.m, seg)
			idle = append(idle, pu)
		}
	}
	for lanes, spare := range ps.spare {
		keep := spare[:0]
		for _, sc := range spare {
			if sc.left.Before(before) {
				stale = append(stale, sc.conn)
			} else {
				keep = append(keep, sc)
			}
		}
		if len(keep) == 0 {
			delete(ps.spare, lanes)
		} else {
			ps.spare[lanes] = keep
		}
	}
	ps.mu.Unlock()
	for _, pu := range idle {
		pu.close()
		pu.mu.Unlock()
	}
	for _, c := range stale {
		c.Close()
	}
}

// nodes adds the nodes the pushers, and their spare connections, write
// to to into.
func (ps *pushers) nodes(into map[string]bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, pu := range ps.m {
		into[pu.node] = true
	}
	for _, spare := range ps.spare {
		for _, sc := range spare {
			into[sc.node] = true
		}
	}
}

// drop closes the pusher of segment seg, if any.
func (ps *pushers) drop(seg uint64) {
	ps.mu.Lock()
	pu := ps.m[seg]
	delete(ps.m, seg)
	ps.mu.Unlock()
	if pu != nil {
		pu.close()
	}
}

// retire ends the pusher of segment seg, if any, whose move ended (COMMIT,
// ABORT): its connections become spares, once a round under way is over,
// up to maxSpare for its node and credential; the others are closed.
func (ps *pushers) retire(seg uint64) {
	ps.mu.Lock()
	pu := ps.m[seg]
	delete(ps.m, seg)
	ps.mu.Unlock()
	if pu == nil {
		return
	}
	pu.mu.Lock()
	defer pu.mu.Unlock()
	now := time.Now()
	ps.mu.Lock()
	var extra []rdma.Conn
	for _, c := range pu.conns {
		if ps.closed || len(ps.spare[pu.lanes]) >= maxSpare {
			extra = append(extra, c)
			continue
		}
		ps.spare[pu.lanes] = append(ps.spare[pu.lanes], spareConn{conn: c, node: pu.node, left: now})
	}
	ps.mu.Unlock()
	for _, c := range extra {
		c.Close()
	}
}

// close closes every pusher and spare connection; none is made after.
func (ps *pushers) close() {
	ps.mu.Lock()
	m, spare := ps.m, ps.spare
	ps.m, ps.spare, ps.closed = nil, nil, true
	ps.mu.Unlock()
	for _, pu := range m {
		pu.close()
	}
	for _, s := range spare {
		for _, sc := range s {
			sc.conn.Close()
		}
	}
}

// push runs one PUSH step on segment seg (or the last round of a SEAL):
// the chunks changed since the last report, or all of them, written to
// req.Target. It returns the bytes written and the chunks they were.
func (p *core) push(ctx context.Context, seg record, req *poolv1.MoveOutRequest, tls moveTLS) (int64, int, error) {
	if req.Target == nil {
		return 0, 0, fmt.Errorf("%w: the push names no target", errs.ErrInvalid)
	}
	end := seg.Size
	if req.Length > 0 {
		end = min(end, req.Offset+req.Length)
	}
	if req.All && (req.Offset < 0 || req.Length < 0 || req.Offset > seg.Size || end < req.Offset) {
		return 0, 0, fmt.Errorf("%w: push of %d bytes from %d of a segment of %d; use a range within it (length 0: to its end)", errs.ErrInvalid, req.Length, req.Offset, seg.Size)
	}
	// The chunks are taken only while req's move or fill is still the
	// segment's (whileCurrent).
	var chunk int64
	var bitmap []byte
	var n int
	err := p.whileCurrent(seg.ID, req, func() (err error) {
		if chunk, err = p.dp.srv.Chunk(seg.ID); err != nil { // not tracked: this daemon restarted since TRACK
			return err
		}
		if req.All {
			bitmap, n = rangeChunks(req.Offset, end, chunk)
			return nil
		}
		bitmap, n, err = p.dp.dirty(seg.ID)
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	if n == 0 {
		return 0, 0, nil
	}
	// Without a credential the push writes as this daemon (its peer
	// session's credential at the target), which the origin named a
	// writer of the target's copy (Replicate).
	cred := req.Target.DataCredential
	if len(cred) == 0 {
		if _, err := p.ownCredTLS(req.Target.Node, req.Target.DataAddr, req.Target.DataTls); err != nil {
			return 0, 0, err
		}
		pc, err := p.homeSession(ctx, req.Target.Node, "push target")
		if err != nil {
			return 0, 0, fmt.Errorf("%w: the target of the push: %w", errMoveHome, err)
		}
		cred = pc.DataCredential()
	}
	for fresh := false; ; fresh = true {
		pu, err := p.pushing.get(ctx, seg.ID, req.Target, cred, tls, fresh)
		if err != nil {
			return 0, 0, err
		}
		bytes, err := pu.round(ctx, p.dp.srv, seg.ID, spans(bitmap, chunk, seg.Size))
		if err == nil {
			return bytes, n, nil
		}
		p.pushing.drop(seg.ID) // a broken connection is dialed again
		// A spare may have broken while it waited (the target closed
		// it): the round, which writes what the memory holds now, runs
		// again on new connections.
		if !pu.reused || fresh || ctx.Err() != nil {
			return bytes, n, fmt.Errorf("%w: push to %s: %w", errMoveHome, req.Target.Node, err)
		}
	}
}

// rangeChunks is the bitmap of the chunks (of chunk bytes) that hold a
// byte of [from, to), and their count.
func rangeChunks(from, to, chunk int64) ([]byte, int) {
	first, end := from/chunk, (to+chunk-1)/chunk
	all := make([]byte, (end+7)/8)
	for i := first; i < end; i++ {
		all[i/8] |= 1 << (i % 8)
	}
	return all, int(max(end-first, 0))
}

// localReader reads a segment homed here from its memory (the data
// plane's ReadLocal).
type localReader interface {
	ReadLocal(seg uint64, off int64, dst []byte) error
}

// round writes the spans of segment seg, read from mem, to the target: in
// batches of up to moveBatch bytes and moveBatchOps spans, each read into
// a buffer and written in one Do, one batch in flight on each of the
// pusher's connections; the first failure ends it. It returns the bytes
// written.
func (pu *pusher) round(ctx context.Context, mem localReader, seg uint64, spans func(func([2]int64) bool)) (int64, error) {
	pu.mu.Lock()
	defer pu.mu.Unlock()
	var batches [][][2]int64
	var batch [][2]int64
	var n int64
	for span := range spans {
		if len(batch) == moveBatchOps || n+span[1]-span[0] > moveBatch {
			batches, batch, n = append(batches, batch), nil, 0
		}
		batch = append(batch, span)
		n += span[1] - span[0]
	}
	if len(batch) > 0 {
		batches = append(batches, batch)
	}
	workers := min(len(pu.conns), len(batches))
	for len(pu.bufs) < workers {
		pu.bufs = append(pu.bufs, make([]byte, moveBatch))
	}
	if workers == 1 { // the last rounds: a few chunks, no goroutine
		return pu.batch(ctx, mem, seg, pu.conns[0], pu.bufs[0], batches[0])
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan [][2]int64)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total int64
	for w := range workers {
		wg.Go(func() {
			for b := range work {
				k, err := pu.batch(ctx, mem, seg, pu.conns[w], pu.bufs[w], b)
				if err != nil {
					cancel(err)
				}
				mu.Lock()
				total += k
				mu.Unlock()
			}
		})
	}
send:
	for _, b := range batches {
		select {
		case work <- b:
		case <-ctx.Done():
			break send
		}
	}
	close(work)
	wg.Wait()
	return total, context.Cause(ctx)
}

// batch writes one batch's spans to the target: read here into buf, then
// written in one Do on conn. It returns the bytes written.
func (pu *pusher) batch(ctx context.Context, mem localReader, seg uint64, conn rdma.Conn, buf []byte, spans [][2]int64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ops := make([]rdma.Op, len(spans))
	ptrs := make([]*rdma.Op, len(spans))
	var n int64
	for i, span := range spans {
		b := buf[n : n+span[1]-span[0]]
		if err := mem.ReadLocal(seg, span[0], b); err != nil {
			return 0, err
		}
		ops[i] = rdma.Op{Kind: rdma.OpWrite, Region: pu.region, Offset: span[0], Buf: b}
		ptrs[i] = &ops[i]
		n += int64(len(b))
	}
	if err := conn.Do(ctx, ptrs...); err != nil {
		return 0, fmt.Errorf("write %d spans (%d bytes) from %d: %w", len(spans), n, spans[0][0], err)
	}
	return n, nil
}
