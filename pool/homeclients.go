package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
)

// Who may use a segment at its home. The home of a segment this daemon
// placed on a peer serves it to the clients this daemon named for it
// there (delegate.go): its owner and attachers here. A credential a home
// delegates names a client, not a segment, so a client the home still
// lists for a segment it detached from here gets back in with any
// credential that home delegates to it (one for another segment of its
// there will do), and through any data-plane connection it keeps open.
// Adding and withdrawing one client at a time (Attach, Detach) leaves
// such a client behind whenever a withdrawal fails, this daemon restarts
// before it could tell the home, or the home restarts. So the lists are
// reconciled: on every session with a home, before a credential that
// home delegates on it is handed to a client, the home is told, per
// segment placed there, the complete list (AuthorizeRequest.sets), which
// replaces its own; and a detach whose withdrawal failed is told the same
// way in the background until told, each try from the record as it is
// then.

// homesTold remembers, per home node, the peer session on which that home
// was last told who may use every segment placed there. It is safe for
// concurrent use.
type homesTold struct {
	mu    sync.Mutex
	nodes map[string]*homeTold
}

// homeTold is one home's: mu is held while the home is told, so that one
// telling serves the callers that wait for it.
type homeTold struct {
	mu  sync.Mutex
	sid string
}

// of is node's entry.
func (ht *homesTold) of(node string) *homeTold {
	ht.mu.Lock()
	defer ht.mu.Unlock()
	if ht.nodes == nil {
		ht.nodes = map[string]*homeTold{}
	}
	h := ht.nodes[node]
	if h == nil {
		h = &homeTold{}
		ht.nodes[node] = h
	}
	return h
}

// toldOn makes sure node was told who may use every segment placed there
// (tellHome) on the session of pc now current, telling it now if not.
func (p *core) toldOn(ctx context.Context, pc *session.Conn, node string) error {
	h := p.told.of(node)
	h.mu.Lock()
	defer h.mu.Unlock()
	_, sid, err := pc.Call(ctx)
	if err != nil || h.sid == sid {
		return err
	}
	if err := p.tellHome(ctx, pc, node, 0); err != nil {
		return err
	}
	h.sid = sid // a session that changed meanwhile is told again
	return nil
}

// tellHomeUp tells node, whose peer session is new, who may use every
// segment placed there; what fails is retried in the background until
// told, nothing is placed there, or node is no alive member (its next
// session is told when it comes up). The first session with a node comes
// up before peers.get keeps it: until then it is asked again.
func (p *core) tellHomeUp(node string) {
	try := func(ctx context.Context) error {
		pc := p.peers.conn(node)
		if pc == nil {
			if m, ok := p.cl.Member(node); !ok || m.State != cluster.StateAlive || len(p.clientsAt(node, 0)) == 0 {
				return nil
			}
			return fmt.Errorf("no session with %s yet: %w", node, errs.ErrHomeUnreachable)
		}
		ctx, cancel := context.WithTimeout(ctx, moveStepTimeout)
		defer cancel()
		err := p.toldOn(ctx, pc, node)
		if err != nil {
			p.log.Debug("tell a home who may use the segments placed there: retrying", "node", node, "err", err)
		}
		return err
	}
	p.peers.later(0, func(ctx context.Context) {
		if try(ctx) != nil {
			p.retryLater(try)
		}
	})
}

// tellLater tells every home of segment seg, in the background, who may
// use it (after a withdrawal there failed): retried, backing off to 30 s,
// until every home the record names then was told, the segment is gone
// or the daemon closes. A home that is down is asked again: a restarted
// one keeps its records, and with them the clients they name.
func (p *core) tellLater(seg uint64) {
	p.retryLater(func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, moveStepTimeout)
		defer cancel()
		if err := p.tellHomes(ctx, seg); err != nil {
			p.log.Debug("tell a segment's homes who may use it: retrying", "segment", seg, "err", err)
			return err
		}
		p.log.Info("a segment's homes were told who may use it after a retry", "segment", seg)
		return nil
	})
}

