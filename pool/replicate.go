// This file holds the home side of redundant segments
// (docs/REDUNDANCY.md): the Replicate RPC, by which the origin tells a
// home of a copy or shard who writes it and where the data plane forwards
// the effect of each write, and the report of a failed forward back to
// the origin (HomeFailed).

package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/errs"
	redspec "github.com/farmem/farmem/internal/redundancy"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// forwards holds, per segment served here, the data-plane connections its
// forwarding uses, closed when it is replaced or stopped, and the
// segments whose writes are held (sealed) since this daemon restarted
// until the origin sets their forwarding again. Safe for concurrent use.
type forwards struct {
	// setting orders the Replicate calls and the stop of one segment's
	// forwarding (stopForwarding; settingOf): each sets the forwarding and
	// then swaps in its connections, and two interleaved would close the
	// connections of the forwarding in force, or set it on a segment whose
	// stop already ran, which nothing would stop again. A Replicate waits
	// for the segment's forwarded writes in flight under the previous
	// forwarding (up to the forward timeout), so segments take one of
	// several locks by id: one waiting on a dead target holds up few
	// others (a stop waits after it let go). Taken before the core's mu,
	// never under it.
	setting [64]sync.Mutex
	mu      sync.Mutex
	conns   map[uint64][]rdma.Conn
	held    map[uint64]bool
	// links are the data-plane connections to the targets, one per
	// target node, address and credential, shared by every segment here
	// that forwards there (a connection per segment and target would
	// take a descriptor each: thousands on a busy home); refs counts the
	// segments' uses, byConn finds a connection's link.
	links  map[linkKey]*link
	byConn map[rdma.Conn]linkKey
}

// settingOf is the lock (setting) that orders segment id's Replicate
// calls and the stop of its forwarding.
func (f *forwards) settingOf(id uint64) *sync.Mutex { return &f.setting[id%uint64(len(f.setting))] }

// linkKey names a shared connection to a target's data plane.
type linkKey struct{ node, addr, cred string }

// link is one shared connection and how many segments' forwardings use it.
type link struct {
	conn rdma.Conn
	refs int
}

// link returns the shared connection for k, dialing it with dial when
// there is none yet; each call is one use, given back by unlink.
func (fw *forwards) link(k linkKey, dial func() (rdma.Conn, error)) (rdma.Conn, error) {
	fw.mu.Lock()
	if l := fw.links[k]; l != nil {
		l.refs++
		fw.mu.Unlock()
		return l.conn, nil
	}
	fw.mu.Unlock()
	c, err := dial()
	if err != nil {
		return nil, err
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if l := fw.links[k]; l != nil { // dialed meanwhile by another call
		l.refs++
		c.Close()
		return l.conn, nil
	}
	if fw.links == nil {
		fw.links, fw.byConn = map[linkKey]*link{}, map[rdma.Conn]linkKey{}
	}
	fw.links[k], fw.byConn[c] = &link{conn: c, refs: 1}, k
	return c, nil
}

// unlink gives back one use of each connection (nil ones are lost
// targets) and closes those no segment uses any more.
func (fw *forwards) unlink(conns []rdma.Conn) {
	var idle []rdma.Conn
	fw.mu.Lock()
	for _, c := range conns {
		if c == nil {
			continue
		}
		k, ok := fw.byConn[c]
		if !ok {
			continue
		}
		l := fw.links[k]
		if l.refs--; l.refs == 0 {
			delete(fw.links, k)
			delete(fw.byConn, c)
			idle = append(idle, c)
		}
	}
	fw.mu.Unlock()
	closeConns(idle)
}

// nodes adds the nodes of the shared connections to into.
func (fw *forwards) nodes(into map[string]bool) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	for k := range fw.links {
		into[k.node] = true
	}
}

// closeAll closes every shared connection: the daemon stops.
func (fw *forwards) closeAll() {
	fw.mu.Lock()
	conns := slices.Collect(maps.Keys(fw.byConn))
	fw.links, fw.byConn, fw.conns = nil, nil, nil
	fw.mu.Unlock()
	closeConns(conns)
}

