// This file holds the moves of a segment between a load/store tier (cxl,
// local: this host's memory, mapped into its applications) and the rdma
// tier (docs/MOVE.md, "Changing tier"): a demotion copies a load/store
// segment that no other client maps into a new rdma home on a peer; a
// promotion copies an rdma segment that no other client may reach from its
// home on a peer into this host's memory, with the live move's TRACK,
// DIRTY and SEAL at the home. Either keeps the segment's id, name, size
// and bytes, and switches its record over in one commit.

package pool

import (
	"context"
	"fmt"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/device"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// has reports whether a move of segment id is under way (or left to
// finish).
func (ms *moves) has(id uint64) bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	_, ok := ms.m[id]
	return ok
}

// loadStore reports whether t is a tier whose memory is mapped into the
// applications of this host.
func loadStore(t poolv1.Tier) bool { return t == poolv1.Tier_TIER_LOCAL || t == poolv1.Tier_TIER_CXL }

// changesTier reports whether a move of r to tier to changes its tier.
func changesTier(r *record, to poolv1.Tier) bool {
	return to != poolv1.Tier_TIER_UNSPECIFIED && to != r.Tier
}

// tierMovable checks that r can move to tier to, another than its own.
func tierMovable(r *record, to poolv1.Tier) error {
	what := fmt.Sprintf("move segment %d from the %s tier to the %s tier", r.ID, tierName(r.Tier), tierName(to))
	switch {
	case !loadStore(to) && to != poolv1.Tier_TIER_RDMA:
		return fmt.Errorf("%s: %w: unknown tier %d; use local, cxl or rdma", what, errs.ErrInvalid, to)
	case r.Lost:
		return fmt.Errorf("%s: %w", what, errs.ErrSegmentLost)
	case loadStore(r.Tier) && loadStore(to):
		return fmt.Errorf("%s: %w: between two load/store tiers a segment does not move live; allocate one on the %s tier, copy, and free this one", what, errs.ErrNotSupported, tierName(to))
	case r.Tier == poolv1.Tier_TIER_RDMA && r.Home == "":
		return fmt.Errorf("%s: %w: it is homed on this node's own data plane, and only rdma segments placed on a peer move; allocate one on the %s tier, copy, and free this one", what, errs.ErrNotSupported, tierName(to))
	}
	return nil
}

// moveTier moves r, registered as moving, to tier req.ToTier.
func (p *core) moveTier(ctx context.Context, c caller, r record, req *poolv1.MoveRequest, tls moveTLS) (moveResult, error) {
	if r.Tier == poolv1.Tier_TIER_RDMA {
		return p.promote(ctx, c, r, req, tls)
	}
	return p.demote(ctx, c, r, req, tls)
}

