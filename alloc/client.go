package alloc

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/emulation"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/fdpass"
	"github.com/farmem/farmem/internal/mmap"
	"github.com/farmem/farmem/internal/paths"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// Client is a connection to the local poold: a control-plane channel, a
// session that keeps the client's lease alive (re-established by itself if
// the daemon restarts), and a descriptor channel for mapping segments.
// It is safe for concurrent use. Close it when done: its segments are then
// reclaimed after the lease TTL unless named or persistent.
type Client struct {
	socket  string // the daemon's address: a socket path, or host:port for tcp
	network string // unix or tcp
	opts    dialOptions
	sess    *session.Conn
	api     poolv1.PoolClient
	emulate emulation.Spec // WithEmulateLatency; overrides the daemon's per tier

	fdMu sync.Mutex                  // serializes calls on the descriptor channel
	fd   atomic.Pointer[fdpass.Conn] // the descriptor channel; nil until needed

	mu   sync.Mutex
	data map[connKey]rdma.Conn // data-plane connections by address
	// dataGen counts the data-plane connections dropped (and Close): a
	// segment's cached connection is good while it is unchanged.
	dataGen atomic.Uint64
	// onces holds the exactly-once session towards each data-plane
	// address; it outlives the connections, so a write or atomic retried
	// on a new connection is answered from the home's reply cache.
	onces map[string]*rdma.Session
	// failover is the one exactly-once session that every home of every
	// redundant segment sees: a write retried at a new primary after its
	// old one failed carries the same ticket, which the new primary knows
	// from the old one's forwarding (see redundant).
	failover *rdma.Session
	segs     map[*Segment]struct{}
	closed   bool
	// dials counts the data-plane connections opened (ClientStats).
	dials atomic.Int64
	// pre are the connections opened ahead of live moves.
	pre preconnects

	prefetch prefetchCounters // read-ahead on rdma segments (Stats)
}

