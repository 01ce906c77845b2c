package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/rdma"
)

// peerClientPrefix marks the client id a daemon uses at its peers: the
// peer-held segments of node A belong to client "poold/A", kept alive by
// one session from A, and reclaimed by the peer when A's lease ends.
const peerClientPrefix = "poold/"

// peers holds this daemon's sessions with the daemons it places segments on.
// It is safe for concurrent use.
type peers struct {
	self string
	log  *slog.Logger
	// onUp runs when a session with a peer is (re)established.
	onUp func(node string)

	mu    sync.Mutex
	conns map[string]*session.Conn
	wg    sync.WaitGroup // asynchronous frees
	done  bool
	// stop cancels asynchronous frees at close: a peer that does not answer
	// reclaims the segments itself when this daemon's lease there ends.
	stop chan struct{}
}

// get returns the session with node, dialing it at addr.
func (ps *peers) get(ctx context.Context, node, addr string) (*session.Conn, error) {
	ps.mu.Lock()
	if ps.done {
		ps.mu.Unlock()
		return nil, fmt.Errorf("peers: %w", errs.ErrUnavailable)
	}
	if c := ps.conns[node]; c != nil && c.Addr() == addr {
		ps.mu.Unlock()
		return c, nil
	}
	ps.mu.Unlock()
	c, err := session.Dial(ctx, "tcp", addr, session.Options{
		ClientID: peerClientPrefix + ps.self, ClientName: "poold " + ps.self,
		OnUp: func(string) {
			if ps.onUp != nil {
				go ps.onUp(node)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("peer %s at %s: %w", node, addr, err)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.done {
		c.Close()
		return nil, fmt.Errorf("peers: %w", errs.ErrUnavailable)
	}
	if old := ps.conns[node]; old != nil {
		if old.Addr() == addr {
			c.Close()
			return old, nil
		}
		old.Close()
	}
	ps.conns[node] = c
	return c, nil
}

// conn returns the existing session with node, if any.
func (ps *peers) conn(node string) *session.Conn {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.conns[node]
}

// freeLater frees a segment at its home in the background; a failure is
// logged (the home reclaims it when this daemon's lease there ends).
func (ps *peers) freeLater(node string, homeID uint64) {
	c := ps.conn(node)
	if c == nil {
		return
	}
	ps.mu.Lock()
	if ps.done {
		ps.mu.Unlock()
		return
	}
	ps.wg.Add(1)
	ps.mu.Unlock()
	go func() {
		defer ps.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		go func() {
			select {
			case <-ps.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		cctx, _, err := c.Call(ctx)
		if err == nil {
			_, err = c.API().Free(cctx, &poolv1.FreeRequest{Id: homeID})
			err = errs.FromStatus(err)
		}
		if err != nil && !errors.Is(err, errs.ErrNotFound) {
			ps.log.Warn("free at the home node failed; it reclaims the segment when this daemon's lease there ends", "node", node, "segment", homeID, "err", err)
		}
	}()
}

func (ps *peers) close() {
	ps.mu.Lock()
	if !ps.done {
		close(ps.stop)
	}
	ps.done = true
	conns := ps.conns
	ps.conns = map[string]*session.Conn{}
	ps.mu.Unlock()
	ps.wg.Wait()
	for _, c := range conns {
		c.Close()
	}
}

// allocRemote places a segment on a peer chosen by free capacity and
// records it here; errNoPeer when no peer can take it.
func (p *Pool) allocRemote(ctx context.Context, c caller, req AllocRequest) (*record, error) {
	if p.cl == nil {
		return nil, errNoPeer
	}
	m, err := cluster.Pick(p.cl.Members(), tierName(poolv1.Tier_TIER_RDMA), req.Size, p.cfg.Node, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoPeer, err)
	}
	pc, err := p.peers.get(ctx, m.Name, m.Meta.GRPCAddr)
	if err != nil {
		return nil, err
	}
	cctx, _, err := pc.Call(ctx)
	if err != nil {
		return nil, err
	}
	// Until the record is committed below, reconcile must not take the new
	// segment for an orphan.
	p.mu.Lock()
	p.pendingRemote[m.Name]++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.pendingRemote[m.Name]--
		p.mu.Unlock()
	}()
	seg, err := pc.API().Alloc(cctx, &poolv1.AllocRequest{Size: req.Size, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true})
	if err != nil {
		return nil, fmt.Errorf("alloc on peer %s: %w", m.Name, errs.FromStatus(err))
	}
	var key rdma.Key
	copy(key[:], seg.Key)
	p.mu.Lock()
	defer p.mu.Unlock()
	if req.Name != "" {
		if _, ok := p.names[req.Name]; ok {
			p.peers.freeLater(m.Name, seg.Id)
			return nil, fmt.Errorf("alloc %q: %w", req.Name, errs.ErrExists)
		}
	}
	id, err := p.newID()
	if err != nil {
		p.peers.freeLater(m.Name, seg.Id)
		return nil, err
	}
	r := &record{
		ID: id, Name: req.Name, Tier: tierName(poolv1.Tier_TIER_RDMA), Device: "peer", Size: req.Size,
		Owner: c.id(), Persist: req.Persist, Epoch: seg.Epoch, Created: p.now().UTC(), Key: key.String(),
		Home: m.Name, HomeID: seg.Id, DataAddr: seg.DataAddr,
	}
	if err := p.st.put(r); err != nil {
		p.peers.freeLater(m.Name, seg.Id)
		return nil, fmt.Errorf("alloc: commit to the metadata store: %w", err)
	}
	p.segs[id] = r
	if r.Name != "" {
		p.names[r.Name] = id
	}
	p.log.Debug("alloc on peer", "segment", id, "node", m.Name, "home-id", seg.Id, "size", r.Size)
	cp := *r
	return &cp, nil
}

// errNoPeer says that no peer can take a placement (none alive, all
// draining or full); the caller falls back to its own memory.
var errNoPeer = errors.New("no peer can take it")

// homeChanged marks the segments homed on node lost (down) or checks them
// with the home and marks the surviving ones reachable again (up), and
// tells their owners.
func (p *Pool) homeChanged(node string, up bool) {
	if up {
		p.reconcile(node)
	}
	p.mu.Lock()
	var homed []*record
	for _, r := range p.segs {
		if r.Home == node {
			homed = append(homed, r)
		}
	}
	p.mu.Unlock()
	if len(homed) == 0 {
		return
	}
	alive := map[uint64]bool{}
	dataAddr := ""
	if up && p.cl != nil {
		if m, ok := p.cl.Member(node); ok {
			dataAddr = m.Meta.DataAddr
		}
	}
	if up {
		if pc := p.peers.conn(node); pc != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			for _, r := range homed {
				cctx, _, err := pc.Call(ctx)
				if err != nil {
					break
				}
				seg, err := pc.API().Stat(cctx, &poolv1.StatRequest{Id: r.HomeID})
				alive[r.ID] = err == nil && seg.State == poolv1.SegmentState_SEGMENT_STATE_ACTIVE && seg.Owner == peerClientPrefix+p.cfg.Node
			}
			cancel()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	byOwner := map[string]*poolv1.SegmentEvents{}
	n := 0
	for _, r := range homed {
		lost := !alive[r.ID]
		if !lost && dataAddr != "" {
			r.DataAddr = dataAddr // a restarted home may serve on another port
		}
		if r.Lost == lost || p.segs[r.ID] != r {
			continue
		}
		r.Lost = lost
		n++
		ev := byOwner[r.Owner]
		if ev == nil {
			ev = &poolv1.SegmentEvents{}
			byOwner[r.Owner] = ev
		}
		ev.Lost = appendIf(ev.Lost, r.ID, lost)
		ev.Restored = appendIf(ev.Restored, r.ID, !lost)
		for _, a := range r.Attached {
			if byOwner[a] == nil {
				byOwner[a] = &poolv1.SegmentEvents{}
			}
			byOwner[a].Lost = appendIf(byOwner[a].Lost, r.ID, lost)
			byOwner[a].Restored = appendIf(byOwner[a].Restored, r.ID, !lost)
		}
	}
	if n > 0 {
		if up {
			p.log.Info("segments on a returning node", "node", node, "restored", countIf(homed, false), "lost", countIf(homed, true))
		} else {
			p.log.Warn("segments lost: their home node is gone", "node", node, "segments", n)
		}
		p.notifyLocked(byOwner)
	}
}

// reconcile frees the segments node holds for this daemon that no record
// here names any more (a free that failed while node was unreachable), so
// that their capacity returns even while this daemon's session there lives.
func (p *Pool) reconcile(node string) {
	pc := p.peers.conn(node)
	if pc == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cctx, _, err := pc.Call(ctx)
	if err != nil {
		return
	}
	resp, err := pc.API().List(cctx, &poolv1.ListRequest{})
	if err != nil {
		return
	}
	p.mu.Lock()
	pending := p.pendingRemote[node]
	known := map[uint64]bool{}
	for _, r := range p.segs {
		if r.Home == node {
			known[r.HomeID] = true
		}
	}
	p.mu.Unlock()
	if pending > 0 {
		return // an allocation there is not recorded yet; the next reconnect checks again
	}
	for _, seg := range resp.Segments {
		if seg.Owner == peerClientPrefix+p.cfg.Node && !known[seg.Id] {
			p.log.Info("freeing a segment a peer still holds for this node but no record names", "node", node, "segment", seg.Id)
			p.peers.freeLater(node, seg.Id)
		}
	}
}

func appendIf(ids []uint64, id uint64, ok bool) []uint64 {
	if ok && !slices.Contains(ids, id) {
		return append(ids, id)
	}
	return ids
}

func countIf(rs []*record, lost bool) int {
	n := 0
	for _, r := range rs {
		if r.Lost == lost {
			n++
		}
	}
	return n
}
