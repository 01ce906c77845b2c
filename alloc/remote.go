package alloc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"iter"
	"sync"
	"sync/atomic"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/dialer"
	"github.com/farmem/farmem/rdma/tcp"
)

// remote is the backend of a segment on the rdma tier: one-sided
// operations on its home's data plane (an rdma.Conn of whichever transport
// rdma/dialer picked), retried across redials within WithOpTimeout.
//
// The per-operation path takes no client-wide lock: where the home serves
// the segment, whether it is lost, and the connection last used are each
// an atomic pointer of the segment's own, replaced whole when they change.
type remote struct {
	c    *Client
	info *poolv1.Segment // immutable: the segment as it was opened
	// plane is where the home serves the segment and how to reach it;
	// refresh replaces it (the home restarted, or the segment moved).
	plane atomic.Pointer[plane]
	// lost is cancelled, with cause ErrSegmentLost, while the daemon reports
	// the home lost; a restored segment gets a fresh one. Replaced under
	// Client.mu, so that setLost and retire do not race.
	lost atomic.Pointer[lostCtx]
	// route is the data-plane connection the last operation used, valid
	// while the client has dropped no connection since (Client.dataGen).
	route atomic.Pointer[route]
	// deadline is the operation-timeout context the operations starting
	// now share (see opScope).
	deadline atomic.Pointer[deadlineCtx]
	// loadStore is set once the daemon describes the segment on a
	// load/store tier: it was promoted, and no home serves it any more.
	loadStore atomic.Bool
	// next is the live move the daemon told of before its seal (the
	// moving notice), which an operation refused MOVED with its token
	// follows at once; nil when none was told.
	next atomic.Pointer[handover]
}

// handover is a live move of a segment as its daemon told the client
// before the seal: the home it leaves, and the copy at the new home with
// its token (rdma.MoveToken), which the old home's MOVED answers carry
// once the copy has every change. Immutable.
type handover struct {
	from  *plane
	to    *plane
	token uint64
}

// deadlineCtx is a context that ends opTimeout plus one slice after it was
// made, or when the segment it was made for is lost; operations that start
// before until share it. Immutable.
type deadlineCtx struct {
	ctx    context.Context
	cancel context.CancelFunc // never called early: the deadline releases it
	until  time.Time
	lost   *lostCtx
}

// deadlineSlices is how many shared deadline contexts an operation
// timeout is cut into: an operation's time is opTimeout plus at most
// opTimeout/deadlineSlices, and a busy segment holds at most about
// deadlineSlices live timers.
const deadlineSlices = 16