// Dial connects to the poold at target and opens a session. target is ""
// for the default socket ($FARMEM_SOCKET, else the daemon's default path),
// a unix socket path (absolute or relative to the working directory; also
// written unix://PATH), or tcp://HOST:PORT for a daemon's TCP control plane:
// a remote client reaches rdma segments only, since segment descriptors
// pass over unix sockets alone. A bad target is ErrInvalid.
func Dial(ctx context.Context, target string, opts ...DialOption) (*Client, error) {
	o := dialOptions{clientName: filepath.Base(os.Args[0]), timeout: 5 * time.Second, opTimeout: 30 * time.Second, failover: 2 * time.Second, busyPoll: tcp.DefaultBusyPoll}
	for _, opt := range opts {
		opt(&o)
	}
	if o.clientID == "" {
		var b [8]byte
		rand.Read(b[:])
		o.clientID = fmt.Sprintf("%s-%d-%s", o.clientName, os.Getpid(), hex.EncodeToString(b[:]))
	}
	network, path, err := paths.ParseTarget(target)
	if err != nil {
		return nil, err
	}
	var emulate emulation.Spec
	if o.emulate != nil {
		if emulate, err = emulation.Parse(*o.emulate); err != nil {
			return nil, fmt.Errorf("%w: WithEmulateLatency: %w", ErrInvalid, err)
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	c := &Client{socket: path, network: network, opts: o, emulate: emulate, segs: map[*Segment]struct{}{}, data: map[connKey]rdma.Conn{}, onces: map[string]*rdma.Session{}, failover: rdma.NewSession()}
	c.pre.addrs = map[string]bool{}
	c.pre.ctx, c.pre.stop = context.WithCancel(context.Background())
	c.sess, err = session.Dial(ctx, network, path, session.Options{
		ClientID: o.clientID, ClientName: o.clientName,
		OnEvents: c.segmentEvents, OnReclaimed: c.segmentsReclaimed,
		TLS:     tlsFor(network, o.tls),
		OnDown:  c.dropFD,
		MaxWait: o.timeout,
	})
	if err != nil {
		return nil, dialError(ctx, network, path, o.tls, err)
	}
	c.api = c.sess.API()
	if o.api != nil {
		c.api = o.api(c.api)
	}
	return c, nil
}

// dropFD forgets the descriptor channel of a session that broke: the
// daemon behind it may be a new one.
func (c *Client) dropFD() {
	if fd := c.fd.Swap(nil); fd != nil {
		fd.Close()
	}
}

// callCtx adds the session to ctx, waiting (within ctx) for a session while
// the client reconnects.
func (c *Client) callCtx(ctx context.Context) (context.Context, string, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, "", fmt.Errorf("client: %w", ErrClosed)
	}
	return c.sess.Call(ctx)
}

// Node is the name of the poold the client is connected to.
func (c *Client) Node() string { return c.sess.Node() }

// ID is the client's identity (see WithClientID).
func (c *Client) ID() string { return c.opts.clientID }

// segmentEvents applies the daemon's lost/restored notices to our
// segments, notes the copy moving ones go to and connects there ahead,
// and sends the operations of moved ones to their new home.
func (c *Client) segmentEvents(ev *poolv1.SegmentEvents) {
	lost := map[uint64]bool{}
	for _, id := range ev.Lost {
		lost[id] = true
	}
	for _, id := range ev.Restored {
		lost[id] = false
	}
	moved := map[uint64]*poolv1.Segment{}
	for _, info := range ev.Moved {
		moved[info.Id] = info
	}
	moving := map[uint64]*poolv1.SegmentMoving{}
	for _, mv := range ev.Moving {
		moving[mv.Id] = mv
	}
	c.mu.Lock()
	var hit, went, going []*Segment
	for s := range c.segs {
		if _, ok := lost[s.info.Id]; ok {
			hit = append(hit, s)
		}
		if moved[s.info.Id] != nil {
			went = append(went, s)
		}
		if moving[s.info.Id] != nil {
			going = append(going, s)
		}
	}
	c.mu.Unlock()
	for _, s := range going {
		if r, ok := s.base().(*remote); ok {
			r.expect(moving[s.info.Id])
		}
	}
	for _, s := range hit {
		s.setLost(lost[s.info.Id])
	}
	for _, mv := range ev.Moving {
		c.preconnect(mv)
	}
	for _, s := range went {
		if r, ok := s.base().(*remote); ok {
			r.adopt(moved[s.info.Id])
		}
	}
}

// segmentsReclaimed fails the operations of the client's segments ids,
// which the daemon reclaimed when the client's lease ran out, with
// ErrLeaseExpired (Segment.setReclaimed).
func (c *Client) segmentsReclaimed(ids []uint64) {
	gone := map[uint64]bool{}
	for _, id := range ids {
		gone[id] = true
	}
	c.mu.Lock()
	var hit []*Segment
	for s := range c.segs {
		if gone[s.info.Id] {
			hit = append(hit, s)
		}
	}
	c.mu.Unlock()
	for _, s := range hit {
		s.setReclaimed()
	}
}

// Alloc allocates a segment of size bytes. See WithTier, WithName,
// WithFallback, WithPersist and WithPopulate.
func (c *Client) Alloc(ctx context.Context, size int64, opts ...AllocOption) (*Segment, error) {
	var ao allocConfig
	for _, opt := range opts {
		opt(&ao)
	}
	req, err := ao.request(size)
	if err != nil {
		return nil, err
	}
	cctx, sid, err := c.callCtx(ctx)
	if err != nil {
		return nil, err
	}
	ao.fresh = true
	if c.network == "unix" {
		return c.allocFast(ctx, sid, req, ao)
	}
	info, err := c.api.Alloc(cctx, req)
	if err != nil {
		return nil, errs.FromStatus(err)
	}
	seg, err := c.open(ctx, sid, info, ao)
	if err != nil {
		if _, ferr := c.api.Free(cctx, &poolv1.FreeRequest{Id: info.Id}); ferr != nil {
			err = errors.Join(err, errs.FromStatus(ferr))
		}
		return nil, err
	}
	return seg, nil
}

// allocFast allocates over the descriptor channel: one unix-socket round
// trip that returns the segment's description with its descriptor.
func (c *Client) allocFast(ctx context.Context, sid string, req *poolv1.AllocRequest, ao allocConfig) (*Segment, error) {
	body, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := c.fdCall(ctx, fdpass.Request{Op: fdpass.OpAlloc, Session: sid, Body: body})
	if err != nil {
		return nil, err
	}
	info := &poolv1.Segment{}
	if err := proto.Unmarshal(resp.Body, info); err != nil {
		if resp.File != nil {
			resp.File.Close()
		}
		return nil, fmt.Errorf("alloc: the daemon's reply does not decode: %w (%w)", err, ErrUnavailable)
	}
	if resp.File == nil {
		return c.open(ctx, sid, info, ao) // an rdma segment: no descriptor
	}
	defer resp.File.Close()
	be, mem, err := mapSegment(info, resp.File, resp.Offset, resp.Length, ao.populate)
	if err == nil {
		var s *Segment
		if s, err = c.track(c.newSegment(info, be)); err == nil {
			return s, nil
		}
		mmap.Unmap(mem)
	}
	if _, ferr := c.fdCall(ctx, fdpass.Request{Op: fdpass.OpFree, Session: sid, Segment: info.Id}); ferr != nil {
		err = errors.Join(err, ferr)
	}
	return nil, fmt.Errorf("map segment %d: %w", info.Id, err)
}

// Attach opens the named segment, which another client (or memctl) created
// with WithName. With Shared it joins the segment as a shared segment whose
// accesses are cached and kept coherent across hosts; without, accesses to
// an rdma segment go to its home uncached. It fails with ErrAccessDenied
// unless this client's identity is the creator's or one the creator
// granted (AllowIdentity, AllowFree).
//
// The attachment lets this client map the segment (also by id, with Open)
// until it gives it up: Segment.Close unmaps it here and gives the
// attachment up, leaving the segment to its owner. Segment.Free instead
// deletes the segment for everyone (owner and every other attacher) when
// this client may free it, that is when its identity is the creator's (on
// the unix socket: the same uid) or was granted AllowFree; attaching alone
// gives no right to free, and such a Free fails with ErrAccessDenied.
// Client.Close unmaps it and keeps the attachment, so that a client with
// the same WithClientID can Open it again.
//
// When a home of the segment cannot be told of the attachment (its host
// does not answer), Attach fails with ErrUnavailable: the attachment is
// recorded and the daemon tells the home in the background, so a retried
// Attach succeeds once it was told; Detach withdraws it instead.
func (c *Client) Attach(ctx context.Context, name string, opts ...AttachOption) (*Segment, error) {
	var o attachOptions
	for _, opt := range opts {
		opt(&o)
	}
	cctx, sid, err := c.callCtx(ctx)
	if err != nil {
		return nil, err
	}
	info, err := c.api.Attach(cctx, &poolv1.AttachRequest{Name: name})
	if err != nil {
		return nil, errs.FromStatus(err)
	}
	if o.shared != nil {
		return c.attachShared(ctx, info, *o.shared)
	}
	return c.open(ctx, sid, info, allocConfig{})
}

// Tiers describes the tiers the daemon offers.
func (c *Client) Tiers(ctx context.Context) ([]TierInfo, error) {
	cctx, _, err := c.callCtx(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := c.api.Tiers(cctx, &poolv1.TiersRequest{})
	if err != nil {
		return nil, errs.FromStatus(err)
	}
	out := make([]TierInfo, len(resp.Tiers))
	for i, t := range resp.Tiers {
		out[i] = c.overrideTier(tierInfoFromProto(t))
	}
	return out, nil
}

// open maps a segment the daemon described.
func (c *Client) open(ctx context.Context, sid string, info *poolv1.Segment, ao allocConfig) (*Segment, error) {
	if info.State == poolv1.SegmentState_SEGMENT_STATE_LOST {
		return nil, fmt.Errorf("segment %d: %w", info.Id, ErrSegmentLost)
	}
	if info.Tier == poolv1.Tier_TIER_RDMA && len(info.Homes) > 1 {
		r, err := newRedundant(c, info)
		if err != nil {
			return nil, err
		}
		return c.track(c.newSegment(info, r))
	}
	if info.Tier == poolv1.Tier_TIER_RDMA {
		r, err := newRemote(c, info)
		if err != nil {
			return nil, err
		}
		if ao.fresh && heldAlone(info) && !c.opts.noReadAhead {
			return c.track(c.newSegment(info, newReadahead(r, &c.prefetch)))
		}
		return c.track(c.newSegment(info, r))
	}
	resp, err := c.getFD(ctx, sid, info.Id)
	if err != nil {
		return nil, err
	}
	defer resp.File.Close()
	be, mem, err := mapSegment(info, resp.File, resp.Offset, resp.Length, ao.populate)
	if err != nil {
		return nil, fmt.Errorf("map segment %d: %w", info.Id, err)
	}
	s, err := c.track(c.newSegment(info, be))
	if err != nil {
		mmap.Unmap(mem)
	}
	return s, err
}

// track adds a segment to those the client closes, with the latency
// emulation of its tier.
func (c *Client) track(s *Segment) (*Segment, error) {
	s.setBackend(withEmulation(s.backend(), c.injected(s.info.Tier, s.info.Injected)))
	if err := c.register(s); err != nil {
		return nil, err
	}
	return s, nil
}

// register adds a segment to those Close retires.
func (c *Client) register(s *Segment) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("client: %w", ErrClosed)
	}
	c.segs[s] = struct{}{}
	return nil
}

