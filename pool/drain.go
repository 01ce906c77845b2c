// This file holds the drain: memctl drain stops placements for peers on a
// node until memctl drain --undo. The state is kept in the node's metadata
// store, so a restarted poold drains on and announces it from its first
// gossip. The node's segments stay where they are.

package pool

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
)

// keyDrainSince, in the meta bucket, holds when the node began to drain, in
// Unix milliseconds (8 bytes, big endian); absent while it is not draining.
var keyDrainSince = []byte("drain-since")

// drainSince returns when the node began to drain; zero when it is not.
func (s *store) drainSince() (since time.Time, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketMeta).Get(keyDrainSince)
		switch {
		case v == nil:
		case len(v) == 8:
			since = time.UnixMilli(int64(binary.BigEndian.Uint64(v)))
		default:
			return fmt.Errorf("drain record %q of %d bytes, want 8: %s is damaged; restore the data directory from a backup", keyDrainSince, len(v), s.path)
		}
		return nil
	})
	return since, err
}

// setDrainSince commits since as the drain's start; zero removes the drain.
func (s *store) setDrainSince(since time.Time) error {
	if since.IsZero() {
		return s.update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyDrainSince) }, true)
	}
	v := binary.BigEndian.AppendUint64(nil, uint64(since.UnixMilli()))
	return s.update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyDrainSince, v) }, false)
}

// draining returns when the node began to drain; zero when it is not.
func (p *core) draining() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drainSince
}

// drain turns placements for peers off (on: the node drains) or on again:
// it commits the change, applies it, and gossips it. It returns the drain's
// start (zero when not draining) and whether anything changed: a drain of
// a draining node keeps its first start.
func (p *core) drain(on bool) (since time.Time, changed bool, err error) {
	p.drainMu.Lock()
	defer p.drainMu.Unlock()
	if since, changed, err = p.setDraining(on); err != nil {
		return since, changed, err
	}
	if cl := p.gossip(); cl != nil {
		if err := cl.SetMeta(func(m *cluster.Meta) { m.Draining, m.DrainingSince = on, unixMs(since) }); err != nil {
			return since, changed, fmt.Errorf("gossip the drain of %s (it is recorded and applied; run the command again): %w", p.cfg.Node, err)
		}
	}
	return since, changed, nil
}

// setDraining commits and applies the drain state that drain gossips.
func (p *core) setDraining(on bool) (since time.Time, changed bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on == !p.drainSince.IsZero() {
		return p.drainSince, false, nil
	}
	if on {
		since = p.now().Truncate(time.Millisecond) // as the store keeps it
	}
	if err := p.st.setDrainSince(since); err != nil {
		return p.drainSince, false, fmt.Errorf("record the drain of %s: %w", p.cfg.Node, err)
	}
	p.drainSince = since
	return since, true, nil
}

// Drain drains the node named in the request, this one when it names none:
// this node's own drain is committed and gossiped here; another's is
// forwarded to that node's daemon, which keeps it.
func (s *service) Drain(ctx context.Context, req *poolv1.DrainRequest) (*poolv1.DrainResponse, error) {
	p := s.d.pool
	c, err := s.caller(ctx)
	if err == nil && c.client != nil && !strings.HasPrefix(c.id(), peerClientPrefix) {
		err = fmt.Errorf("%w: draining is for administrators (poold --admin) and peer daemons, not %s", errs.ErrAccessDenied, c.ident)
	}
	if err != nil {
		return nil, errs.ToStatus(err)
	}
	cl := p.gossip()
	if req.Node == "" || req.Node == s.d.cfg.Node {
		since, changed, err := p.drain(!req.Undo)
		if err != nil {
			return nil, errs.ToStatus(err)
		}
		if changed {
			s.d.log.Info("drain", "node", s.d.cfg.Node, "draining", !req.Undo)
		}
		return &poolv1.DrainResponse{Node: s.d.cfg.Node, Draining: !req.Undo, DrainingSinceUnixMs: unixMs(since), Changed: changed}, nil
	}
	if cl == nil {
		return nil, errs.ToStatus(fmt.Errorf("node %q: %w: this daemon is in no cluster; its only node is %q", req.Node, errs.ErrNotFound, s.d.cfg.Node))
	}
	m, ok := cl.Member(req.Node)
	if !ok || m.State != cluster.StateAlive {
		return nil, errs.ToStatus(unknownNode(req.Node, m, ok, cl.Members()))
	}
	pc, err := p.peerConns().get(ctx, m.Name, m.Meta.GRPCAddr)
	if err != nil {
		return nil, errs.ToStatus(err)
	}
	cctx, _, err := pc.Call(ctx)
	if err != nil {
		return nil, errs.ToStatus(err)
	}
	return pc.API().Drain(cctx, &poolv1.DrainRequest{Node: m.Name, Undo: req.Undo})
}

// unknownNode is the error for a drain of a node that is no alive member:
// m is the member when known is true; the message lists the alive ones.
func unknownNode(name string, m cluster.Member, known bool, members []cluster.Member) error {
	var alive []string
	for _, mb := range members {
		if mb.State == cluster.StateAlive {
			alive = append(alive, mb.Name)
		}
	}
	slices.Sort(alive)
	if known {
		return fmt.Errorf("node %q: %w among the alive members: it is %s; its daemon keeps a drain, so start it first (alive: %s)",
			name, errs.ErrNotFound, cluster.StateString(m.State), strings.Join(alive, ", "))
	}
	return fmt.Errorf("node %q: %w: no such member; the alive members are %s (see 'memctl nodes')", name, errs.ErrNotFound, strings.Join(alive, ", "))
}

// unixMs is t in Unix milliseconds, 0 for the zero time.
func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}