// opScope is the context one operation on a segment runs in, and what
// ends it: without a caller's context that can end early, the context
// shared by the operations of the current slice (sharedDeadline: the
// per-operation path makes no context, timer or goroutine of its own,
// which were most of a remote operation's allocations and a tenth of its
// CPU) and nothing to end; else one of its own, ended with the caller's.
func opScope(caller context.Context, p *atomic.Pointer[deadlineCtx], l *lostCtx, d time.Duration) (context.Context, func()) {
	if caller.Done() == nil {
		return sharedDeadline(p, l, d), func() {}
	}
	ctx, cancel := context.WithTimeout(l.ctx, d)
	stop := context.AfterFunc(caller, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// releaseTickets gives the ops' exactly-once tickets back to their
// session at the end of an operation, whatever became of them: a write
// retried in a later round, also at another home, posts the same ticket.
func releaseTickets(ops []*rdma.Op) {
	for _, op := range ops {
		if op.Once != nil {
			op.Once.Release()
		}
	}
}

// sharedDeadline is the context in *p while it was made for l and the
// current slice, else a new one, ending d plus one slice from now or when
// l ends, stored in *p for the operations of the next slice.
func sharedDeadline(p *atomic.Pointer[deadlineCtx], l *lostCtx, d time.Duration) context.Context {
	now := time.Now()
	if dc := p.Load(); dc != nil && dc.lost == l && now.Before(dc.until) {
		return dc.ctx
	}
	slice := d / deadlineSlices
	ctx, cancel := context.WithDeadline(l.ctx, now.Add(d+slice))
	// Two operations racing here each make one; the later store wins, and
	// the other's context ends at its deadline all the same.
	p.Store(&deadlineCtx{ctx: ctx, cancel: cancel, until: now.Add(slice), lost: l})
	return ctx
}

// plane is where a segment's home serves its data plane. Immutable.
type plane struct {
	node   string      // the home's node name
	region rdma.Region // the segment at the home: its id there, key, epoch
	addr   string
	// cred is what the data plane's handshake asks for (from the daemon,
	// renewed by refresh). Empty: the session's own.
	cred []byte
	// tls verifies the home when it serves its data plane over TLS (nil:
	// plaintext).
	tls *tls.Config
}

// elsewhere reports whether p names another home of the segment than
// old does, or another copy there.
func (p *plane) elsewhere(old *plane) bool {
	return p.addr != old.addr || p.region != old.region
}

// credential is what the handshake of the home at p presents: the
// daemon's credential for this segment, else the session's own.
func (r *remote) credential(p *plane) []byte {
	if len(p.cred) == 0 {
		return r.c.sess.DataCredential()
	}
	return p.cred
}

// lostCtx is a context cancelled when the segment is lost or retired, and
// its cancel function. Immutable.
type lostCtx struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

func newLostCtx() *lostCtx {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &lostCtx{ctx, cancel}
}

// route is a cached data-plane connection: the address, the client's
// connection generation when it was looked up, the connection and the
// exactly-once session towards the address. Immutable.
type route struct {
	addr string
	gen  uint64
	conn rdma.Conn
	sess *rdma.Session
}

var _ backend = (*remote)(nil)

// newRemote is the backend of a segment the daemon placed on the rdma tier;
// it presents c's client certificate to the home (see dataTLS).
func newRemote(c *Client, info *poolv1.Segment) (*remote, error) {
	if len(info.Key) == 0 && info.DataAddr != "" {
		// The daemon withholds the key from a client that may not use the
		// segment (Stat shows it, Open cannot reach it).
		return nil, fmt.Errorf("segment %d: %w: this client neither allocated it nor holds an attachment; attach it by name first", info.Id, ErrAccessDenied)
	}
	p, err := c.homePlane(info.Node, info.HomeId, info.Epoch, info.Key, info.DataCredential, info)
	if errors.Is(err, errNoHome) {
		return nil, fmt.Errorf("segment %d: the daemon gave no data-plane address or key for an rdma segment: %w", info.Id, ErrSegmentLost)
	}
	if err != nil {
		return nil, err
	}
	r := &remote{c: c, info: info}
	r.plane.Store(p)
	r.lost.Store(newLostCtx())
	return r, nil
}

// dataTLS is how a client verifies the home of an rdma segment that the
// daemon says is served over TLS: the CA the daemon gave and the home's
// node name, which the home's certificate holds; and the client
// certificate it presents there (own, that of its control-plane
// connection, if any), which the home checks names the identity its
// data-plane credential was issued to. Nil for plaintext.
func dataTLS(info *poolv1.Segment, own []tls.Certificate) (*tls.Config, error) {
	if !info.DataTls {
		return nil, nil
	}
	tc, err := certs.Verifier(info.DataTlsCa, info.DataServerName)
	if err != nil {
		return nil, fmt.Errorf("segment %d: the daemon says its home %s serves TLS but gave nothing to verify it with (%w); upgrade the daemon: %w",
			info.Id, info.DataAddr, err, ErrNotSupported)
	}
	tc.Certificates = own
	return tc, nil
}

// tlsOption passes tc to the tcp transport when the home serves TLS.
func tlsOption(tc *tls.Config) []tcp.Option {
	if tc == nil {
		return nil
	}
	return []tcp.Option{tcp.WithTLS(tc)}
}

// refusals are the answers a home gives instead of doing an operation:
// retrying will not change them. The data plane's errors match these
// farmem sentinels themselves (rdma.ErrAccessDenied is an
// ErrAccessDenied); any other error is a failure to reach the home.
var refusals = []error{ErrAccessDenied, ErrOutOfRange, ErrSegmentLost, ErrLeaseExpired, ErrUnaligned, ErrNotSupported, ErrIndeterminate}

// final reports whether a data-plane error is the home's answer rather
// than a failure to reach it.
func final(err error) bool {
	for _, r := range refusals {
		if errors.Is(err, r) {
			return true
		}
	}
	return false
}

// connKey names a cached data-plane connection: its address, and whether
// it presents the client's failover session (redundant segments) rather
// than the address's own.
type connKey struct {
	addr     string
	failover bool
}

// dataConn returns the cached data-plane connection k, dialing it, and the
// exactly-once session it presents.
func (c *Client) dataConn(ctx context.Context, k connKey, cred []byte, tc *tls.Config) (rdma.Conn, *rdma.Session, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, nil, fmt.Errorf("client: %w", ErrClosed)
	}
	once := c.failover
	if !k.failover {
		once = c.onceSession(k.addr)
	}
	if dc := c.data[k]; dc != nil {
		c.mu.Unlock()
		return dc, once, nil
	}
	c.mu.Unlock()
	dialAddr := k.addr
	if c.opts.dataAddr != nil {
		dialAddr = c.opts.dataAddr(k.addr)
	}
	dc, _, err := dialer.Dial(ctx, dialAddr, cred, append(tlsOption(tc), tcp.WithBusyPoll(c.opts.busyPoll), tcp.WithSession(once))...)
	if err != nil {
		if !final(err) { // not the home's refusal: it was not reached
			err = fmt.Errorf("alloc: data plane at %s not reached (check that the home's poold runs and that this address, its --data-listen, is reachable from here): %w", dialAddr, err)
		}
		return nil, nil, err
	}
	c.dials.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		dc.Close()
		return nil, nil, fmt.Errorf("client: %w", ErrClosed)
	}
	if old := c.data[k]; old != nil {
		dc.Close()
		return old, once, nil
	}
	c.data[k] = dc
	return dc, once, nil
}

