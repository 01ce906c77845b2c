// This file holds the drain: memctl drain stops placements for peers on a
// node until memctl drain --undo, and with --evacuate also moves the
// segments peers placed here to other nodes (evacuate.go). The state is
// kept in the node's metadata store, so a restarted poold drains (and
// evacuates) on and announces it from its first gossip.

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

// keyDrainSince and keyEvacuateSince, in the meta bucket, hold when the
// node began to drain and to evacuate, in Unix milliseconds (8 bytes, big
// endian); each is absent while the node does not.
var (
	keyDrainSince    = []byte("drain-since")
	keyEvacuateSince = []byte("evacuate-since")
)

// drainState is the node's drain as the store keeps it.
type drainState struct {
	since     time.Time // when the drain began; zero when not draining
	evacSince time.Time // when the evacuation began; zero when not evacuating
}

// drainState reads the drain and the evacuation.
func (s *store) drainState() (ds drainState, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		if ds.since, err = s.metaTime(b, keyDrainSince); err != nil {
			return err
		}
		ds.evacSince, err = s.metaTime(b, keyEvacuateSince)
		return err
	})
	return ds, err
}

// metaTime reads a time kept under key in the meta bucket b; zero when
// absent.
func (s *store) metaTime(b *bolt.Bucket, key []byte) (time.Time, error) {
	switch v := b.Get(key); {
	case v == nil:
		return time.Time{}, nil
	case len(v) == 8:
		return time.UnixMilli(int64(binary.BigEndian.Uint64(v))), nil
	default:
		return time.Time{}, fmt.Errorf("drain record %q of %d bytes, want 8: %s is damaged; restore the data directory from a backup", key, len(v), s.path)
	}
}

// setDrainState commits ds in one transaction; zero times remove their
// keys.
func (s *store) setDrainState(ds drainState) error {
	removal := ds.since.IsZero() && ds.evacSince.IsZero()
	return s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		for _, kv := range []struct {
			key []byte
			t   time.Time
		}{{keyDrainSince, ds.since}, {keyEvacuateSince, ds.evacSince}} {
			var err error
			if kv.t.IsZero() {
				err = b.Delete(kv.key)
			} else {
				err = b.Put(kv.key, binary.BigEndian.AppendUint64(nil, uint64(kv.t.UnixMilli())))
			}
			if err != nil {
				return err
			}
		}
		return nil
	}, removal)
}

// drainState returns the node's drain and evacuation.
func (p *core) drainState() drainState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drained
}

// drain turns placements for peers off (on: the node drains), with
// evacuate also the evacuation on, or both off again (on false): it
// commits the change, applies it, starts or stops the evacuator, and
// gossips it. It returns the state and whether anything changed: a drain
// of a draining node keeps its first start, and a plain drain of an
// evacuating node leaves the evacuation on.
func (p *core) drain(on, evacuate bool) (ds drainState, changed bool, err error) {
	p.drainMu.Lock()
	defer p.drainMu.Unlock()
	if ds, changed, err = p.setDraining(on, evacuate); err != nil {
		return ds, changed, err
	}
	if ds.evacSince.IsZero() {
		p.evac.stop()
	} else {
		p.evac.start()
	}
	if cl := p.gossip(); cl != nil {
		if err := cl.SetMeta(func(m *cluster.Meta) {
			m.Draining, m.DrainingSince, m.Evacuating = on, unixMs(ds.since), !ds.evacSince.IsZero()
		}); err != nil {
			return ds, changed, fmt.Errorf("gossip the drain of %s (it is recorded and applied; run the command again): %w", p.cfg.Node, err)
		}
	}
	return ds, changed, nil
}

// resumeEvacuation starts the evacuator if the store says the node
// evacuates: the daemon's start resumes an evacuation a restart cut short.
func (p *core) resumeEvacuation() {
	p.drainMu.Lock()
	defer p.drainMu.Unlock()
	if !p.drainState().evacSince.IsZero() {
		p.log.Info("evacuating, as memctl drain --evacuate left it: moving the segments peers placed here", "node", p.cfg.Node)
		p.evac.start()
	}
}

// setDraining commits and applies the drain state that drain gossips.
func (p *core) setDraining(on, evacuate bool) (drainState, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ds := p.drained
	now := p.now().Truncate(time.Millisecond) // as the store keeps it
	switch {
	case !on:
		ds = drainState{}
	case ds.since.IsZero():
		ds.since = now
	}
	if on && evacuate && ds.evacSince.IsZero() {
		ds.evacSince = now
	}
	if ds == p.drained {
		return ds, false, nil
	}
	if err := p.st.setDrainState(ds); err != nil {
		return p.drained, false, fmt.Errorf("record the drain of %s: %w", p.cfg.Node, err)
	}
	p.drained = ds
	return ds, true, nil
}

// Drain drains the node named in the request, this one when it names none:
// this node's own drain is committed and gossiped here; another's is
// forwarded to that node's daemon, which keeps it. A query changes
// nothing and answers the state and the evacuation's progress.
func (s *service) Drain(ctx context.Context, req *poolv1.DrainRequest) (*poolv1.DrainResponse, error) {
	p := s.d.pool
	c, err := s.caller(ctx)
	if err == nil && c.client != nil && !strings.HasPrefix(c.id(), peerClientPrefix) {
		err = fmt.Errorf("%w: draining is for administrators (poold --admin) and peer daemons, not %s", errs.ErrAccessDenied, c.ident)
	}
	if err == nil {
		err = checkDrainRequest(req)
	}
	if err != nil {
		return nil, errs.ToStatus(err)
	}
	cl := p.gossip()
	if req.Node == "" || req.Node == s.d.cfg.Node {
		return s.drainSelf(req)
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
	return pc.API().Drain(cctx, &poolv1.DrainRequest{Node: m.Name, Undo: req.Undo, Evacuate: req.Evacuate, Query: req.Query})
}

// checkDrainRequest refuses flags that contradict each other.
func checkDrainRequest(req *poolv1.DrainRequest) error {
	switch {
	case req.Query && (req.Undo || req.Evacuate):
		return fmt.Errorf("%w: a drain query changes nothing; ask it without undo and evacuate", errs.ErrInvalid)
	case req.Undo && req.Evacuate:
		return fmt.Errorf("%w: undo ends the drain and its evacuation; ask it without evacuate", errs.ErrInvalid)
	}
	return nil
}

// drainSelf answers a drain request for this node.
func (s *service) drainSelf(req *poolv1.DrainRequest) (*poolv1.DrainResponse, error) {
	p := s.d.pool
	if req.Evacuate && p.gossip() == nil {
		return nil, errs.ToStatus(fmt.Errorf("%w: node %s is in no cluster (poold without --gossip): there is no other host to evacuate to", errs.ErrInvalid, s.d.cfg.Node))
	}
	ds, changed := p.drainState(), false
	if !req.Query {
		var err error
		if ds, changed, err = p.drain(!req.Undo, req.Evacuate); err != nil {
			return nil, errs.ToStatus(err)
		}
	}
	if changed {
		s.d.log.Info("drain", "node", s.d.cfg.Node, "draining", !ds.since.IsZero(), "evacuating", !ds.evacSince.IsZero())
	}
	return &poolv1.DrainResponse{Node: s.d.cfg.Node, Draining: !ds.since.IsZero(), DrainingSinceUnixMs: unixMs(ds.since),
		Changed: changed, Evacuating: !ds.evacSince.IsZero(), Evacuation: p.evac.progress()}, nil
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
