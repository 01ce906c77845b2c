package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// Per-client data-plane credentials. At a segment's home every data-plane
// credential names a principal: the client id of the session it was issued
// to, or, for a credential delegated to a peer daemon's client, the peer's
// client id and the client's ("poold/A/app"). The data plane serves a
// segment only to connections whose principal is the segment's owner, one
// of its attachers, or a client of the owning peer that the peer placed
// it for or attached to it (record.Delegates); every other credential is
// refused with ACCESS_DENIED, also with the segment's key.
//
// A daemon that places a segment on peer B for its client asks B, over
// its peer session, for a credential delegated to that client (Delegate)
// and hands the client that one, never its own peer credential. B
// withdraws it when that peer session ends.

// delegatedPrincipal is the principal of a credential delegated to client
// of the peer daemon whose client id here is peer. Client ids of this form
// are refused for sessions (bindSession), so no session can act for one.
func delegatedPrincipal(peer, client string) string { return peer + "/" + client }

// principals is who may operate on a segment homed here over the data
// plane: its owner, its attachers, and the clients of its owning peer
// that the peer named (record.Delegates).
func (r *record) principals() []string {
	out := make([]string, 0, 1+len(r.Attached)+len(r.Delegates))
	out = append(out, r.Owner)
	out = append(out, r.Attached...)
	for _, d := range r.Delegates {
		out = append(out, delegatedPrincipal(r.Owner, d))
	}
	return out
}

// allowData gives the data plane the principals of a segment it exports
// here; a record homed elsewhere, or not on the rdma tier, has none. The
// daemons that write a copy or shard of a redundant segment (r.Writers)
// may write it; with r.ReadOnly, the owner's clients only read it.
func (p *core) allowData(r *record) {
	if p.dp == nil || r.Key.IsZero() || r.Home != "" {
		return
	}
	all := r.principals()
	var readers []string
	if r.ReadOnly {
		all, readers = slices.Clip(all[:1]), all[1:] // clipped: the writers below must not overwrite the readers
	}
	for _, w := range r.Writers {
		all = append(all, peerClientPrefix+w)
	}
	if err := errors.Join(p.dp.srv.Allow(r.ID, all), p.dp.srv.AllowReaders(r.ID, readers)); err != nil {
		p.log.Error("set who may use a segment on the data plane", "segment", r.ID, "err", err)
	}
}

// delegatesOf is whom a placement names besides its owner: the client of
// the peer daemon that asks (AllocRequest.ForClient).
func delegatesOf(c caller, req allocRequest) []string {
	if req.ForClient == "" || !isPeer(c) {
		return nil
	}
	return []string{req.ForClient}
}

// isPeer reports whether the caller is a peer daemon's session.
func isPeer(c caller) bool { return strings.HasPrefix(c.id(), peerClientPrefix) }

// maxDelegated is the most credentials one peer session may hold for its
// clients at once: a peer asks once per client of its own, so this bounds
// only a peer gone wrong.
const maxDelegated = 1 << 16

// validDelegation checks a peer's Delegate or Authorize request: a client
// id as a session's (1 to MaxNameLen bytes, not a peer's or a delegated
// principal) and, for Delegate, the identity the peer proved for it.
func validDelegation(client, identity string, needIdentity bool) error {
	if client == "" || len(client) > MaxNameLen || client == nobody.id || strings.HasPrefix(client, peerClientPrefix) {
		return fmt.Errorf("%w: delegated client id %q: use the client id of 1 to %d bytes of one of the calling daemon's clients", errs.ErrInvalid, client, MaxNameLen)
	}
	if !needIdentity || identity == identityInsecure {
		return nil
	}
	return validIdentity(identity)
}

// Delegate issues a credential for one client of the calling peer daemon
// (see the package comment above), or withdraws those it issued to one;
// only a peer daemon's session may ask.
func (s *service) Delegate(ctx context.Context, req *poolv1.DelegateRequest) (*poolv1.DelegateResponse, error) {
	c, err := s.caller(ctx)
	if err == nil && !isPeer(c) {
		err = fmt.Errorf("%w: only a peer daemon's session may ask for delegated credentials, and the caller is %s", errs.ErrAccessDenied, c.ident)
	}
	var resp *poolv1.DelegateResponse
	if err == nil {
		resp, err = s.d.pool.delegateRequest(sessionOf(ctx), c.client.id, req)
	}
	if err != nil {
		if !errors.Is(err, errs.ErrLeaseExpired) {
			s.d.refused("delegate", c, 0, req.ClientId, err)
		}
		return nil, errs.ToStatus(err)
	}
	return resp, nil
}