// onceSession returns the exactly-once session towards addr, making it;
// c.mu is held.
func (c *Client) onceSession(addr string) *rdma.Session {
	s := c.onces[addr]
	if s == nil {
		s = rdma.NewSession()
		c.onces[addr] = s
	}
	return s
}

// dropDataConn forgets a broken connection so the next operation redials;
// the new generation makes every segment's cached route look it up again.
func (c *Client) dropDataConn(k connKey, dc rdma.Conn) {
	c.mu.Lock()
	if c.data[k] == dc {
		delete(c.data, k)
	}
	c.dataGen.Add(1)
	c.mu.Unlock()
	dc.Close()
}

// connect returns the connection to the home at p and the exactly-once
// session towards it: the segment's cached route while the client has
// dropped no connection since it was looked up, else the client's.
func (r *remote) connect(ctx context.Context, p *plane) (*route, error) {
	gen := r.c.dataGen.Load()
	if rt := r.route.Load(); rt != nil && rt.gen == gen && rt.addr == p.addr {
		return rt, nil
	}
	conn, sess, err := r.c.dataConn(ctx, connKey{addr: p.addr}, r.credential(p), p.tls)
	if err != nil {
		return nil, err
	}
	// gen was read before the lookup: a drop that raced it leaves the
	// route stale, to be looked up again by the next operation.
	rt := &route{addr: p.addr, gen: gen, conn: conn, sess: sess}
	r.route.Store(rt)
	return rt, nil
}

// op runs one operation against the segment's home (run without a
// caller's context) and returns it with its results.
func (r *remote) op(op rdma.Op) (rdma.Op, error) {
	s := singles.Get().(*single)
	s.op = op
	s.list[0] = &s.op
	err := r.run(context.Background(), s.list[:])
	op, s.op = s.op, rdma.Op{}
	singles.Put(s)
	return op, err
}

// single is one op and the list of it that run takes, together, reused
// through singles: an operation on the data path leaves no garbage
// behind. run keeps no reference to the op once it returns.
type single struct {
	op   rdma.Op
	list [1]*rdma.Op
}

var singles = sync.Pool{New: func() any { return new(single) }}