// hold notes that segment id's writes are held for its forwarding.
func (fw *forwards) hold(id uint64) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.held == nil {
		fw.held = map[uint64]bool{}
	}
	fw.held[id] = true
}

// holding reports whether segment id's writes are held.
func (fw *forwards) holding(id uint64) bool {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return fw.held[id]
}

// release reports whether segment id's writes were held, and forgets it.
func (fw *forwards) release(id uint64) bool {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	held := fw.held[id]
	delete(fw.held, id)
	return held
}

// holdForwarding seals a restored copy or shard whose writes its origin
// had forwarded: until the origin tells it again where to forward
// (Replicate), a write applied here would reach no other home, so writes
// answer MOVED (the client asks its daemon and retries) and only the
// origin reads.
func (p *core) holdForwarding(r *record) error {
	if err := p.dp.seal(r.ID, r.Owner); err != nil {
		return fmt.Errorf("hold the writes of segment %d until its forwarding is set again: %w", r.ID, err)
	}
	p.fwd.hold(r.ID)
	return nil
}

// swap makes conns segment id's connections and returns the previous ones.
func (fw *forwards) swap(id uint64, conns []rdma.Conn) []rdma.Conn {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.conns == nil {
		fw.conns = map[uint64][]rdma.Conn{}
	}
	old := fw.conns[id]
	if len(conns) == 0 {
		delete(fw.conns, id)
	} else {
		fw.conns[id] = conns
	}
	return old
}

// closeConns closes data-plane connections (nil ones are lost targets).
func closeConns(conns []rdma.Conn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}

// stopForwarding stops segment id's forwarding and its push to a move's
// target, if any, closes their connections and forgets that its writes
// are held: the segment is freed, fenced or moved away (a move's ABORT
// that came too late, or never, would leave the push's connections
// open). It waits for a Replicate of the segment that is setting its
// forwarding (fwd.setting), which found the segment in the table before
// it left: the forwarding that one sets is stopped here, before the data
// plane withdraws the segment. p.mu is not held.
func (p *core) stopForwarding(id uint64) {
	mu := p.fwd.settingOf(id)
	mu.Lock()
	p.pushing.drop(id)
	p.fwd.release(id)
	old := p.fwd.swap(id, nil)
	if old == nil {
		mu.Unlock()
		return
	}
	wait, err := p.dp.srv.StopForward(id)
	// The wait for the forwarded writes in flight, up to the forward
	// timeout on a dead target, holds up no Replicate of the segments
	// that share the lock.
	mu.Unlock()
	if err != nil {
		p.log.Debug("stop forwarding a segment", "segment", id, "err", err)
	} else {
		wait()
	}
	p.fwd.unlink(old)
}

// Replicate sets how a copy or shard here is written; only a peer daemon's
// session may ask, and only for a segment it placed here.
func (s *service) Replicate(ctx context.Context, req *poolv1.ReplicateRequest) (*poolv1.ReplicateResponse, error) {
	c, err := s.caller(ctx)
	if err == nil && !isPeer(c) {
		err = fmt.Errorf("%w: only the peer daemon that placed a segment may set how it is replicated, and the caller is %s", errs.ErrAccessDenied, c.ident)
	}
	var resp *poolv1.ReplicateResponse
	if err == nil {
		resp, err = s.d.pool.replicateHere(ctx, c, req, moveTLS{ca: s.d.data.ca, byDefault: s.d.data.server != nil})
	}
	if err != nil {
		s.d.refused("replicate", c, req.HomeId, "", err)
		return nil, errs.ToStatus(err)
	}
	return resp, nil
}