// delegateRequest applies a Delegate request of the peer daemon whose
// client id here is peer, over its session.
func (p *core) delegateRequest(session, peer string, req *poolv1.DelegateRequest) (*poolv1.DelegateResponse, error) {
	err := validDelegation(req.ClientId, req.Identity, !req.Withdraw)
	if err == nil && req.Withdraw && req.Identity != "" {
		err = fmt.Errorf("%w: a withdrawal of client %q's credentials names no identity (%q)", errs.ErrInvalid, req.ClientId, req.Identity)
	}
	if err != nil {
		return nil, err
	}
	if req.Withdraw {
		p.auth.undelegate(peer, req.ClientId, req.Binding)
		return &poolv1.DelegateResponse{}, nil
	}
	cred, err := p.delegate(session, peer, req.ClientId, req.Identity, req.Binding)
	if err != nil {
		return nil, err
	}
	return &poolv1.DelegateResponse{DataCredential: cred}, nil
}

// delegate issues the credential of a peer's client over session, the
// peer's session here (auth.delegate), if that session is still live: one
// that ended meanwhile withdrew the credentials it knew of at its end, and
// this one, issued after, is withdrawn here.
func (p *core) delegate(session, peer, client, ident string, binding uint64) ([]byte, error) {
	cred, err := p.auth.delegate(session, peer, client, ident, binding)
	if err != nil {
		return nil, err
	}
	if _, err := p.callerFor(session); err != nil {
		p.auth.revokeSession(session)
		return nil, err
	}
	return cred, nil
}

// Authorize adds or withdraws a client of the calling peer daemon on a
// segment that daemon placed here.
func (s *service) Authorize(ctx context.Context, req *poolv1.AuthorizeRequest) (*poolv1.AuthorizeResponse, error) {
	c, err := s.caller(ctx)
	if err == nil && !isPeer(c) {
		err = fmt.Errorf("%w: only the peer daemon that placed a segment may authorize its clients on it, and the caller is %s", errs.ErrAccessDenied, c.ident)
	}
	if err == nil {
		err = s.d.pool.authorizeRequest(c, req)
	}
	if err != nil {
		s.d.refused("authorize", c, 0, req.ClientId, err)
		return nil, errs.ToStatus(err)
	}
	return &poolv1.AuthorizeResponse{}, nil
}

// authorizeRequest checks a peer's Authorize request and applies it to
// each segment it names that is still here.
func (p *core) authorizeRequest(c caller, req *poolv1.AuthorizeRequest) error {
	if len(req.Sets) > 0 {
		return p.replaceRequest(c, req)
	}
	if err := validDelegation(req.ClientId, "", false); err != nil {
		return err
	}
	if len(req.Ids) > maxAuthorizeIDs {
		return fmt.Errorf("%w: authorize names %d segments; at most %d per call", errs.ErrLimit, len(req.Ids), maxAuthorizeIDs)
	}
	for _, id := range req.Ids {
		if err := p.authorize(c, id, req.ClientId, req.Withdraw); err != nil && !errors.Is(err, errs.ErrNotFound) {
			return err // not found: freed here meanwhile, nothing to authorize
		}
	}
	return nil
}

// maxAuthorizeIDs is the most segments one Authorize call names, and the
// most client ids its sets name in all (at most 1 MiB of names).
const maxAuthorizeIDs = 4096

// replaceRequest checks a peer's Authorize request with sets, all of it
// before any set applies, and replaces the delegates of each segment a
// set names that is still here.
func (p *core) replaceRequest(c caller, req *poolv1.AuthorizeRequest) error {
	if len(req.Ids) > 0 || req.ClientId != "" || req.Withdraw {
		return fmt.Errorf("%w: authorize with sets names neither ids (%d), a client (%q) nor withdraw (%v): each set is a segment's complete list", errs.ErrInvalid, len(req.Ids), req.ClientId, req.Withdraw)
	}
	if len(req.Sets) > maxAuthorizeIDs {
		return fmt.Errorf("%w: authorize names %d segments; at most %d per call", errs.ErrLimit, len(req.Sets), maxAuthorizeIDs)
	}
	names := 0
	for _, set := range req.Sets {
		names += len(set.ClientIds)
		if names > maxAuthorizeIDs {
			return fmt.Errorf("%w: authorize names more than %d clients in its sets; at most %d per call", errs.ErrLimit, maxAuthorizeIDs, maxAuthorizeIDs)
		}
		if len(set.ClientIds) > maxGrants {
			return fmt.Errorf("authorize on segment %d: %w: %d clients; at most %d per segment", set.Id, errs.ErrLimit, len(set.ClientIds), maxGrants)
		}
		for _, client := range set.ClientIds {
			if err := validDelegation(client, "", false); err != nil {
				return fmt.Errorf("authorize on segment %d: %w", set.Id, err)
			}
		}
	}
	for _, set := range req.Sets {
		if err := p.replaceDelegates(c, set.Id, set.ClientIds); err != nil && !errors.Is(err, errs.ErrNotFound) {
			return err // not found: freed here meanwhile, nothing to authorize
		}
	}
	return nil
}