// run runs ops against the segment's home, posted together, redialing
// (and asking the daemon where the segment is now) while the home is
// unreachable, until all succeed, the home refuses one, the segment is
// reported lost, ctx ends, or the operation timeout passes. A read is
// simply posted again. A write or atomic holds a ticket of the
// exactly-once session towards the home, and every retry posts the same
// ticket, so the home applies it once; when that cannot be known (the home
// lost the ticket's reply, moved to another address, or the time ran out
// after the op was sent) the answer is ErrIndeterminate, never a second
// application. Ops that could not get a ticket (the session's slots are
// taken) wait for a later round.
func (r *remote) run(caller context.Context, ops []*rdma.Op) error {
	if err := caller.Err(); err != nil {
		return fmt.Errorf("segment %d: %w", r.info.Id, err)
	}
	ctx, end := opScope(caller, &r.deadline, r.lost.Load(), r.c.opts.opTimeout)
	defer end()
	defer releaseTickets(ops)
	backoff := 20 * time.Millisecond
	// A connection that broke under the ops is redialed at once, the first
	// time after each wait: a home that dropped one connection usually
	// takes the next; one that keeps failing gets the backoff.
	quick := true
	follow := movedWait
	polls := 0      // rounds at an old home that is to hand the segment over
	recheck := true // one Stat for a refusal by a home that may have forgotten a move
	pending := ops
	// reach is the last failure to reach the home while ctx ran (or a
	// dial it cut short, when none came before): what the error says when
	// ctx ends, rather than the end of an attempt it cut short.
	var err, reach error
	for {
		p := r.plane.Load()
		for _, op := range pending {
			op.Region = p.region
		}
		var rt *route
		if rt, err = r.connect(ctx, p); err == nil {
			var ready []*rdma.Op
			if ready, err = tickets(ctx, r.info.Id, pending, rt.sess); errors.Is(err, ErrIndeterminate) {
				return err
			}
			if err == nil {
				err = post(ctx, rt.conn, ready)
				if moved(ready) && !final(err) {
					pending = unfinished(pending)
					if r.handedOver(p, ready) {
						continue // to the copy the old home handed the segment to
					}
					if r.awaitHandover(ctx, p, &follow, &polls) {
						continue // the old home again
					}
					if err = r.follow(ctx, p, &follow); errors.Is(err, errTierMoved) {
						return err
					} else if err != nil {
						return r.timedOut(caller, ctx, pending, err, nil)
					}
					continue
				}
				if err == nil || final(err) {
					pending = unfinished(pending)
					if recheck && denied(pending) {
						recheck = false
						r.refresh(ctx)
						if r.plane.Load().elsewhere(p) {
							continue // it lives elsewhere now
						}
					}
					if err != nil || len(pending) == 0 {
						return err
					}
					continue // the ops that waited for a ticket
				}
				pending = unfinished(pending)
				if ctx.Err() == nil {
					reach = err
					r.c.dropDataConn(connKey{addr: p.addr}, rt.conn)
					if quick {
						quick = false
						continue
					}
				}
			}
		} else if reach == nil || ctx.Err() == nil {
			reach = err
		}
		if ctx.Err() != nil {
			return r.timedOut(caller, ctx, pending, err, reach)
		}
		select {
		case <-ctx.Done():
			continue
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 500*time.Millisecond)
		quick = true
		r.refresh(ctx)
	}
}

// timedOut is the error of ops that ctx ended before they were done, with
// err the last round's failure and reach the last failure to reach the
// home (nil: none), which the error keeps beside the context's end: a
// refused dial says more than the deadline that ended its retries. One
// that ran out the operation timeout matches errs.ErrHomeUnreachable, or,
// when the home is the client's own poold, ErrUnavailable, whose text asks
// whether it runs.
func (r *remote) timedOut(caller, ctx context.Context, pending []*rdma.Op, err, reach error) error {
	node := r.plane.Load().node
	if cause := context.Cause(ctx); errors.Is(cause, ErrSegmentLost) || errors.Is(cause, ErrLeaseExpired) {
		return fmt.Errorf("segment %d on %s: %w", r.info.Id, node, cause)
	}
	why, end := fmt.Sprintf("the home was unreachable for %s", r.c.opts.opTimeout), ctx.Err()
	if caller.Err() != nil {
		why, err, end = "the caller's context ended", caller.Err(), caller.Err()
	}
	if reach != nil {
		err = fmt.Errorf("%w; the last try to reach the home failed: %w", end, reach)
	}
	for _, op := range pending {
		if op.Once != nil && op.Once.Posted() {
			return fmt.Errorf("segment %d on %s: %s at %d sent, but %s after: %w (%w)", r.info.Id, node, op.Kind, op.Offset, why, ErrIndeterminate, err)
		}
	}
	if caller.Err() != nil {
		return fmt.Errorf("segment %d on %s: %s: %w", r.info.Id, node, why, err)
	}
	unreachable := errs.ErrHomeUnreachable
	if node == r.c.Node() {
		unreachable = ErrUnavailable
	}
	return fmt.Errorf("segment %d on %s: not reached within %s: %w (%w)", r.info.Id, node, r.c.opts.opTimeout, err, unreachable)
}