// validReplicate checks a Replicate request's shape.
func validReplicate(req *poolv1.ReplicateRequest) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("replicate segment %d: %w: "+format, append([]any{req.HomeId, errs.ErrInvalid}, args...)...)
	}
	if len(req.Targets) > redspec.MaxHomes || len(req.Writers) > redspec.MaxHomes {
		return bad("%d targets and %d writers; at most %d each", len(req.Targets), len(req.Writers), redspec.MaxHomes)
	}
	for _, w := range req.Writers {
		if w == "" || len(w) > MaxNameLen || strings.Contains(w, "/") {
			return bad("writer node %q: use a node name of 1 to %d bytes", w, MaxNameLen)
		}
	}
	for i, t := range req.Targets {
		if t.State == poolv1.HomeState_HOME_STATE_LOST {
			continue
		}
		if t.Node == "" || len(t.Node) > MaxNameLen || t.DataAddr == "" || len(t.Key) != len(rdma.Key{}) {
			return bad("target %d (node %q at %q) needs a node name, a data address and a %d-byte key", i, t.Node, t.DataAddr, len(rdma.Key{}))
		}
	}
	switch req.Mode {
	case poolv1.ForwardMode_FORWARD_MODE_COPY:
	case poolv1.ForwardMode_FORWARD_MODE_PARITY:
		k, m := int(req.DataShards), int(req.ParityShards)
		if err := (redspec.Spec{Data: k, Parity: m}).Validate(); err != nil {
			return fmt.Errorf("replicate segment %d: %w", req.HomeId, err)
		}
		if int(req.Shard) >= k || len(req.Targets) != m {
			return bad("data shard %d of ec=%d+%d with %d parity targets; the shard is below k and there is one target per parity shard", req.Shard, k, m, len(req.Targets))
		}
	default:
		return bad("unknown forward mode %d; use COPY or PARITY", req.Mode)
	}
	return nil
}

// replicateHere applies a Replicate request from c to a segment it placed
// here: the epoch raised, the writers and the clients' read-only access
// committed and given to the data plane, the targets dialed and the
// forwarding set (replacing the previous one).
func (p *core) replicateHere(ctx context.Context, c caller, req *poolv1.ReplicateRequest, tls moveTLS) (*poolv1.ReplicateResponse, error) {
	if err := validReplicate(req); err != nil {
		return nil, err
	}
	r, err := p.replicaSubject(c, req)
	if err != nil {
		return nil, err
	}
	if req.StaleIfRestarted && p.fwd.holding(req.HomeId) {
		// Restored after a restart: a write applied here just before it
		// may never have been forwarded. The origin rebuilds this copy
		// from the others instead; until then it stays held.
		p.mu.Lock()
		epoch := r.Epoch
		p.mu.Unlock()
		return &poolv1.ReplicateResponse{Epoch: epoch, Restarted: true}, nil
	}
	f, conns, err := p.dialTargets(ctx, c.id(), req, tls)
	if err != nil {
		return nil, err
	}
	mu := p.fwd.settingOf(req.HomeId)
	mu.Lock()
	defer mu.Unlock()
	epoch, err := p.setReplica(r, req)
	if err != nil {
		p.fwd.unlink(conns)
		return nil, err
	}
	if err := p.dp.srv.Forward(req.HomeId, f); err != nil {
		p.fwd.unlink(conns)
		return nil, fmt.Errorf("replicate segment %d: %w", req.HomeId, err)
	}
	if hook := p.cfg.sim.forwarding; hook != nil {
		hook(req.HomeId)
	}
	if req.Joined {
		// A copy filled from another home serves retried exactly-once
		// ops from what it records from now on (tcp.Server.Join).
		if err := p.dp.srv.Join(req.HomeId); err != nil {
			return nil, fmt.Errorf("replicate segment %d: %w", req.HomeId, err)
		}
	}
	p.fwd.unlink(p.fwd.swap(req.HomeId, conns))
	if p.fwd.release(req.HomeId) {
		p.unsealData(req.HomeId)
	}
	return &poolv1.ReplicateResponse{Epoch: epoch}, nil
}