// tellHomes tells every home the record of segment seg names now who may
// use its copy there (tellHome), and the target of its move under way,
// whose copy is allocated, who may use that copy; a segment held here has
// none.
func (p *core) tellHomes(ctx context.Context, seg uint64) error {
	to := p.moving.copyTarget(seg, p.cfg.Node)
	p.mu.Lock()
	var nodes []string
	if r, ok := p.segs[seg]; ok {
		nodes = r.homeNodes()
		if to != "" && !r.redundant() && !slices.Contains(nodes, to) {
			nodes = append(nodes, to) // clientsAt lists the copy there
		}
	}
	p.mu.Unlock()
	var failed []error
	for _, node := range nodes {
		pc, err := p.homeSession(ctx, node, "home")
		if err == nil {
			err = p.tellHome(ctx, pc, node, seg)
		}
		if err != nil {
			failed = append(failed, fmt.Errorf("segment %d: its home %s was not told who may use it: %w", seg, node, err))
		}
	}
	return errors.Join(failed...)
}

// tellHome tells node, over pc, who may use the copies there of segment
// seg (0: of every segment placed there), replacing the lists it keeps,
// and reads the records again until what it told matches them: an Attach
// or Detach committed meanwhile tells node itself, in any order with
// these calls.
func (p *core) tellHome(ctx context.Context, pc *session.Conn, node string, seg uint64) error {
	told := map[uint64][]string{}
	for {
		var due []*poolv1.SegmentClients
		for id, clients := range p.clientsAt(node, seg) {
			if was, ok := told[id]; !ok || !slices.Equal(was, clients) {
				due = append(due, &poolv1.SegmentClients{Id: id, ClientIds: clients})
			}
		}
		if len(due) == 0 {
			return nil
		}
		for len(due) > 0 {
			n, names := 0, 0
			for n < len(due) && n < maxAuthorizeIDs && names+len(due[n].ClientIds) <= maxAuthorizeIDs {
				names += len(due[n].ClientIds)
				n++
			}
			_, err := callAt(ctx, pc, moveStepTimeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.AuthorizeResponse, error) {
				return api.Authorize(ctx, &poolv1.AuthorizeRequest{Sets: due[:n]})
			})
			if errors.Is(err, errs.ErrInvalid) {
				err = p.tellOldHome(ctx, pc, node, due[:n])
			}
			if err != nil {
				return fmt.Errorf("tell %s who may use %d segments placed there: %w", node, n, err)
			}
			for _, s := range due[:n] {
				told[s.Id] = s.ClientIds
			}
			due = due[n:]
		}
	}
}

// tellOldHome is tellHome's way with a home that does not take complete
// lists: an older poold, which knows no sets and refuses the request as
// one without a client id (ErrInvalid). Each client of sets is added to
// the segments it may use there, as such a home was told before; none is
// withdrawn, so a detach takes effect there once the home is upgraded
// (logged).
func (p *core) tellOldHome(ctx context.Context, pc *session.Conn, node string, sets []*poolv1.SegmentClients) error {
	by := map[string][]uint64{}
	for _, s := range sets {
		for _, c := range s.ClientIds {
			by[c] = append(by[c], s.Id)
		}
	}
	for c, ids := range by {
		for chunk := range slices.Chunk(ids, maxAuthorizeIDs) {
			_, err := callAt(ctx, pc, moveStepTimeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.AuthorizeResponse, error) {
				return api.Authorize(ctx, &poolv1.AuthorizeRequest{ClientId: c, Ids: chunk})
			})
			if err != nil {
				return fmt.Errorf("tell %s (which takes no complete lists) that %s may use %d segments: %w", node, c, len(chunk), err)
			}
		}
	}
	p.log.Warn("a home takes no complete lists of who may use its segments (an older poold): clients are added there, none withdrawn, so a detach takes effect there once it is upgraded",
		"node", node, "segments", len(sets))
	return nil
}