// movedWait is the first wait for the daemon to name a moved segment's new
// home (its switch-over is under way); it doubles to movedWaitMax. A
// switch-over takes a few milliseconds (one fsync of the daemon's store),
// so the cap keeps a client from sleeping long past it; each wait costs one
// Stat of the daemon.
const (
	movedWait    = 250 * time.Microsecond
	movedWaitMax = 2 * time.Millisecond
)

// moved reports whether any of ops was refused because the segment moved
// (or is switching over to a new home). Such an op was not applied: its
// ticket goes back to its session, and the op takes a new one wherever
// the segment lives now.
func moved(ops []*rdma.Op) bool {
	found := false
	for _, op := range ops {
		if errors.Is(op.Err, rdma.ErrMoved) {
			found = true
			if op.Once != nil {
				op.Once.Release()
				op.Once = nil
			}
		}
	}
	return found
}

// follow finds where a moved segment lives now: where the daemon's
// notice of the switch-over (SegmentEvents.moved) or another operation
// found it already, else it asks the daemon (refresh), and while the
// daemon still names the home at old (the switch-over has not committed
// yet) it waits *wait, doubling it up to movedWaitMax; it returns when the
// next round may run, with the context's error, or with errTierMoved once
// the daemon describes the segment on a load/store tier.
func (r *remote) follow(ctx context.Context, old *plane, wait *time.Duration) error {
	if !r.plane.Load().elsewhere(old) {
		r.refresh(ctx)
		if r.loadStore.Load() {
			return fmt.Errorf("segment %d: %w", r.info.Id, errTierMoved)
		}
	}
	if r.plane.Load().elsewhere(old) {
		*wait = movedWait
		return nil
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("the segment is moving and its daemon named no new home in time: %w", rdma.ErrMoved)
	case <-time.After(*wait):
	}
	*wait = min(2**wait, movedWaitMax)
	return nil
}

// handedOver reports whether one of ops was refused MOVED by the home at p
// with the token of the move the daemon told of ahead (r.next): the old
// home's switch-over is done and the copy has every change, so the
// operations go there now, without asking the daemon, whose own word of
// the switch-over (its moved notice, its Stat) comes a hop later. The
// segment's plane is then the copy's, unless another switch replaced p
// meanwhile.
func (r *remote) handedOver(p *plane, ops []*rdma.Op) bool {
	h := r.next.Load()
	if h == nil || h.from.elsewhere(p) {
		return false
	}
	for _, op := range ops {
		var me *rdma.MovedError
		if errors.As(op.Err, &me) && me.Token == h.token {
			if r.plane.CompareAndSwap(p, h.to) {
				r.c.pre.handovers.Add(1)
			}
			r.settled()
			return true
		}
	}
	return false
}

// handoverPolls bounds the rounds an operation refused MOVED (without a
// token) runs again at the old home of a move its daemon told of ahead,
// waiting movedWait, doubling to movedWaitMax, between them: about 20 ms
// in all. The old home hands the segment over as soon as its sealed push
// is done, a hop before its daemon hears of it, so asking the old home
// again is the quicker way to the copy; after these rounds, or when no
// move was told, the operation asks its daemon (follow).
const handoverPolls = 12

// awaitHandover waits before the next round at the old home p while a
// move from p was told ahead (r.next) and fewer than handoverPolls rounds
// ran; false when the operation is to ask its daemon instead, or ctx
// ended.
func (r *remote) awaitHandover(ctx context.Context, p *plane, wait *time.Duration, polls *int) bool {
	h := r.next.Load()
	if h == nil || h.from.elsewhere(p) || *polls >= handoverPolls {
		return false
	}
	*polls++
	select {
	case <-ctx.Done():
		return false
	case <-time.After(*wait):
	}
	*wait = min(2**wait, movedWaitMax)
	return true
}

// settled forgets the move told ahead (r.next) once the segment's plane
// is no longer the home that move leaves: the move ended (a handover, the
// daemon's moved notice or Stat) or another replaced it, and a MOVED
// from the new home is no reason to poll it (awaitHandover).
func (r *remote) settled() {
	if h := r.next.Load(); h != nil && h.from.elsewhere(r.plane.Load()) {
		r.next.CompareAndSwap(h, nil)
	}
}