// demote moves a load/store segment that no client but c maps to an rdma
// home on a peer (req.ToNode, or one placement picks). Nothing can write
// it meanwhile (c unmapped it, and no descriptor is handed out while it
// moves), so one copy suffices; the pause is the whole move.
func (p *core) demote(ctx context.Context, c caller, r record, req *poolv1.MoveRequest, tls moveTLS) (res moveResult, err error) {
	defer p.moving.end(r.ID)
	res = moveResult{rec: r, from: p.cfg.Node, fromTier: r.Tier}
	p.mu.Lock()
	who := p.mappersOf(r.ID, c)
	desc := p.describeMappers(who)
	d := p.device(r.Device)
	admitted := p.admitted(c, poolv1.Tier_TIER_RDMA, r.Size)
	p.mu.Unlock()
	switch {
	case len(who) > 0:
		return res, errMappedBy(r.ID, desc)
	case admitted != nil:
		return res, fmt.Errorf("move segment %d to the rdma tier: %w", r.ID, admitted)
	case d == nil:
		return res, fmt.Errorf("move segment %d: its device %s went away: %w", r.ID, r.Device, errs.ErrSegmentLost)
	case p.cl == nil:
		return res, fmt.Errorf("move segment %d to the rdma tier: %w: this daemon places rdma segments on peers and gossips with nobody (start it with --join)", r.ID, errs.ErrNoCapacity)
	}
	mp, err := p.mapLocal(d, r)
	if err != nil {
		return res, err
	}
	defer mp.Close()
	to, dst, err := p.moveTarget(ctx, req.ToNode, r)
	if err != nil {
		return res, fmt.Errorf("move segment %d to the rdma tier: %w", r.ID, err)
	}
	m := &mover{p: p, rec: r, dst: dst, to: to, tls: tls, chunk: moveChunk(r.Size), local: mp.Bytes()[:r.Size], localKind: rdma.OpWrite}
	m.in = intent{ID: r.ID, To: to}
	p.moving.set(m.in)
	defer func() { res.bytes = m.copied.Load() }()
	seg, err := m.allocTarget(ctx)
	if err != nil {
		return res, fmt.Errorf("move segment %d: alloc on %s: %w", r.ID, to, err)
	}
	defer func() {
		if err != nil {
			p.freeLaterAt(to, seg.Id)
		}
	}()
	if err := m.authorize(ctx, r.Attached, seg.Id, false); err != nil {
		return res, err
	}
	if m.dstConn, err = m.dial(ctx, to, seg.DataAddr, seg.DataTls, dst); err != nil {
		return res, err
	}
	defer m.dstConn.Close()
	m.dstReg = regionOf(seg)
	began := time.Now()
	if err := m.copyAll(ctx); err != nil {
		return res, err
	}
	next, err := p.switchTier(r, func(next *record) error {
		next.Tier, next.Device, next.Offset, next.Extent = poolv1.Tier_TIER_RDMA, "peer", 0, 0
		setHome(next, to, seg)
		return nil
	})
	if err != nil {
		return res, err
	}
	mp.Close() // before the extent goes
	p.mu.Lock()
	p.freeExtent(d, r)
	p.mu.Unlock()
	res.rec, res.rounds, res.pause = next, 1, time.Since(began)
	m.syncAttachers()
	return res, nil
}

// errFreedMoving is the failure of a tier move of segment id that was
// freed meanwhile.
func errFreedMoving(id uint64) error {
	return fmt.Errorf("move segment %d: %w: it was freed during the move, which was undone", id, errs.ErrNotFound)
}

// mapLocal maps r's memory on d for the copy of its demotion.
func (p *core) mapLocal(d *dev, r record) (*device.Mapping, error) {
	b, err := d.Open(r.ID, r.Offset, r.Extent)
	if err == nil {
		var mp *device.Mapping
		mp, err = device.Map(b)
		b.File.Close()
		if err == nil {
			return mp, nil
		}
	}
	p.mu.Lock()
	cur, ok := p.segs[r.ID]
	freed := !ok || cur.Device != r.Device || cur.Offset != r.Offset
	p.mu.Unlock()
	if freed {
		return nil, errFreedMoving(r.ID)
	}
	return nil, fmt.Errorf("move segment %d: map its memory on %s: %w", r.ID, r.Device, err)
}