// replaceDelegates makes clients the delegates of segment id, which the
// calling peer must own: the clients of that peer that may use it.
func (p *core) replaceDelegates(c caller, id uint64, clients []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.ownedBy(c, id)
	if err != nil {
		return err
	}
	want := slices.Compact(slices.Sorted(slices.Values(clients)))
	if slices.Equal(want, slices.Sorted(slices.Values(r.Delegates))) {
		return nil
	}
	next := *r
	next.Delegates = want
	if err := p.st.put(&next); err != nil {
		return fmt.Errorf("authorize on segment %d: commit to the metadata store: %w", id, err)
	}
	*r = next
	p.allowData(r)
	return nil
}

// ownedBy is segment id's record for an Authorize of the calling peer,
// which must own it; p.mu held.
func (p *core) ownedBy(c caller, id uint64) (*record, error) {
	r, err := p.lookup(id, "")
	if err == nil && r.Owner != c.id() {
		err = fmt.Errorf("authorize on segment %d: %w: it belongs to %s, not to the caller %s", id, errs.ErrAccessDenied, r.Owner, c.id())
	}
	return r, err
}

// authorize adds client to (or withdraws it from) the delegates of segment
// id, which the calling peer must own.
func (p *core) authorize(c caller, id uint64, client string, withdraw bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.ownedBy(c, id)
	if err != nil {
		return err
	}
	i := slices.Index(r.Delegates, client)
	if withdraw == (i < 0) {
		return nil
	}
	next := *r
	if withdraw {
		next.Delegates = slices.Delete(slices.Clone(r.Delegates), i, i+1)
	} else {
		if len(r.Delegates) >= maxGrants {
			return fmt.Errorf("authorize on segment %d: %w: %d clients already; at most %d per segment", id, errs.ErrLimit, len(r.Delegates), maxGrants)
		}
		next.Delegates = append(slices.Clone(r.Delegates), client)
	}
	if err := p.st.put(&next); err != nil {
		return fmt.Errorf("authorize on segment %d: commit to the metadata store: %w", id, err)
	}
	*r = next
	p.allowData(r)
	return nil
}

// delegations caches, per home node, the credentials that home delegated
// to this daemon's clients, with the peer session they belong to: a new
// session (the old one ended, and the home withdrew them) starts afresh.
// It is safe for concurrent use.
type delegations struct {
	mu    sync.Mutex
	homes map[string]*homeCreds
}

// delegated is the credentials peers delegated to this daemon's clients.
func (p *core) delegated() *delegations { return &p.deleg }

type homeCreds struct {
	session string
	creds   map[string]heldCred // by client id
}

// heldCred is a credential a home delegated to a client, and the
// identity the client id was bound to when this daemon asked for it, and
// that binding's number (auth.binding).
type heldCred struct {
	ident   string
	binding uint64
	cred    []byte
}

// get is client's cached credential at home under session, if any, and
// if it was asked for the binding client has now (ident, binding): one
// asked for before a reap and a rebinding of the id belongs to the old
// binding, which the home is told to withdraw.
func (ds *delegations) get(home, session, client, ident string, binding uint64) []byte {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if h := ds.homes[home]; h != nil && h.session == session {
		if c, ok := h.creds[client]; ok && c.ident == ident && c.binding == binding {
			return c.cred
		}
	}
	return nil
}

// put caches client's credential at home under session, asked for with
// identity ident under binding.
func (ds *delegations) put(home, session, client, ident string, binding uint64, cred []byte) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.homes == nil {
		ds.homes = map[string]*homeCreds{}
	}
	h := ds.homes[home]
	if h == nil || h.session != session {
		h = &homeCreds{session: session, creds: map[string]heldCred{}}
		ds.homes[home] = h
	}
	h.creds[client] = heldCred{ident, binding, cred}
}

// forget drops client's credentials at every home: a client id whose
// binding reap forgot may be bound next to another identity, and the
// credentials homes delegated to it name the old one.
func (ds *delegations) forget(client string) (homes []string) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	for home, h := range ds.homes {
		if _, ok := h.creds[client]; ok {
			delete(h.creds, client)
			homes = append(homes, home)
		}
	}
	return homes
}

// forgetAt drops client's credential at home, if one is cached.
func (ds *delegations) forgetAt(home, client string) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if h := ds.homes[home]; h != nil {
		delete(h.creds, client)
	}
}