// expect notes, for the operations of this segment that its old home
// refuses once the switch-over is done, the move its daemon told of
// before the seal (SegmentEvents.moving): the copy at node mv.Node, by
// its id, epoch and key there, reached at mv.DataAddr with the
// credential and TLS settings of the notice. A notice without the copy
// (a daemon from before) notes nothing: the operations ask the daemon.
func (r *remote) expect(mv *poolv1.SegmentMoving) {
	if mv.HomeId == 0 {
		return
	}
	// A notice without the client's credential there leaves it empty:
	// the new home is reached with the session's own (credential), never
	// with the one the old home delegated.
	to, err := r.c.homePlane(mv.Node, mv.HomeId, mv.Epoch, mv.Key, mv.DataCredential,
		&poolv1.Segment{Id: mv.Id, DataAddr: mv.DataAddr, DataTls: mv.DataTls, DataTlsCa: mv.DataTlsCa, DataServerName: mv.DataServerName})
	if err != nil {
		return
	}
	r.next.Store(&handover{from: r.plane.Load(), to: to, token: rdma.MoveToken(to.region.Key, mv.HomeId)})
}

// errNoHome is homePlane's answer for a home described without a key or
// a data-plane address.
var errNoHome = errors.New("no data-plane address or key for the home")

// homePlane is the plane of a home at node that holds a segment as id
// with epoch and key there, reached with cred at the data-plane address
// and TLS settings of at (the daemon describes a segment's home, a
// redundant segment's homes and a move's copy alike); errNoHome when the
// key or the address is missing.
func (c *Client) homePlane(node string, id, epoch uint64, key, cred []byte, at *poolv1.Segment) (*plane, error) {
	p := &plane{node: node, region: rdma.Region{Segment: id, Epoch: epoch}, addr: at.DataAddr, cred: cred}
	if len(key) != len(p.region.Key) || at.DataAddr == "" {
		return nil, errNoHome
	}
	copy(p.region.Key[:], key)
	tc, err := dataTLS(at, c.dataCerts())
	if err != nil {
		return nil, err
	}
	p.tls = tc
	return p, nil
}

// denied reports whether the home refused every op of pending that it
// was sent (ErrAccessDenied), and then gives their tickets back to their
// session: a refused op was not applied, and it takes a new ticket
// wherever it goes next. A home that let a moved segment go and then
// restarted no longer knows that it moved, and refuses its key instead
// of answering MOVED; the daemon's Stat says where it went.
func denied(pending []*rdma.Op) bool {
	found := false
	for _, op := range pending {
		switch {
		case errors.Is(op.Err, ErrAccessDenied):
			found = true
		case !errors.Is(op.Err, errWaiting):
			return false
		}
	}
	if !found {
		return false
	}
	for _, op := range pending {
		if op.Once != nil {
			op.Once.Release()
			op.Once = nil
		}
	}
	return true
}

// unfinished keeps the ops of pending that have not succeeded: those that
// failed and those never posted (Err set by tickets). A finished op's
// ticket goes back to the session at once, for the ops still waiting for
// one. It allocates only when some finished and some did not, so a lone
// op costs none.
func unfinished(pending []*rdma.Op) []*rdma.Op {
	left := 0
	for _, op := range pending {
		if op.Err != nil {
			left++
		} else if op.Once != nil {
			op.Once.Release()
			op.Once = nil
		}
	}
	switch left {
	case 0:
		return nil
	case len(pending):
		return pending
	}
	keep := make([]*rdma.Op, 0, left)
	for _, op := range pending {
		if op.Err != nil {
			keep = append(keep, op)
		}
	}
	return keep
}

// errWaiting marks an op that got no ticket this round.
var errWaiting = errors.New("alloc: waiting for an exactly-once slot")

// post runs ops on conn: a lone read through Read (no batch to set up),
// the rest through Do, which carries their tickets. Each op's Err is set.
func post(ctx context.Context, conn rdma.Conn, ops []*rdma.Op) error {
	if len(ops) == 1 && ops[0].Kind == rdma.OpRead {
		op := ops[0]
		op.Err = conn.Read(ctx, op.Region, op.Offset, op.Buf)
		return op.Err
	}
	return conn.Do(ctx, ops...)
}