// clientsAt is, by id at node, who may use the copies there of segment
// seg (0: of every segment placed there): the owner and the attachers,
// and the source of a move to node while that move may write the copy
// (delegateSource); sorted, at most maxGrants (those beyond, the last to
// attach, the home refused at their Attach already). The copy a move
// allocated at node is among them before the switch-over: clients attach
// and detach at the source until then, and the target serves the copy to
// those it lists, to the clients told of it ahead (the moving notice)
// once the source hands it over.
func (p *core) clientsAt(node string, seg uint64) map[uint64][]string {
	copies := p.moving.copiesTo(node)
	out := map[uint64][]string{}
	p.mu.Lock()
	defer p.mu.Unlock()
	add := func(r *record) {
		ids := r.idsOn(node)
		mv, moving := copies[r.ID]
		if moving && !r.redundant() && !slices.Contains(ids, mv.ToID) {
			ids = append(ids, mv.ToID)
		}
		for _, id := range ids {
			source := ""
			if moving && id == mv.ToID {
				source = moveSourceClient(mv.From)
			}
			var clients []string
			for _, c := range slices.Concat([]string{r.Owner, source}, r.Attached) {
				if validDelegation(c, "", false) == nil && !slices.Contains(clients, c) {
					clients = append(clients, c)
				}
			}
			clients = clients[:min(len(clients), maxGrants)]
			slices.Sort(clients)
			out[id] = clients
		}
	}
	if seg != 0 {
		if r, ok := p.segs[seg]; ok {
			add(r)
		}
		return out
	}
	for _, r := range p.segs {
		add(r)
	}
	return out
}

// copiesTo is, by the segment's id here, the moves to node whose copy
// there is allocated and not being undone.
func (ms *moves) copiesTo(node string) map[uint64]intent {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	out := map[uint64]intent{}
	for _, in := range ms.m {
		if in.To == node && in.copyHeld() {
			out[in.ID] = *in
		}
	}
	return out
}

// copyHeld reports whether the target holds the copy of move in for it:
// allocated, and not being undone.
func (in *intent) copyHeld() bool { return in.From != "" && in.ToID != 0 && !in.undoing }

// copyTarget is the node, other than self, where a move of segment id
// under way allocated its copy, not being undone; "" when none.
func (ms *moves) copyTarget(id uint64, self string) string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if in := ms.m[id]; in != nil && in.copyHeld() && in.To != self {
		return in.To
	}
	return ""
}

// homeNodes is the nodes that hold r's copy or its copies and shards (of
// a redundant segment, those not lost); none for a segment homed here.
func (r *record) homeNodes() []string {
	if !r.redundant() {
		if r.Home == "" {
			return nil
		}
		return []string{r.Home}
	}
	var nodes []string
	for _, h := range r.Homes {
		if h.State != poolv1.HomeState_HOME_STATE_LOST && !slices.Contains(nodes, h.Node) {
			nodes = append(nodes, h.Node)
		}
	}
	return nodes
}

// The attachments of a moved segment at its new home. A move authorizes
// the segment's attachers at the target when it allocates the copy there
// (mover.run, moveTier); clients attach and detach meanwhile at the
// source, which the record names until the switch-over. Once switched,
// the target is told who may use the copy as the record says then
// (tellHome): a client attached meanwhile gets access there, and one
// detached meanwhile loses it. The withdrawal matters most: the target
// serves the copy to every principal its record names, so a client left
// there would keep reading and writing a segment no longer its own with
// any credential the target delegates to it (one for another segment of
// its there will do). What cannot be told now is retried in the
// background (tellLater) until told, and every try reads the record as it
// is then: the client may have attached again, or the segment gone
// elsewhere, meanwhile.

// syncAttachers tells the target of a switched move, over the move's
// session, who may use the segment's copy there; what fails is retried in
// the background.
func (m *mover) syncAttachers() {
	ctx, cancel := context.WithTimeout(context.Background(), moveStepTimeout)
	defer cancel()
	if err := m.p.tellHome(ctx, m.dst, m.to, m.rec.ID); err != nil {
		m.p.log.Warn("moved segment: its new home is not told yet of the attachments made or withdrawn during the move; retrying (a client detached meanwhile may use it there until then)", "segment", m.rec.ID, "node", m.to, "err", err)
		m.p.tellLater(m.rec.ID)
	}
}