// getFD asks the daemon for a segment's descriptor on the shared
// descriptor connection, dialing it when needed.
func (c *Client) getFD(ctx context.Context, sid string, id uint64) (fdpass.Response, error) {
	if c.network != "unix" {
		return fdpass.Response{}, fmt.Errorf("segment %d: a client connected over TCP reaches rdma segments only; dial the local poold's unix socket to map local and cxl segments: %w", id, ErrNotSupported)
	}
	return c.fdCall(ctx, fdpass.Request{Op: fdpass.OpGet, Session: sid, Segment: id})
}

// fdCall makes one call on the shared descriptor channel, dialing it when
// needed. Only a GET, which changes nothing, is retried on a new channel.
func (c *Client) fdCall(ctx context.Context, req fdpass.Request) (fdpass.Response, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(c.opts.timeout)
	}
	// One request at a time on the channel; c.mu stays free for segment
	// operations meanwhile.
	c.fdMu.Lock()
	defer c.fdMu.Unlock()
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return fdpass.Response{}, fmt.Errorf("client: %w", ErrClosed)
		}
		fc := c.fd.Load()
		if fc == nil {
			var err error
			if fc, err = fdpass.Dial(c.socket); err != nil {
				return fdpass.Response{}, fmt.Errorf("descriptor channel to %s: %w (%w)", c.socket, err, ErrUnavailable)
			}
			c.fd.Store(fc)
		}
		resp, err := fc.Do(req, deadline)
		if err == nil {
			if resp.Err != nil {
				return fdpass.Response{}, resp.Err
			}
			return resp, nil
		}
		if c.fd.CompareAndSwap(fc, nil) {
			fc.Close()
		}
		if attempt > 0 || req.Op != fdpass.OpGet {
			return fdpass.Response{}, fmt.Errorf("descriptor channel to %s: %w (%w)", c.socket, err, ErrUnavailable)
		}
	}
}