// tickets gives each write or atomic of pending a ticket of sess, the
// exactly-once session towards the home, and returns the ops ready to post;
// the others have Err errWaiting. It waits for a slot only while none of
// pending holds one (so two batches never wait for each other's slots),
// else takes what is free. A ticket of another address's session (the
// home moved: it restarted) that was already posted makes the outcome
// unknown.
func tickets(ctx context.Context, seg uint64, pending []*rdma.Op, sess *rdma.Session) ([]*rdma.Op, error) {
	held := false
	for _, op := range pending {
		if op.Once == nil || op.Once.Session() == sess {
			held = held || op.Once != nil
			continue
		}
		if op.Once.Posted() {
			return nil, fmt.Errorf("segment %d: %s at %d was sent to the home's old address, which is gone: %w", seg, op.Kind, op.Offset, rdma.ErrIndeterminate)
		}
		op.Once.Release()
		op.Once = nil
	}
	var ready []*rdma.Op
	for i, op := range pending {
		if op.Once == nil && exactlyOnce(op) {
			if !held {
				t, err := sess.Acquire(ctx)
				if err != nil {
					return nil, err
				}
				op.Once, held = t, true
			} else if t, ok := sess.TryAcquire(); ok {
				op.Once = t
			} else {
				op.Err = errWaiting
				if ready == nil {
					ready = append(make([]*rdma.Op, 0, len(pending)), pending[:i]...)
				}
				continue
			}
		}
		if ready != nil {
			ready = append(ready, op)
		}
	}
	if ready == nil {
		return pending, nil
	}
	return ready, nil
}

// exactlyOnce reports whether op needs a ticket: a write or an atomic
// other than Load64's fetch-and-add of 0, which is idempotent.
func exactlyOnce(op *rdma.Op) bool {
	return op.Kind != rdma.OpRead && (op.Kind != rdma.OpFetchAdd || op.Delta != 0)
}

// refresh asks the daemon where the segment's home serves it now (a
// restarted home may listen on another port; a moved segment has another
// home, id there and key).
func (r *remote) refresh(ctx context.Context) {
	if info, err := r.c.stat(ctx, &poolv1.StatRequest{Id: r.info.Id}); err == nil {
		r.adopt(info)
	}
}

// adopt makes info, the daemon's description of the segment now, where
// its operations go: a restarted home's address and credential, a moved
// segment's new home, id there and key. A description without a
// data-plane address changes nothing, but for a segment now on a
// load/store tier, which no home serves (follow stops).
func (r *remote) adopt(info *poolv1.Segment) {
	if info.Tier != poolv1.Tier_TIER_RDMA && info.Tier != poolv1.Tier_TIER_UNSPECIFIED {
		r.loadStore.Store(true)
	}
	if info.DataAddr == "" {
		return
	}
	tc, err := dataTLS(info, r.c.dataCerts())
	if err != nil {
		return
	}
	r.c.mu.Lock() // one refresh at a time: each keeps the other's credential
	old := r.plane.Load()
	next := &plane{node: info.Node, region: old.region, addr: info.DataAddr, cred: old.cred, tls: tc}
	if len(info.DataCredential) > 0 { // a restarted home issued a new one
		next.cred = info.DataCredential
	}
	if len(info.Key) == len(next.region.Key) && info.HomeId != 0 { // the segment moved
		next.region = rdma.Region{Segment: info.HomeId, Epoch: info.Epoch}
		copy(next.region.Key[:], info.Key)
	}
	r.plane.Store(next)
	r.c.mu.Unlock()
	r.settled()
}

// setLost marks the segment lost (or reachable again) as the daemon
// reports: an rdma segment's calls then fail with ErrSegmentLost instead
// of retrying, and so do those of a segment mapped from a device that went
// away (guarded). Other backends learn of a loss from their memory or home.
func (s *Segment) setLost(lost bool) {
	if s.reclaimed.Load() {
		return
	}
	if b, ok := s.base().(interface{ setLost(bool) }); ok { // remote, redundant, guarded
		b.setLost(lost)
	}
}

// setReclaimed fails the segment's operations from now on with
// ErrLeaseExpired: its daemon reclaimed it when this client's lease ran
// out (the client held no session for longer than the lease TTL). A
// segment mapped with pages of its own (an emulated device's file on
// tmpfs, a DRAM memfd) keeps them: its calls and its Bytes view go on
// reading and writing them, but they are the pool's no more.
func (s *Segment) setReclaimed() {
	s.reclaimed.Store(true)
	why := func() error { return reclaimedErr(s.info.Id) }
	switch b := s.base().(type) {
	case *remote:
		markReclaimed(b.c, &b.lost, why)
	case *redundant:
		markReclaimed(b.c, &b.lost, why)
	case *guarded:
		b.setGone(why())
	}
}

