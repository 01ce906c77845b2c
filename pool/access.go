package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// bindSession checks that a session's client id may be used by who: a
// client id belongs to the identity that first opened a session with it,
// and a peer's client id (poold/NODE) to that node's certificate (one
// that may serve TLS, as a node's does: a client certificate of the same
// CA whose name is NODE is not enough), or with an insecure control plane
// to whoever reaches it over TCP; never to a local client, whose binding
// would lock the node's daemon out and whose segments would outlive its
// session for the peer lease. A peer's sessions may forward ops on the
// data plane (tcp.ServerConfig.Forwarders).
func (d *Daemon) bindSession(clientID string, who caller) error {
	ident := who.ident
	if node, ok := strings.CutPrefix(clientID, peerClientPrefix); ok && strings.Contains(node, "/") {
		return fmt.Errorf("%w: client id %q: ids poold/NODE/... name clients of peer daemons (delegated credentials); choose another", errs.ErrInvalid, clientID)
	}
	if strings.HasPrefix(clientID, moveSourcePrefix) {
		err := fmt.Errorf("%w: client id %q: ids %s... name the sources of moves between daemons; choose another", errs.ErrInvalid, clientID, moveSourcePrefix)
		d.sessionRefused(clientID, ident, err)
		return err
	}
	if node, ok := strings.CutPrefix(clientID, peerClientPrefix); ok && (strings.HasPrefix(ident, "cn:") && (ident != "cn:"+node || !who.node) || strings.HasPrefix(ident, "uid:")) {
		err := fmt.Errorf("%w: client id %q is reserved for node %s's daemon, which calls over TCP with its node certificate, and the caller is %s; choose another client id", errs.ErrAccessDenied, clientID, node, ident)
		d.sessionRefused(clientID, ident, err)
		return err
	}
	if err := d.pool.credentials().bind(clientID, ident); err != nil {
		d.sessionRefused(clientID, ident, err)
		return err
	}
	return nil
}

// sessionRefused logs (sampled: logRefused) a session refused its client
// id, and counts it if access was denied (not if the store failed).
func (d *Daemon) sessionRefused(clientID, ident string, err error) {
	if errors.Is(err, errs.ErrAccessDenied) {
		d.metrics.refused("session")
	}
	d.logRefused(slog.LevelWarn, "access refused", "session", ident, "op", "session", "client", clientID, "identity", ident, "err", err)
}

// forCaller describes a segment for a caller: one who may use it (owner,
// attacher, administrator) gets its access key and, for an rdma segment,
// its own data-plane credential at the segment's home (its session's
// here, one the home delegated to it elsewhere: delegate.go); anyone else
// gets neither, so a listing or a Stat never hands out another client's
// key.
func (d *Daemon) forCaller(ctx context.Context, c caller, r record) *poolv1.Segment {
	seg := d.segmentProto(r)
	if c.client == nil {
		return seg
	}
	if !mayUse(c, &r) {
		seg.Key = nil
		for _, h := range seg.Homes {
			h.Key = nil
		}
		return seg
	}
	if len(seg.Key) == 0 {
		return seg
	}
	if r.Home != "" {
		// One credential per home node, delegated to the client there.
		creds := map[string][]byte{}
		cred := func(node string) []byte {
			if cr, ok := creds[node]; ok {
				return cr
			}
			creds[node] = d.delegatedCred(ctx, node, c.client.id)
			return creds[node]
		}
		seg.DataCredential = cred(r.Home)
		for _, h := range seg.Homes {
			if h.State != poolv1.HomeState_HOME_STATE_LOST {
				h.DataCredential = cred(h.Node)
			}
		}
		return seg
	}
	seg.DataCredential = d.pool.credentials().credOf(c.client.id)
	return seg
}

// withIdentities fills in each client's identity.
func (d *Daemon) withIdentities(cs []*poolv1.ClientInfo) []*poolv1.ClientInfo {
	for _, ci := range cs {
		ci.Identity = d.pool.credentials().identity(ci.Id)
	}
	return cs
}

// nobody is the viewer of a call whose session ended: it sees no keys
// (no client id is "\x00"; Hello ids are checked for it).
var nobody = &client{id: "\x00"}

// viewer is who reads a listing or a Stat: the session's client, an
// administrator without a session, or nobody with the caller's identity
// for a session that ended or a caller without a session that is no
// administrator (listings and Stat answer it what its identity owns or
// may attach, without keys: a peer reconciling right after a partition may
// still name its old session; see visible).
func (s *service) viewer(ctx context.Context) caller {
	c, err := s.caller(ctx)
	if err != nil {
		c.client = nobody
	}
	return c
}

// callerOf resolves who makes a call that names session sid (or none),
// from t, the identity its transport proved. A session's calls must come
// from the identity its client id is bound to: a session id seen by
// another identity is useless to it. A call without a session is an
// administrator's when t's identity is one (Config.isAdmin); anyone else
// is refused (ErrAccessDenied), and gets nobody with its identity.
func (d *Daemon) callerOf(sid string, t caller) (caller, error) {
	if sid == "" {
		if !d.cfg.isAdmin(t.ident, t.gid, t.local) {
			t.client = nobody
			return t, fmt.Errorf("%w: a call without a session is an administrator's, and %s is not one (poold --admin names them); an application opens a session (alloc.Dial)", errs.ErrAccessDenied, t.ident)
		}
		return t, nil
	}
	c, err := d.pool.callerFor(sid)
	if err != nil {
		t.client = nobody
		return t, err
	}
	if bound := d.pool.credentials().identity(c.client.id); bound != t.ident {
		t.client = nobody
		return t, fmt.Errorf("%w: the session belongs to client %q of %s, and the call comes from %s", errs.ErrAccessDenied, c.client.id, bound, t.ident)
	}
	t.client = c.client
	return t, nil
}

// visible reports whether a listing or a Stat shows the segment to the
// caller (mayList); a viewer without a live session (nobody) also sees the
// segments its identity's client ids own, without keys: a peer daemon
// whose session here ended (a partition, this daemon's restart) still
// finds what it placed here when it reconciles.
func (d *Daemon) visible(c caller, r *record) bool {
	return mayList(c, r) || c.client == nobody && r.Owner != "" && c.ident != "" && d.pool.credentials().identity(r.Owner) == c.ident
}
