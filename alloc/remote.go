package alloc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
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
type remote struct {
	c      *Client
	info   *poolv1.Segment // immutable
	region rdma.Region
	addr   string // the home's data plane; guarded by Client.mu
	// cred is what the data plane's handshake asks for (from the daemon,
	// renewed by refresh); guarded by Client.mu. Empty: the session's own.
	cred []byte
	// tls verifies the home when it serves its data plane over TLS (nil:
	// plaintext); guarded by Client.mu, renewed by refresh.
	tls *tls.Config
	// lost is cancelled, with cause ErrSegmentLost, while the daemon reports
	// the home lost; a restored segment gets a fresh one.
	lost   context.Context
	cancel context.CancelCauseFunc
}

var _ backend = (*remote)(nil)

// newRemote is the backend of a segment the daemon placed on the rdma tier;
// it presents c's client certificate to the home (see dataTLS).
func newRemote(c *Client, info *poolv1.Segment) (*remote, error) {
	var key rdma.Key
	if len(info.Key) == 0 && info.DataAddr != "" {
		// The daemon withholds the key from a client that may not use the
		// segment (Stat shows it, Open cannot reach it).
		return nil, fmt.Errorf("segment %d: %w: this client neither allocated it nor holds an attachment; attach it by name first", info.Id, ErrAccessDenied)
	}
	if len(info.Key) != len(key) || info.DataAddr == "" {
		return nil, fmt.Errorf("segment %d: the daemon gave no data-plane address or key for an rdma segment: %w", info.Id, ErrSegmentLost)
	}
	copy(key[:], info.Key)
	tc, err := dataTLS(info, c.dataCerts())
	if err != nil {
		return nil, err
	}
	r := &remote{c: c, info: info, region: rdma.Region{Segment: info.HomeId, Key: key, Epoch: info.Epoch}, addr: info.DataAddr, cred: info.DataCredential, tls: tc}
	r.lost, r.cancel = context.WithCancelCause(context.Background())
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

// dataConn returns the cached data-plane connection to addr, dialing it.
func (c *Client) dataConn(ctx context.Context, addr string, cred []byte, tc *tls.Config) (rdma.Conn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("client: %w", ErrClosed)
	}
	if dc := c.data[addr]; dc != nil {
		c.mu.Unlock()
		return dc, nil
	}
	once := c.onceSession(addr)
	c.mu.Unlock()
	dialAddr := addr
	if c.opts.dataAddr != nil {
		dialAddr = c.opts.dataAddr(addr)
	}
	dc, _, err := dialer.Dial(ctx, dialAddr, cred, append(tlsOption(tc), tcp.WithBusyPoll(c.opts.busyPoll), tcp.WithSession(once))...)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		dc.Close()
		return nil, fmt.Errorf("client: %w", ErrClosed)
	}
	if old := c.data[addr]; old != nil {
		dc.Close()
		return old, nil
	}
	c.data[addr] = dc
	return dc, nil
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

// dropDataConn forgets a broken connection so the next operation redials.
func (c *Client) dropDataConn(addr string, dc rdma.Conn) {
	c.mu.Lock()
	if c.data[addr] == dc {
		delete(c.data, addr)
	}
	c.mu.Unlock()
	dc.Close()
}