// promote moves an rdma segment from its home on a peer into this host's
// memory on tier req.ToTier, while its clients use it: no client but c
// may reach it (a load/store segment is reached by mapping it, from this
// host only). The copy is a live move's (docs/MOVE.md) with this node's
// new extent as its target.
func (p *core) promote(ctx context.Context, c caller, r record, req *poolv1.MoveRequest, tls moveTLS) (res moveResult, err error) {
	to := req.ToTier
	res = moveResult{rec: r, from: r.Home, fromTier: r.Tier}
	p.mu.Lock()
	who := p.usersOf(&r, c.id())
	desc := p.describeClients(who)
	p.mu.Unlock()
	switch {
	case len(who) > 0:
		p.moving.end(r.ID)
		return res, fmt.Errorf("move segment %d to the %s tier: %w: clients %s may reach it over the data plane, and a load/store segment is reached only by mapping it on this host; they let go of it with Segment.Close (or end), then move it again", r.ID, tierName(to), errs.ErrInUse, desc)
	case req.ToNode != "" && req.ToNode != p.cfg.Node:
		p.moving.end(r.ID)
		return res, fmt.Errorf("move segment %d to the %s tier of %s: %w: a load/store tier is the memory of the host whose daemon holds the segment (%s); ask that daemon with no --to", r.ID, tierName(to), req.ToNode, errs.ErrInvalid, p.cfg.Node)
	}
	src, err := p.homeSession(ctx, r.Home, "source")
	if err != nil {
		p.moving.end(r.ID)
		return res, fmt.Errorf("move segment %d: %w", r.ID, err)
	}
	d, off, length, mp, err := p.reserveFor(c, to, r)
	if err != nil {
		p.moving.end(r.ID)
		return res, fmt.Errorf("move segment %d to the %s tier: %w", r.ID, tierName(to), err)
	}
	defer mp.Close()
	m := &mover{p: p, rec: r, src: src, to: p.cfg.Node, tls: tls, chunk: moveChunk(r.Size), local: mp.Bytes()[:r.Size], localKind: rdma.OpRead, rate: p.moveRate}
	m.in = intent{ID: r.ID, From: r.Home, FromID: r.HomeID, To: p.cfg.Node}
	p.moving.set(m.in)
	defer func() { res.bytes = m.copied.Load() }()
	if err := p.st.putIntent(m.in); err != nil {
		p.moving.end(r.ID)
		p.dropExtent(d, mp, r.ID, off, length)
		return res, fmt.Errorf("move segment %d: commit the move intent: %w", r.ID, err)
	}
	defer func() {
		if err != nil {
			p.dropExtent(d, mp, r.ID, off, length)
			p.abortMove(m.in, err)
		}
	}()
	if err := m.connectSource(ctx); err != nil {
		return res, err
	}
	defer m.srcConn.Close()
	if _, err := m.moveOut(ctx, poolv1.MoveOutPhase_MOVE_OUT_TRACK); err != nil {
		return res, err
	}
	if err := m.copyAll(ctx); err != nil {
		return res, err
	}
	dirty, err := m.settle(ctx)
	if err != nil {
		return res, err
	}
	sealed := time.Now()
	last, err := m.moveOut(ctx, poolv1.MoveOutPhase_MOVE_OUT_SEAL)
	if err != nil {
		return res, err
	}
	orBitmap(dirty, last.Dirty)
	m.rate = nil // writes wait for the last round: it goes at full speed
	if err := m.copyChunks(ctx, dirty); err != nil {
		return res, err
	}
	m.res.rounds++
	next, err := p.switchTier(r, func(next *record) error {
		if p.device(d.Name()) != d {
			// Replaced during the copy: the new device's allocator does
			// not hold the extent, which another segment may take.
			return fmt.Errorf("its new extent on %s: %w; it stays at its home %s: move it again", d.Name(), errDeviceChanged, r.Home)
		}
		next.Tier, next.Device, next.Offset, next.Extent = to, d.Name(), off, length
		next.Key, next.Home, next.HomeID, next.DataAddr, next.DataTLS, next.Epoch, next.Sealed = rdma.Key{}, "", 0, "", nil, 1, false
		return nil
	}, m.in.ID)
	if err != nil {
		return res, err
	}
	res.rec, res.rounds, res.pause = next, m.res.rounds, time.Since(sealed)
	// The record names no home now: the source lets the segment go, or,
	// when it cannot be told, frees it as an orphan at its next reconcile
	// with this node.
	if _, err := m.moveOut(ctx, poolv1.MoveOutPhase_MOVE_OUT_COMMIT); err != nil {
		p.log.Warn("promoted segment: its old home is to let it go, and frees it at its next reconcile", "segment", r.ID, "node", r.Home, "err", err)
	}
	p.moving.end(r.ID)
	return res, nil
}

