// This file holds clients, their sessions and leases: who calls, the
// notices queued for a session, and the reclaim of expired leases.

package pool

import (
	"container/list"
	"fmt"
	"slices"
	"strings"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// client is one application identity with its sessions and lease.
type client struct {
	id       string
	name     string
	pid      int64
	uid      uint32
	sessions int
	expires  time.Time // when sessions == 0: when its unpinned segments are reclaimed
}

// caller is who makes a control-plane call: a session's client, or an
// administrator (a call without a session from an identity in
// Config.Admins, e.g. memctl as root).
type caller struct {
	client *client // nil for an administrator
	// ident is the identity the transport proved (uid:N, cn:NAME,
	// insecure); "" for the daemon's own calls.
	ident string
	// gid is the primary gid of a unix-socket caller (local).
	gid   uint32
	local bool
	// pid is a unix-socket caller's process (SO_PEERCRED, as this
	// daemon's pid namespace sees it); 0 when unknown.
	pid int32
	// node says the caller's TLS certificate may serve TLS, as a node's
	// does (certs.ServesTLS): only such a caller may act as a peer daemon.
	node bool
}

func (c caller) id() string {
	if c.client == nil {
		return ""
	}
	return c.client.id
}

// sessionState is one live session: its client and the notices queued for it.
type sessionState struct {
	client *client
	events chan *poolv1.SegmentEvents
}

// openSession starts (or resumes) a client's session and returns the
// channel on which the client's segment notices arrive, and the segments
// its lease's expiry reclaimed, for its Welcome, if the identity ident the
// caller proved is the one the client id was bound to then. A session that
// fails before its Welcome is sent gives them back (unreclaimedTold).
func (p *core) openSession(sessionID, clientID, ident, name string, pid int64, uid uint32) (<-chan *poolv1.SegmentEvents, []uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.clients[clientID]
	if c == nil {
		c = &client{id: clientID}
		p.clients[clientID] = c
	}
	c.name, c.pid, c.uid = name, pid, uid
	c.sessions++
	st := &sessionState{client: c, events: make(chan *poolv1.SegmentEvents, 64)}
	p.sessions[sessionID] = st
	return st.events, p.reclaimed.take(clientID, ident, p.now())
}

// unreclaimedTold puts back the reclaimed segments openSession handed a
// session that ended before its client took its Welcome in, for the next
// one.
func (p *core) unreclaimedTold(clientID, ident string, ids []uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reclaimed.add(clientID, ident, ids, p.now())
}

// Bounds of reclaimNotices: the segment ids held for all clients together
// (8 bytes each, 2 MiB), the clients (each notice also holds its client id
// and identity, up to 255 bytes each), and how long a notice waits for its
// client. A client id that never comes back (the library's default id is
// new in every process) must not hold memory for good. Past a bound the
// oldest notices go; a client whose notice went finds each reclaimed
// segment gone at its next use (ErrLeaseExpired from its home, ErrNotFound
// from the control plane).
const (
	maxReclaimedIDs     = 1 << 18
	maxReclaimedClients = 1 << 14
	maxReclaimedAge     = time.Hour
)

// reclaimNotices keeps, per client id, the segments a lease expiry
// reclaimed until the client's next session takes them (openSession), so
// that an application that came back too late learns at once which of
// its segments are gone rather than at each one's next use. Not safe for
// concurrent use: the core's mu guards it.
type reclaimNotices struct {
	of    map[string]*list.Element // of *reclaimNotice, in order
	order list.List                // the notices by when they last grew, oldest first
	total int                      // ids held in all
}

// reclaimNotice is one client's: the identity its id was bound to when
// its segments ids were reclaimed. The binding of a client left with
// nothing is forgotten (reap), and another identity may take the id next:
// it is not told.
type reclaimNotice struct {
	client, ident string
	ids           []uint64
	at            time.Time // when ids last grew
}

// add records that client's segments ids were reclaimed at now while the
// client id was bound to ident, dropping the notices past the bounds,
// oldest first (and a single notice's oldest ids).
func (n *reclaimNotices) add(client, ident string, ids []uint64, now time.Time) {
	if len(ids) == 0 {
		return
	}
	if n.of == nil {
		n.of = map[string]*list.Element{}
	}
	var rn *reclaimNotice
	if e := n.of[client]; e != nil {
		rn = e.Value.(*reclaimNotice)
		n.order.MoveToBack(e)
		if rn.ident != ident {
			n.total -= len(rn.ids)
			rn.ident, rn.ids = ident, nil
		}
	} else {
		rn = &reclaimNotice{client: client, ident: ident}
		n.of[client] = n.order.PushBack(rn)
	}
	rn.ids = append(rn.ids, ids...)
	rn.at = now
	n.total += len(ids)
	for n.order.Len() > 1 {
		oldest := n.order.Front().Value.(*reclaimNotice)
		if n.total <= maxReclaimedIDs && n.order.Len() <= maxReclaimedClients && now.Sub(oldest.at) < maxReclaimedAge {
			break
		}
		n.remove(oldest)
	}
	if n.total > maxReclaimedIDs {
		rn.ids = slices.Clone(rn.ids[n.total-maxReclaimedIDs:])
		n.total = maxReclaimedIDs
	}
}

// take returns client's notice and forgets it: its ids if ident is the
// identity they were reclaimed under and the notice is younger than
// maxReclaimedAge at now, none otherwise.
func (n *reclaimNotices) take(client, ident string, now time.Time) []uint64 {
	e := n.of[client]
	if e == nil {
		return nil
	}
	rn := e.Value.(*reclaimNotice)
	n.remove(rn)
	if rn.ident != ident || now.Sub(rn.at) >= maxReclaimedAge {
		return nil
	}
	return rn.ids
}

func (n *reclaimNotices) remove(rn *reclaimNotice) {
	n.order.Remove(n.of[rn.client])
	delete(n.of, rn.client)
	n.total -= len(rn.ids)
}

// notifyLocked queues segment notices for every session of each owner; a
// session whose queue is full misses them (its next operation finds out).
func (p *core) notifyLocked(byOwner map[string]*poolv1.SegmentEvents) {
	for _, st := range p.sessions {
		ev := byOwner[st.client.id]
		if ev == nil {
			continue
		}
		select {
		case st.events <- ev:
		default:
			p.log.Warn("segment notice dropped: client not reading its session", "client", st.client.id)
		}
	}
}

// notify queues segment notices as notifyLocked does.
func (p *core) notify(byOwner map[string]*poolv1.SegmentEvents) {
	if len(byOwner) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notifyLocked(byOwner)
}

// closeSession ends a session; the client's lease runs out one TTL after
// its last session ends.
func (p *core) closeSession(sessionID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.sessions[sessionID]
	if st == nil {
		return
	}
	c := st.client
	delete(p.sessions, sessionID)
	c.sessions--
	if c.sessions == 0 {
		c.expires = p.now().Add(p.leaseTTL(c.id))
	}
}

// leaseTTL is how long client id's segments outlive its last session: a
// peer daemon's (PeerLeaseTTL) at least as long as an application's
// (LeaseTTL), since a peer's session also ends with a partition between
// the hosts, after which the peer serves the segments again.
func (p *core) leaseTTL(id string) time.Duration {
	if strings.HasPrefix(id, peerClientPrefix) {
		return max(p.cfg.PeerLeaseTTL, p.cfg.LeaseTTL)
	}
	return p.cfg.LeaseTTL
}

// callerFor resolves a session id ("" for an administrator).
func (p *core) callerFor(sessionID string) (caller, error) {
	if sessionID == "" {
		return caller{}, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.sessions[sessionID]
	if st == nil {
		return caller{}, fmt.Errorf("session %q: %w (the session ended; the client reconnects by itself)", sessionID, errs.ErrLeaseExpired)
	}
	return caller{client: st.client}, nil
}

// reap reclaims the unpinned segments of clients whose lease ran out and
// ends their attachments: under p.mu their removals commit and they leave
// the table, then those the data plane serves are fenced outside it and
// released (dispose), and then the bindings of clients left with nothing
// are forgotten (the homes that delegated them credentials are told to
// withdraw them), as are the mappers that map nothing any more. A client id whose binding reap forgets must not keep
// access to what it attached for whoever takes the id next, and attachers
// that came and went must not fill a segment's list (maxAttachers); the
// homes of a segment held elsewhere are told in the background.
func (p *core) reap() {
	reaped, gone := p.unlinkExpired()
	p.dispose("lease expired", reaped...)
	p.mu.Lock()
	p.dropGoneMappers()
	wait := p.flushMapped()
	p.mu.Unlock()
	if err := wait(); err != nil {
		p.log.Warn("record which processes map devdax segments; tried again at the next sweep", "err", err)
	}
	for id, f := range p.forgetGone(gone) {
		// Its connections at the homes that delegated it credentials,
		// opened with a credential of the identity it was bound to,
		// would act for whoever binds it here next. Those here go when
		// another identity binds it (auth.bind); until then they get
		// LEASE_EXPIRED for what was reaped.
		for _, home := range f.homes {
			p.undelegateLater(home, id, f.binding)
		}
	}
}

// forgottenBinding is a client id's binding that reap forgot: its number,
// and the homes whose delegated credentials the client held under it.
type forgottenBinding struct {
	binding uint64
	homes   []string
}

// forgetGone forgets the bindings of the reaped clients gone that hold
// nothing now and returns them by client id.
func (p *core) forgetGone(gone []string) map[string]forgottenBinding {
	p.mu.Lock()
	defer p.mu.Unlock()
	forgot := map[string]forgottenBinding{}
	for _, id := range gone {
		// A client that came back while its segments were fenced holds
		// its binding: its session bound it before it was counted again.
		if p.clients[id] != nil {
			continue
		}
		if segs, _ := p.usage.of([]string{id}, ""); segs == 0 {
			forgot[id] = forgottenBinding{binding: p.auth.forget(id), homes: p.deleg.forget(id)}
		}
	}
	return forgot
}

// unlinkExpired ends the clients whose lease ran out, ends their
// attachments and takes their unpinned segments out of the store and the
// table; it releases those the data plane does not serve and returns the
// others, to be fenced and released by reap, and the clients' ids. A
// client whose removal or detach the store refused stays, expired, for
// the next sweep to try again.
func (p *core) unlinkExpired() (reaped []*record, gone []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for id, c := range p.clients {
		if c.sessions > 0 || now.Before(c.expires) {
			continue
		}
		var n, detached int
		var bytes int64
		var mine, attached []*record
		failed := false
		for _, r := range p.segs {
			if r.Owner == id && !r.pinned() {
				mine = append(mine, r)
			} else if slices.Contains(r.Attached, id) {
				attached = append(attached, r)
			}
		}
		// The client's attachments end, and its segments leave the store,
		// in commits of many records (reclaimBatch): one per record, under
		// p.mu, held every call of every client up for as many commits
		// (fsynced, for named segments) as the client had segments and
		// attachments. What a failed commit left stays for the next sweep.
		ended, err := p.detachAllLocked(attached, id)
		if err != nil {
			p.log.Error("end the attachments of a client whose lease expired", "client", id, "err", err)
			failed = true
		}
		for _, r := range ended {
			detached++
			if len(r.homeNodes()) > 0 {
				p.tellLater(r.ID)
			}
		}
		var freed []uint64
		unlinked, err := p.unlinkFreed(mine...)
		if err != nil {
			p.log.Error("reclaim the segments of a client whose lease expired", "client", id, "err", err)
			failed = true
		}
		for _, r := range unlinked {
			if p.fencedHere(r) {
				reaped = append(reaped, r)
			} else {
				p.release(r, "lease expired") // nothing to wait for
			}
			n++
			bytes += r.Size
			freed = append(freed, r.ID)
		}
		if n > 0 || detached > 0 {
			p.log.Info("reclaimed segments of a client whose lease expired", "client", id, "segments", n, "bytes", bytes, "attachments", detached)
		}
		if !strings.HasPrefix(id, peerClientPrefix) {
			// A peer daemon learns what went when it next reconciles
			// with this home; an application, at its next session.
			p.reclaimed.add(id, p.auth.identity(id), freed, now)
		}
		if failed {
			// Kept, expired, for the next sweep: forgotten, its binding
			// would go while the store still lists it attached, and
			// whoever takes its client id next would inherit that.
			continue
		}
		delete(p.clients, id)
		gone = append(gone, id)
		p.metrics.leaseExpired()
	}
	return reaped, gone
}

// sessionCount is the number of live sessions.
func (p *core) sessionCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sessions)
}

// leaseExpiry is when an unpinned segment will be reclaimed if its owner
// stays away; zero while the owner holds a session, or for pinned segments.
func (p *core) leaseExpiry(r *record) time.Time {
	if r.pinned() {
		return time.Time{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clients[r.Owner]; c != nil && c.sessions == 0 {
		return c.expires
	}
	return time.Time{}
}