// op runs op against the segment's home, redialing (and asking the
// daemon where the segment is now) while the home is unreachable, until it
// succeeds, the home refuses, the segment is reported lost, or the
// operation timeout passes. A read is simply posted again. A write or
// atomic holds a ticket of the exactly-once session towards the home, and
// every retry posts the same ticket, so the home applies it once; when
// that cannot be known (the home lost the ticket's reply, moved to another
// address, or the timeout passed after the op was sent) the answer is
// ErrIndeterminate, never a second application.
func (r *remote) op(op *rdma.Op) error {
	r.c.mu.Lock()
	lost := r.lost
	r.c.mu.Unlock()
	ctx, cancel := context.WithTimeout(lost, r.c.opts.opTimeout)
	defer cancel()
	op.Region = r.region
	defer func() {
		if op.Once != nil {
			op.Once.Release()
		}
	}()
	backoff := 20 * time.Millisecond
	// A connection that broke under the op is redialed at once, the first
	// time after each wait: a home that dropped one connection usually
	// takes the next; one that keeps failing gets the backoff.
	quick := true
	for {
		addr, cred, tc := r.dataAddr()
		err := r.ticket(ctx, op, addr)
		if errors.Is(err, ErrIndeterminate) {
			return err
		}
		var conn rdma.Conn
		if err == nil {
			conn, err = r.c.dataConn(ctx, addr, cred, tc)
		}
		if err == nil {
			err = post(ctx, conn, op)
			if err == nil || final(err) {
				return err
			}
			if ctx.Err() == nil {
				r.c.dropDataConn(addr, conn)
				if quick {
					quick = false
					continue
				}
			}
		}
		if ctx.Err() != nil {
			if cause := context.Cause(ctx); errors.Is(cause, ErrSegmentLost) {
				return fmt.Errorf("segment %d on %s: %w", r.info.Id, r.info.Node, cause)
			}
			if op.Once != nil && op.Once.Posted() {
				return fmt.Errorf("segment %d on %s: %s at %d sent, but the home was unreachable for %s after: %w (%w)", r.info.Id, r.info.Node, op.Kind, op.Offset, r.c.opts.opTimeout, ErrIndeterminate, err)
			}
			return fmt.Errorf("segment %d on %s: home unreachable for %s: %w (%w; retry, or wait for the pool to report the segment lost)", r.info.Id, r.info.Node, r.c.opts.opTimeout, err, ErrUnavailable)
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

// post runs op on conn: a read through Read (no batch to set up), the
// others through Do, which carries their tickets.
func post(ctx context.Context, conn rdma.Conn, op *rdma.Op) error {
	if op.Kind == rdma.OpRead {
		return conn.Read(ctx, op.Region, op.Offset, op.Buf)
	}
	return conn.Do(ctx, op)
}

// ticket gives a write or atomic a ticket of the exactly-once session
// towards addr. A ticket of another address's session (the home moved:
// it restarted) that was already posted makes the outcome unknown.
func (r *remote) ticket(ctx context.Context, op *rdma.Op, addr string) error {
	if op.Kind == rdma.OpRead || (op.Kind == rdma.OpFetchAdd && op.Delta == 0) { // Load64: idempotent
		return nil
	}
	r.c.mu.Lock()
	sess := r.c.onceSession(addr)
	r.c.mu.Unlock()
	if op.Once != nil {
		if op.Once.Session() == sess {
			return nil
		}
		if op.Once.Posted() {
			return fmt.Errorf("segment %d: %s at %d was sent to the home's old address, which is gone: %w", r.info.Id, op.Kind, op.Offset, rdma.ErrIndeterminate)
		}
		op.Once.Release()
		op.Once = nil
	}
	t, err := sess.Acquire(ctx)
	if err != nil {
		return err
	}
	op.Once = t
	return nil
}

// dataAddr is where the segment's home serves it, the credential its
// handshake takes (the daemon's for this segment, else the session's own)
// and how to verify the home over TLS (nil: plaintext).
func (r *remote) dataAddr() (string, []byte, *tls.Config) {
	r.c.mu.Lock()
	addr, cred, tc := r.addr, r.cred, r.tls
	r.c.mu.Unlock()
	if len(cred) == 0 {
		cred = r.c.sess.DataCredential()
	}
	return addr, cred, tc
}

// refresh asks the daemon where the segment's home serves it now (a
// restarted home may listen on another port).
func (r *remote) refresh(ctx context.Context) {
	cctx, _, err := r.c.callCtx(ctx)
	if err != nil {
		return
	}
	info, err := r.c.api.Stat(cctx, &poolv1.StatRequest{Id: r.info.Id})
	if err != nil || info.DataAddr == "" {
		return
	}
	tc, err := dataTLS(info, r.c.dataCerts())
	if err != nil {
		return
	}
	r.c.mu.Lock()
	r.addr, r.tls = info.DataAddr, tc
	if len(info.DataCredential) > 0 { // a restarted home issued a new one
		r.cred = info.DataCredential
	}
	r.c.mu.Unlock()
}

// setLost marks the segment lost (or reachable again) as the daemon
// reports: an rdma segment's calls then fail with ErrSegmentLost instead
// of retrying. Other backends learn of a loss from their memory or home.
func (s *Segment) setLost(lost bool) {
	if r, ok := s.base().(*remote); ok {
		r.setLost(lost)
	}
}

func (r *remote) setLost(lost bool) {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	if lost {
		r.cancel(fmt.Errorf("the home node %s of segment %d is gone: %w", r.info.Node, r.info.Id, errs.ErrSegmentLost))
		return
	}
	if r.lost.Err() != nil {
		r.lost, r.cancel = context.WithCancelCause(context.Background())
	}
}

func (r *remote) readAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if err := r.op(&rdma.Op{Kind: rdma.OpRead, Offset: off, Buf: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeAt writes p in pieces of at most one data-plane frame, each
// exactly once; a failed piece ends the write (the earlier ones are in).
func (r *remote) writeAt(p []byte, off int64) (int, error) {
	for done := 0; done < len(p); {
		n := min(len(p)-done, tcp.MaxPayload)
		if err := r.op(&rdma.Op{Kind: rdma.OpWrite, Offset: off + int64(done), Buf: p[done : done+n]}); err != nil {
			return done, err
		}
		done += n
	}
	return len(p), nil
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
	op := rdma.Op{Kind: rdma.OpFetchAdd, Offset: off, Delta: delta}
	err = r.op(&op)
	return op.Prev, err
}

func (r *remote) cas(off int64, old, new uint64) (prev uint64, swapped bool, err error) {
	op := rdma.Op{Kind: rdma.OpCompareAndSwap, Offset: off, Old: old, New: new}
	err = r.op(&op)
	return op.Prev, op.Swapped, err
}

func (r *remote) bytes() []byte { return nil }

// retire fails the calls still retrying with ErrClosed.
func (r *remote) retire(context.Context) error {
	r.c.mu.Lock()
	cancel := r.cancel
	r.c.mu.Unlock()
	cancel(fmt.Errorf("segment %d: %w", r.info.Id, ErrClosed))
	return nil
}