// usersOf is who but except may use r now: its owner and attachers that
// hold a session. (One without a session that reaches the segment's old
// home after the promotion is told MOVED, and its daemon, once it is back,
// that the segment is on a load/store tier: a typed error, nothing
// applied.) p.mu is held.
func (p *core) usersOf(r *record, except string) []string {
	var out []string
	for _, c := range append([]string{r.Owner}, r.Attached...) {
		if cl := p.clients[c]; c != "" && c != except && cl != nil && cl.sessions > 0 {
			out = append(out, c)
		}
	}
	return out
}

// reserveFor reserves an extent for r on a device of tier t (admitted as
// an allocation of c's) and creates its backing under r's id, mapped for
// the copy; the extent is r's once its record names it.
func (p *core) reserveFor(c caller, t poolv1.Tier, r record) (*dev, int64, int64, *device.Mapping, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.admitted(c, t, r.Size); err != nil {
		return nil, 0, 0, nil, err
	}
	var tried []string
	for _, d := range p.devs {
		if d.tier != t || !d.usable {
			continue
		}
		off, err := d.ext.Alloc(r.Size)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", d.Name(), err))
			continue
		}
		length := roundUp(r.Size, d.Align())
		b, err := d.Create(r.ID, off, length)
		if err != nil {
			d.ext.Free(off, length)
			return nil, 0, 0, nil, fmt.Errorf("create its backing on %s: %w", d.Name(), err)
		}
		mp, err := device.Map(b)
		b.File.Close()
		if err != nil {
			p.freeExtent(d, record{ID: r.ID, Offset: off, Extent: length})
			return nil, 0, 0, nil, fmt.Errorf("map its backing on %s: %w", d.Name(), err)
		}
		return d, off, length, mp, nil
	}
	if len(tried) == 0 {
		tried = append(tried, p.whyNoTier(t))
	}
	return nil, 0, 0, nil, fmt.Errorf("%w for %d bytes on this node (%s): %v", errs.ErrNoCapacity, r.Size, p.cfg.Node, tried)
}

// dropExtent unmaps and frees the extent a promotion reserved for segment
// id and did not use.
func (p *core) dropExtent(d *dev, mp *device.Mapping, id uint64, off, length int64) {
	mp.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.freeExtent(d, record{ID: id, Offset: off, Extent: length})
}

// admitted admits n bytes of c's on tier t as an allocation (quotas,
// limits), or says why not; p.mu is held.
func (p *core) admitted(c caller, t poolv1.Tier, n int64) error {
	why, err := p.admit(c, t, n)
	if err == nil && why != "" {
		err = fmt.Errorf("%w: %s", errs.ErrNoCapacity, why)
	}
	return err
}

// freeExtent removes the backing of r's extent on d and frees the extent;
// p.mu is held.
func (p *core) freeExtent(d *dev, r record) {
	if err := d.Remove(r.ID, r.Offset, r.Extent); err != nil {
		p.log.Warn("remove the backing a tier move left", "segment", r.ID, "device", d.Name(), "err", err)
	}
	if err := d.ext.Free(r.Offset, r.Extent); err != nil {
		p.log.Warn("return the extent a tier move left", "segment", r.ID, "device", d.Name(), "err", err)
	}
}