// reclaimedErr is what an operation on segment id answers once its
// daemon said it reclaimed it.
func reclaimedErr(id uint64) error {
	return fmt.Errorf("segment %d was reclaimed: this client had no session with poold for longer than the lease TTL, so its lease ran out; allocate a new segment (alloc.WithName or WithPersist keeps one across a long disconnection): %w", id, ErrLeaseExpired)
}

func (r *remote) setLost(lost bool) {
	markLost(r.c, &r.lost, lost, func() error {
		return fmt.Errorf("the home node %s of segment %d is gone: %w", r.plane.Load().node, r.info.Id, errs.ErrSegmentLost)
	})
}

// markLost cancels the lost context in cur with why() when the daemon
// reports the segment lost, and puts a fresh one in its place when it
// reports it restored; under c.mu, so reports apply in order.
func markLost(c *Client, cur *atomic.Pointer[lostCtx], lost bool, why func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := cur.Load()
	if lost {
		l.cancel(why())
		return
	}
	if l.ctx.Err() != nil {
		cur.Store(newLostCtx())
	}
}

// markReclaimed cancels the lost context in cur with why() for good: one
// that an earlier report of a loss cancelled already is replaced by one
// cancelled with why, so that calls answer the reclaim, not the loss
// (reports of the segment restored no longer reach it: Segment.setLost).
func markReclaimed(c *Client, cur *atomic.Pointer[lostCtx], why func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := cur.Load()
	if l.ctx.Err() != nil {
		l = newLostCtx()
		cur.Store(l)
	}
	l.cancel(why())
}

func (r *remote) readAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if _, err := r.op(rdma.Op{Kind: rdma.OpRead, Offset: off, Buf: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeAt writes p in pieces of at most one data-plane frame, each
// exactly once; a failed piece ends the write (the earlier ones are in).
func (r *remote) writeAt(p []byte, off int64) (int, error) {
	done := 0
	for op := range writeFrames(off, p) {
		if _, err := r.op(op); err != nil {
			return done, err
		}
		done += len(op.Buf)
	}
	return len(p), nil
}

// writeFrames yields the writes of p at off, one per data-plane frame: an
// exactly-once write covers one frame.
func writeFrames(off int64, p []byte) iter.Seq[rdma.Op] {
	return func(yield func(rdma.Op) bool) {
		for done := 0; done < len(p); {
			n := min(len(p)-done, tcp.MaxPayload)
			if !yield(rdma.Op{Kind: rdma.OpWrite, Offset: off + int64(done), Buf: p[done : done+n]}) {
				return
			}
			done += n
		}
	}
}

// load64 is a fetch-and-add of 0, which the home runs with its CPU's
// atomics like every other atomic on the word.
func (r *remote) load64(off int64) (uint64, error) { return r.fetchAdd(off, 0) }

// store64 swaps v in against the value it last saw until the swap holds.
func (r *remote) store64(off int64, v uint64) error {
	cur, err := r.fetchAdd(off, 0)
	for err == nil {
		var swapped bool
		if cur, swapped, err = r.cas(off, cur, v); swapped {
			return nil
		}
	}
	return err
}

func (r *remote) compareAndSwap64(off int64, old, new uint64) (bool, error) {
	_, swapped, err := r.cas(off, old, new)
	return swapped, err
}

func (r *remote) add64(off int64, delta uint64) (uint64, error) {
	prev, err := r.fetchAdd(off, delta)
	return prev + delta, err
}

func (r *remote) fetchAdd(off int64, delta uint64) (prev uint64, err error) {
	op, err := r.op(rdma.Op{Kind: rdma.OpFetchAdd, Offset: off, Delta: delta})
	return op.Prev, err
}

func (r *remote) cas(off int64, old, new uint64) (prev uint64, swapped bool, err error) {
	op, err := r.op(rdma.Op{Kind: rdma.OpCompareAndSwap, Offset: off, Old: old, New: new})
	return op.Prev, op.Swapped, err
}

func (r *remote) bytes() []byte { return nil }

// retire fails the calls still retrying with ErrClosed.
func (r *remote) retire(context.Context) error {
	r.c.mu.Lock()
	l := r.lost.Load()
	r.c.mu.Unlock()
	l.cancel(fmt.Errorf("segment %d: %w", r.info.Id, ErrClosed))
	return nil
}