// undelegateLater withdraws, in the background, the credentials home
// delegated to client under its binding numbered binding, once the reap
// forgot that binding here: asked again after a failure, from a second
// and backing off to 30 s, up to withdrawTries times, until the home
// answers or refuses, there is no session with home to ask on, or client
// is bound again (whose next credential at home settles it: another
// identity's withdraws these there, the same identity's withdraws them
// and keeps its connections). A single try that the home did not answer
// (busy, or cut off for a moment) left them acting for whoever binds the
// id here next until that one's delegation there; past the tries, that
// delegation or the end of this daemon's session at the home withdraws
// them. A try that reaches the home late, after the id was bound again
// and delegated there, takes back nothing of the new binding's.
func (p *core) undelegateLater(home, client string, binding uint64) {
	p.peers.later(0, func(ctx context.Context) {
		wait := time.Second
		for try := 1; p.withdrawDelegated(ctx, home, client, binding) != nil; try++ {
			if try == withdrawTries {
				p.log.Warn("withdraw a forgotten client's delegated credentials at a home: gave up", "home", home, "client", client, "tries", try)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 30*time.Second)
		}
	})
}

// withdrawTries bounds undelegateLater's tries (about two and a half
// minutes of them), so that clients reaped while a home does not answer
// do not each keep a goroutine for as long as it stays away.
const withdrawTries = 8

// withdrawDelegated asks home to withdraw the credentials it delegated to
// client under binding and earlier ones; it returns an error when it is
// worth asking again. A home of an older poold, which knows no bindings,
// withdraws every credential of the client, maybe one it was just
// delegated there under a new binding: the one cached here is dropped, so
// that the client's next ask gets a new one rather than the cut one.
func (p *core) withdrawDelegated(ctx context.Context, home, client string, binding uint64) error {
	if p.auth.identity(client) != "" {
		return nil // bound again
	}
	pc := p.peers.conn(home)
	if pc == nil {
		return nil // no session to ask on; home ends its delegations with the one it had
	}
	ctx, cancel := context.WithTimeout(ctx, delegateTimeout)
	defer cancel()
	cctx, _, err := pc.Call(ctx)
	if err == nil {
		_, err = pc.API().Delegate(cctx, &poolv1.DelegateRequest{ClientId: client, Withdraw: true, Binding: binding})
		p.deleg.forgetAt(home, client)
	}
	switch err = errs.FromStatus(err); {
	case err == nil:
	case errors.Is(err, errs.ErrAccessDenied) || errors.Is(err, errs.ErrInvalid) || errors.Is(err, errs.ErrNotSupported):
		// Refused, not failed: asking again gets the same answer.
		p.log.Warn("withdraw a forgotten client's delegated credentials at a home: refused", "home", home, "client", client, "err", err)
		return nil
	default:
		p.log.Debug("withdraw a forgotten client's delegated credentials at a home: asking again", "home", home, "client", client, "err", err)
	}
	return err
}

// delegateTimeout bounds asking a home for a delegated credential, so that
// a Stat or a listing is not held up by a home that does not answer.
const delegateTimeout = 5 * time.Second

// delegatedCred is the credential home delegated to this daemon's client,
// asked for over the peer session with home when none is cached; nil
// (logged) when the home cannot give one, or this daemon has no session
// with it at the moment: the client then cannot reach the segment (it asks
// again when its connection is refused), rather than being handed this
// daemon's own credential.
func (d *Daemon) delegatedCred(ctx context.Context, home, client string) []byte {
	pc := d.pool.peerConns().conn(home)
	if pc == nil || pc.DataCredential() == nil {
		return nil // no session with home now: nothing to wait for in a listing
	}
	ctx, cancel := context.WithTimeout(ctx, delegateTimeout)
	defer cancel()
	ident, binding := d.pool.credentials().binding(client)
	cctx, sid, err := pc.Call(ctx)
	if err == nil {
		if cred := d.pool.delegated().get(home, sid, client, ident, binding); cred != nil {
			return cred
		}
		// The home is told who may use each segment placed there before
		// it delegates on this session (homeclients.go).
		err = d.pool.toldOn(ctx, pc, home)
		var resp *poolv1.DelegateResponse
		if err == nil {
			resp, err = pc.API().Delegate(cctx, &poolv1.DelegateRequest{ClientId: client, Identity: ident, Binding: binding})
		}
		if err == nil {
			d.pool.delegated().put(home, sid, client, ident, binding, resp.DataCredential)
			return resp.DataCredential
		}
		err = errs.FromStatus(err)
	}
	d.log.Warn("no data-plane credential from a segment's home for a client; it cannot reach its segments there until the home answers", "home", home, "client", client, "err", err)
	return nil
}