// replicaSubject finds the segment of a Replicate request: an rdma
// segment this node serves, c's, and not lost. One under a MoveOut
// (tracked, sealed) is fine: the origin sets the homes' forwarding and
// raises their epochs while it holds the writers sealed (a rebuild's
// switchOK, finishHomeMove), and a home that is leaving serves, and
// forwards, until the move's COMMIT lets it go; from then on no record
// here names it (letGo), and lookup answers not found.
func (p *core) replicaSubject(c caller, req *poolv1.ReplicateRequest) (*record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(req.HomeId, "")
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("replicate segment %d", r.ID)
	switch {
	case r.Owner != c.id():
		return nil, fmt.Errorf("%s: %w: it belongs to %s, not to the caller %s", what, errs.ErrAccessDenied, r.Owner, c.id())
	case p.dp == nil || r.Key.IsZero() || r.Home != "":
		return nil, fmt.Errorf("%s: %w: it is not an rdma segment this node's data plane serves", what, errs.ErrInvalid)
	case r.Lost:
		return nil, fmt.Errorf("%s: %w", what, errs.ErrSegmentLost)
	case req.Epoch < r.Epoch:
		return nil, fmt.Errorf("%s: %w: epoch %d is older than the copy's %d (a stale request)", what, errs.ErrInvalid, req.Epoch, r.Epoch)
	}
	return r, nil
}

// setReplica commits the epoch, writers and clients' access a Replicate
// request gives the segment r and hands them to the data plane; it
// returns the epoch.
func (p *core) setReplica(r *record, req *poolv1.ReplicateRequest) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.segs[r.ID] != r {
		return 0, fmt.Errorf("replicate segment %d: %w: freed meanwhile", r.ID, errs.ErrNotFound)
	}
	next := *r
	next.Epoch, next.Writers, next.ReadOnly, next.Forwards = max(r.Epoch, req.Epoch), slices.Clone(req.Writers), req.ClientsReadOnly, len(req.Targets) > 0
	if next.Epoch > r.Epoch {
		if err := p.dp.srv.SetEpoch(r.ID, next.Epoch); err != nil {
			return 0, fmt.Errorf("replicate segment %d: raise the epoch to %d: %w", r.ID, next.Epoch, err)
		}
	}
	if err := p.st.put(&next); err != nil {
		return 0, fmt.Errorf("replicate segment %d: commit to the metadata store: %w", r.ID, err)
	}
	*r = next
	p.allowData(r)
	return r.Epoch, nil
}

// dialTargets connects to the data plane of each target of req that is not
// lost, with this node's peer credential there (a daemon that lets this
// one write its copy named this node a writer), and returns the
// forwarding (nil without targets) and the connections it uses; a failed
// forward is reported to owner, the segment's origin.
func (p *core) dialTargets(ctx context.Context, owner string, req *poolv1.ReplicateRequest, tls moveTLS) (*tcp.Forwarding, []rdma.Conn, error) {
	if len(req.Targets) == 0 {
		return nil, nil, nil
	}
	f := &tcp.Forwarding{Mode: tcp.ForwardCopy, Targets: make([]tcp.ForwardTarget, len(req.Targets))}
	if req.Mode == poolv1.ForwardMode_FORWARD_MODE_PARITY {
		f.Mode, f.Shard, f.DataShards, f.ParityShards = tcp.ForwardParity, int(req.Shard), int(req.DataShards), int(req.ParityShards)
	}
	conns := make([]rdma.Conn, len(req.Targets))
	errsOf := make([]error, len(req.Targets))
	var wg sync.WaitGroup
	for i, t := range req.Targets {
		if t.State == poolv1.HomeState_HOME_STATE_LOST {
			continue
		}
		var key rdma.Key
		copy(key[:], t.Key)
		f.Targets[i].Region = rdma.Region{Segment: t.HomeId, Key: key, Epoch: t.Epoch}
		wg.Go(func() {
			pc, err := p.homeSession(ctx, t.Node, "target")
			var useTLS bool
			if err == nil {
				useTLS, err = p.ownCredTLS(t.Node, t.DataAddr, t.DataTls)
			}
			if err == nil {
				cred := pc.DataCredential()
				conns[i], err = p.fwd.link(linkKey{t.Node, t.DataAddr, string(cred)}, func() (rdma.Conn, error) {
					return dialHome(ctx, t.Node, t.DataAddr, useTLS, tls.ca, cred)
				})
			}
			errsOf[i] = err
		})
	}
	wg.Wait()
	for i, err := range errsOf {
		if err != nil {
			p.fwd.unlink(conns)
			return nil, nil, fmt.Errorf("replicate segment %d: target %d at %s: %w", req.HomeId, i, req.Targets[i].Node, err)
		}
		f.Targets[i].Conn = conns[i]
	}
	targets := req.Targets
	f.OnFail = func(i int, err error) error { return p.reportFailed(owner, req.HomeId, targets[i], err) }
	return f, conns, nil
}