// free releases a segment on the daemon.
func (c *Client) free(ctx context.Context, s *Segment) error {
	c.mu.Lock()
	delete(c.segs, s)
	c.mu.Unlock()
	if s.reclaimed.Load() {
		return nil // freed by the daemon when the lease ran out
	}
	if c.network == "unix" {
		_, sid, err := c.callCtx(ctx)
		if err != nil {
			return err
		}
		_, err = c.fdCall(ctx, fdpass.Request{Op: fdpass.OpFree, Session: sid, Segment: s.info.Id})
		return err
	}
	return c.freeReq(ctx, &poolv1.FreeRequest{Id: s.info.Id})
}

// detach forgets a segment that Segment.Close retired, tells the daemon
// that this client no longer maps it, and gives up the client's
// attachment to it on the daemon, unless the client owns it or holds it
// open through another Segment value. A segment freed meanwhile has
// nothing left to give up.
func (c *Client) detach(ctx context.Context, s *Segment) error {
	c.mu.Lock()
	delete(c.segs, s)
	held := false
	for o := range c.segs {
		held = held || o.info.Id == s.info.Id
	}
	c.mu.Unlock()
	if !held && s.mappedBase() != nil {
		c.release(ctx, s.info.Id)
	}
	if held || s.info.Owner == c.opts.clientID {
		return nil
	}
	cctx, _, err := c.callCtx(ctx)
	if err != nil {
		return err
	}
	_, err = c.api.Detach(cctx, &poolv1.DetachRequest{Id: s.info.Id})
	if err = errs.FromStatus(err); errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("segment %d: give up the attachment: %w", s.info.Id, err)
	}
	return nil
}