// switchTier commits r's record as change makes it, the switch-over of a
// tier move, and then removes the move intent of segment intentID when one
// is given (a restart that finds the intent still asks the old home to
// unseal what no record names any more, which its reconcile with this node
// then frees). The record must still be the segment as it was (else it
// was freed during the move: ErrNotFound); it stays in the store file it
// was in (its volatility is its own). It returns the record committed.
func (p *core) switchTier(r record, change func(*record) error, intentID ...uint64) (record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur, ok := p.segs[r.ID]
	if !ok || cur.Tier != r.Tier || cur.Device != r.Device || cur.Offset != r.Offset || cur.Home != r.Home || cur.HomeID != r.HomeID {
		return record{}, errFreedMoving(r.ID)
	}
	next := *cur
	if err := change(&next); err != nil {
		return record{}, fmt.Errorf("move segment %d: %w", r.ID, err)
	}
	if err := p.st.put(&next); err != nil {
		return record{}, fmt.Errorf("move segment %d: commit the switch-over: %w", r.ID, err)
	}
	for _, id := range intentID {
		if err := p.st.deleteIntent(id); err != nil {
			p.log.Warn("tier move: remove its intent; a restart finishes it", "segment", r.ID, "err", err)
		}
	}
	p.usage.sub(cur)
	*cur = next
	p.usage.add(cur)
	delete(p.mappers, r.ID)
	p.markMapped(r.ID) // its old extent's entry goes
	return next, nil
}

// setHome makes r name seg, its copy at node, as its home.
func setHome(r *record, node string, seg *poolv1.Segment) {
	dataTLS := seg.DataTls
	reg := regionOf(seg)
	r.Home, r.HomeID, r.Key, r.Epoch, r.DataAddr, r.DataTLS, r.Lost = node, seg.Id, reg.Key, seg.Epoch, seg.DataAddr, &dataTLS, false
}

// regionOf is the data-plane region of seg at its home.
func regionOf(seg *poolv1.Segment) rdma.Region {
	var key rdma.Key
	copy(key[:], seg.Key)
	return rdma.Region{Segment: seg.Id, Key: key, Epoch: seg.Epoch}
}

// connectSource dials the source's data plane, as connect does.
func (m *mover) connectSource(ctx context.Context) error {
	r := m.rec
	srcTLS := m.tls.byDefault
	if r.DataTLS != nil {
		srcTLS = *r.DataTLS
	}
	var err error
	m.srcConn, err = m.dial(ctx, r.Home, r.DataAddr, srcTLS, m.src)
	m.srcReg = rdma.Region{Segment: r.HomeID, Key: r.Key, Epoch: r.Epoch}
	return err
}

// copyLocal copies the chunks set in bitmap between this node's mapping
// of the segment (m.local) and its rdma home: writes to the target of a
// demotion, reads from the source of a promotion, in batches of at most
// moveBatch bytes and moveBatchOps spans, one Do each, each waiting for
// its turn under the rate; the first failure ends it.
func (m *mover) copyLocal(ctx context.Context, bitmap []byte) error {
	conn, reg, node := m.dstConn, m.dstReg, m.to
	if m.localKind == rdma.OpRead {
		conn, reg, node = m.srcConn, m.srcReg, m.rec.Home
	}
	var ops []rdma.Op
	var n int64
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		ptrs := make([]*rdma.Op, len(ops))
		for i := range ops {
			ptrs[i] = &ops[i]
		}
		if err := m.rate.wait(ctx, n); err != nil {
			return err
		}
		if err := conn.Do(ctx, ptrs...); err != nil {
			return fmt.Errorf("move segment %d: %w: %s %d spans (%d bytes) at %s from %d: %w", m.rec.ID, errMoveHome, m.localKind, len(ops), n, node, ops[0].Offset, err)
		}
		m.copied.Add(n)
		ops, n = nil, 0
		return nil
	}
	for span := range spans(bitmap, m.chunk, m.rec.Size) {
		if len(ops) == moveBatchOps || n+span[1]-span[0] > moveBatch {
			if err := flush(); err != nil {
				return err
			}
		}
		ops = append(ops, rdma.Op{Kind: m.localKind, Region: reg, Offset: span[0], Buf: m.local[span[0]:span[1]]})
		n += span[1] - span[0]
	}
	return flush()
}