// ownCredTLS checks a data-plane dial that is to carry this daemon's own
// credential at node (asked: whether the request names TLS for it): a
// plaintext dial goes only to the address node gossips (one set
// --data-insecure), so that a peer cannot have the credential sent in
// plaintext to an address of its choosing, and then use it at node as
// this daemon; a TLS dial verifies node's certificate anyway. This holds
// whether or not this daemon's own data plane serves TLS: node's may,
// and keeps this daemon's connections to it off the wire.
func (p *core) ownCredTLS(node, addr string, asked bool) (bool, error) {
	if asked || p.cl == nil {
		return asked, nil
	}
	if m, ok := p.cl.Member(node); ok && m.Meta.DataAddr == addr {
		return false, nil
	}
	return false, fmt.Errorf("%w: a plaintext data-plane connection to %s at %s would carry this node's credential there, and %s gossips no such data address: name TLS for it (DataTls) or %s's gossiped address", errs.ErrAccessDenied, node, addr, node, node)
}

// dialHome connects to node's data plane at addr with cred, one
// connection (forwarded and copied writes keep their order), over TLS
// verified against ca under the node's name when the node serves it.
func dialHome(ctx context.Context, node, addr string, useTLS bool, ca, cred []byte) (rdma.Conn, error) {
	opts := []tcp.Option{tcp.WithCredential(cred), tcp.WithConns(1)}
	if useTLS {
		tc, err := certs.Verifier(ca, node)
		if err != nil {
			return nil, fmt.Errorf("verify the data plane of %s: %w", node, err)
		}
		opts = append(opts, tcp.WithTLS(tc))
	}
	c, err := tcp.Dial(ctx, addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: the data plane of %s at %s: %w", errMoveHome, node, addr, err)
	}
	return c, nil
}

// reportTimeout bounds telling the origin of a failed forward.
const reportTimeout = 5 * time.Second

// reportFailed tells the origin (the daemon whose client id owner is)
// that segment id here could not forward to target, and waits (at most
// reportTimeout) until the origin has committed that home lost: the data
// plane answers the client's operation when this returns, and a backup
// that missed an acknowledged write must never be promoted. When the
// origin cannot be told, the error makes the data plane answer the
// segment's writes INDETERMINATE, not OK, until the origin sets the
// forwarding again: this home may be cut off on the wrong side of a
// partition, where the origin promotes the copy that misses them.
func (p *core) reportFailed(owner string, id uint64, target *poolv1.SegmentHome, why error) error {
	origin := strings.TrimPrefix(owner, peerClientPrefix)
	p.log.Warn("a forward of a redundant segment's write failed; telling its origin", "segment", id, "target", target.Node, "origin", origin, "err", why)
	ctx, cancel := untilClosed(context.Background(), p.peers.stop)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, reportTimeout)
	defer cancelT()
	pc, err := p.homeSession(ctx, origin, "origin")
	if err == nil {
		_, err = callAt(ctx, pc, moveStepTimeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.HomeFailedResponse, error) {
			return api.HomeFailed(ctx, &poolv1.HomeFailedRequest{HomeId: id, TargetNode: target.Node, TargetHomeId: target.HomeId, Reason: why.Error()})
		})
	}
	if err != nil && !errors.Is(err, errs.ErrNotFound) {
		p.log.Error("the origin of a redundant segment was not told of a failed forward; its writes are not acknowledged until the origin sets its forwarding again", "segment", id, "origin", origin, "err", err)
		return err
	}
	return nil
}