// Close ends the session and unmaps every segment the client still holds
// (their memory stays with the daemon until freed or their lease ends).
// It is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	segs := c.segs
	c.segs = nil
	fd := c.fd.Swap(nil) // a call blocked on it fails at once
	data := c.data
	c.data = nil
	c.dataGen.Add(1)
	c.mu.Unlock()
	c.pre.stop()
	c.pre.wg.Wait() // a dial that ends now finds the client closed
	for s := range segs {
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.timeout)
		s.retire(ctx) // their memory stays with the daemon: nothing to report
		cancel()
	}
	var err error
	if fd != nil {
		c.releaseAll(fd, segs)
		err = fd.Close()
	}
	for _, dc := range data {
		err = errors.Join(err, dc.Close())
	}
	return errors.Join(err, c.sess.Close())
}

// FreeByID frees a segment by id without holding it, e.g. one a previous
// run of the application allocated under the same client id.
func (c *Client) FreeByID(ctx context.Context, id uint64) error {
	return c.freeReq(ctx, &poolv1.FreeRequest{Id: id})
}

// FreeByName frees a named segment.
func (c *Client) FreeByName(ctx context.Context, name string) error {
	return c.freeReq(ctx, &poolv1.FreeRequest{Name: name})
}

func (c *Client) freeReq(ctx context.Context, req *poolv1.FreeRequest) error {
	cctx, _, err := c.callCtx(ctx)
	if err != nil {
		return err
	}
	_, err = c.api.Free(cctx, req)
	return errs.FromStatus(err)
}

// stat asks the daemon for its description of a segment now.
func (c *Client) stat(ctx context.Context, req *poolv1.StatRequest) (*poolv1.Segment, error) {
	cctx, _, err := c.callCtx(ctx)
	if err != nil {
		return nil, err
	}
	info, err := c.api.Stat(cctx, req)
	return info, errs.FromStatus(err)
}

// Open maps an existing segment by id: one the client allocated (e.g.
// before the application restarted with the same WithClientID) or attached.
func (c *Client) Open(ctx context.Context, id uint64) (*Segment, error) {
	cctx, sid, err := c.callCtx(ctx)
	if err != nil {
		return nil, err
	}
	info, err := c.api.Stat(cctx, &poolv1.StatRequest{Id: id})
	if err != nil {
		return nil, errs.FromStatus(err)
	}
	return c.open(ctx, sid, info, allocConfig{})
}

// dataCerts is the client certificate this client presents on homes' data
// planes: its control-plane certificate over tcp, none over a unix socket
// (its identity there is its uid, which no certificate names).
func (c *Client) dataCerts() []tls.Certificate {
	if tc := tlsFor(c.network, c.opts.tls); tc != nil {
		return tc.Certificates
	}
	return nil
}

// tlsFor is the TLS configuration of a connection over network: cfg over
// tcp, none over a unix socket (the daemon checks its peer's uid there).
func tlsFor(network string, cfg *tls.Config) *tls.Config {
	if network != "tcp" {
		return nil
	}
	return cfg
}
