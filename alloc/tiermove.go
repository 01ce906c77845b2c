package alloc

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/fdpass"
	"github.com/farmem/farmem/internal/mmap"
)

// errTierMoved is an operation an rdma segment's home refused (not
// applied) because the segment moved to a load/store tier: a client
// reaches it there only by mapping it, on the host whose daemon holds it.
// The client whose Move promoted the segment switches it over and runs the
// operation again (Segment.again); any other sees this error.
var errTierMoved = errs.Sub(errs.ErrNotSupported, "the segment moved to a load/store tier (cxl, local), which a client reaches only by mapping it on the host of its daemon: open it again there (Client.Open)")

// awaitSwitch waits for the tier switch under way, if any, to end, and
// reports whether there was one.
func (s *Segment) awaitSwitch() bool {
	ch := s.switching.Load()
	if ch == nil {
		runtime.Gosched() // a switch that is just ending: its state follows
		return false
	}
	<-*ch
	return true
}

// beginSwitch announces a switch of the segment's backend: calls that the
// old backend refuses because the segment changed tier wait for it
// (again). It fails on a closed segment.
func (s *Segment) beginSwitch() (chan struct{}, error) {
	ch := make(chan struct{})
	if !s.switching.CompareAndSwap(nil, &ch) {
		return nil, fmt.Errorf("move segment %d: %w; one move of a segment at a time", s.info.Id, ErrLimit)
	}
	if s.closedNow() {
		s.switching.Store(nil)
		return nil, s.errClosed()
	}
	return ch, nil
}

// hold makes calls wait (use) and waits until none has the backend
// pinned, and until every ReadAt and WriteAt that began before either is
// in memory or will run again (barrier); false when the segment was
// closed meanwhile.
func (s *Segment) hold() bool {
	if !s.setState(segOpen, segSwitching, true) {
		return false
	}
	barrier()
	for i := 0; s.state.Load() >= pin; i++ {
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(10 * time.Microsecond)
		}
	}
	return true
}

// endSwitch ends a switch begun with ch: with be, the segment is reached
// through be from now on and desc describes it; calls resume. It returns
// the backend replaced (nil when be is nil), for the caller to retire.
func (s *Segment) endSwitch(ch chan struct{}, be backend, desc *poolv1.Segment) backend {
	var old backend
	if be != nil {
		old = s.backend()
		s.setBackend(be)
		s.desc.Store(desc)
	}
	s.setState(segSwitching, segOpen, false)
	s.switching.Store(nil)
	close(ch)
	return old
}

// demote moves a load/store segment to the rdma tier: calls on it wait
// while this process's mapping is given up and the daemon copies the
// bytes to a new home; then they go there. The daemon refuses (ErrInUse)
// while another client maps the segment.
func (c *Client) demote(ctx context.Context, s *Segment, o moveOptions) error {
	if other := c.otherMapping(s); other {
		return fmt.Errorf("move segment %d to the rdma tier: %w: this client maps it through another Segment too (Open or Attach again); Close that one first", s.ID(), ErrInUse)
	}
	ch, err := s.beginSwitch()
	if err != nil {
		return err
	}
	if !s.hold() {
		s.endSwitch(ch, nil, nil)
		return s.errClosed()
	}
	resp, err := c.moveCall(ctx, s, o)
	if err != nil {
		info, moved, rerr := c.resolveDemotion(ctx, s, err)
		switch {
		case rerr != nil:
			// The daemon may have moved the segment and then lost the
			// answer: its memory here may be the segment's no longer, and
			// a write to it would be lost (or land in another segment's).
			return errors.Join(rerr, c.closeSwitching(ctx, s, ch))
		case !moved:
			s.endSwitch(ch, nil, nil)
			return err
		}
		resp = &poolv1.MoveResponse{Segment: info}
	}
	r, err := newRemote(c, resp.Segment)
	if err != nil {
		// It moved, but this client cannot reach its new home: the
		// segment is closed here, the moved one is whole.
		return errors.Join(fmt.Errorf("segment %d moved to %s on the rdma tier, and this client cannot reach it there (%w); open it again", s.ID(), resp.Segment.Node, err), c.closeSwitching(ctx, s, ch))
	}
	old := s.endSwitch(ch, withEmulation(r, c.injected(resp.Segment.Tier, resp.Segment.Injected)), resp.Segment)
	return old.retire(ctx)
}

// closeSwitching closes s, whose switch begun with ch cannot end at a
// backend: its mapping is given up and s forgotten, and the daemon is
// told, best effort within moveResolveWait (it may be down: the end of
// this client's lease there does the same), that this client no longer
// maps it, so that a Segment opened again can be moved.
func (c *Client) closeSwitching(ctx context.Context, s *Segment, ch chan struct{}) error {
	old := s.backend()
	s.setState(segSwitching, segClosed, false)
	s.endSwitch(ch, nil, nil)
	err := old.retire(ctx)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), moveResolveWait)
	defer cancel()
	_ = c.detach(dctx, s)
	return err
}

// moveResolveWait bounds how long a demotion whose answer did not come
// waits for the daemon to say where the segment is.
const moveResolveWait = 5 * time.Second

// resolveDemotion finds out what became of s, whose demotion failed with
// moveErr: moved (with info, the segment at its new home) when the daemon
// moved it although its answer did not arrive; neither when the daemon
// refused the move (a typed refusal: nothing moved) or says the segment is
// where it was. An error when the daemon cannot say within
// moveResolveWait: whether the segment is still in the memory this
// client maps is then unknown.
func (c *Client) resolveDemotion(ctx context.Context, s *Segment, moveErr error) (info *poolv1.Segment, moved bool, err error) {
	for _, refused := range []error{ErrInUse, ErrInvalid, ErrNotSupported, ErrNoCapacity, ErrNotFound, ErrLimit, ErrAccessDenied, ErrLeaseExpired} {
		if errors.Is(moveErr, refused) {
			return nil, false, nil
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), moveResolveWait)
	defer cancel()
	info, err = c.stat(sctx, &poolv1.StatRequest{Id: s.ID(), Settled: true})
	if err != nil {
		return nil, false, fmt.Errorf("move segment %d to the rdma tier: %w; and its daemon could not say whether it moved (%w): the segment is closed here, so that no write goes to memory it may have left; open it again (Client.Open)", s.ID(), moveErr, err)
	}
	return info, info.Tier == poolv1.Tier_TIER_RDMA, nil
}

// promote moves an rdma segment into this host's memory on a load/store
// tier: calls go on at the old home while the daemon copies the bytes
// (and wait for the moment of the switch-over, as for any move); then this
// client maps the segment, and calls wait while it switches over to the
// mapping. The daemon refuses (ErrInUse) while other clients may reach
// the segment.
func (c *Client) promote(ctx context.Context, s *Segment, o moveOptions) error {
	if c.network != "unix" {
		return fmt.Errorf("move segment %d to the %s tier: %w: this client is connected over TCP and could not map it there; move it from a client of the local poold's unix socket", s.ID(), o.tier, ErrNotSupported)
	}
	ch, err := s.beginSwitch()
	if err != nil {
		return err
	}
	resp, err := c.moveCall(ctx, s, o)
	if err != nil {
		s.endSwitch(ch, nil, nil)
		return err
	}
	be, mem, err := c.mapMoved(ctx, resp.Segment)
	if err != nil {
		s.endSwitch(ch, nil, nil)
		return fmt.Errorf("segment %d moved to the %s tier, and mapping it failed: %w; its calls fail with ErrNotSupported until it is opened again (Client.Open)", s.ID(), o.tier, err)
	}
	if !s.hold() { // closed meanwhile
		mmap.Unmap(mem)
		c.release(ctx, s.ID())
		s.endSwitch(ch, nil, nil)
		return s.errClosed()
	}
	old := s.endSwitch(ch, withEmulation(be, c.injected(resp.Segment.Tier, resp.Segment.Injected)), resp.Segment)
	return old.retire(ctx)
}

// mapMoved maps the segment info describes, a load/store one.
func (c *Client) mapMoved(ctx context.Context, info *poolv1.Segment) (backend, []byte, error) {
	_, sid, err := c.callCtx(ctx)
	if err != nil {
		return nil, nil, err
	}
	resp, err := c.getFD(ctx, sid, info.Id)
	if err != nil {
		return nil, nil, err
	}
	defer resp.File.Close()
	return mapSegment(info, resp.File, resp.Offset, resp.Length, false)
}

// moveCall asks the daemon to move s as o says.
func (c *Client) moveCall(ctx context.Context, s *Segment, o moveOptions) (*poolv1.MoveResponse, error) {
	cctx, _, err := c.callCtx(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := c.api.Move(cctx, &poolv1.MoveRequest{Id: s.ID(), ToNode: o.node, ToTier: o.tier.proto()})
	return resp, errs.FromStatus(err)
}

// otherMapping reports whether another open Segment of this client maps
// the segment s maps.
func (c *Client) otherMapping(s *Segment) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for o := range c.segs {
		if o != s && o.info.Id == s.info.Id && o.mappedBase() != nil {
			return true
		}
	}
	return false
}

// release tells the daemon that this client no longer maps segment id
// (best effort: a daemon that does not hear it counts the client as a
// mapper until its lease ends).
func (c *Client) release(ctx context.Context, id uint64) {
	if c.network != "unix" {
		return
	}
	if _, sid, err := c.callCtx(ctx); err == nil {
		c.fdCall(ctx, fdpass.Request{Op: fdpass.OpRelease, Session: sid, Segment: id})
	}
}

// releaseAll tells the daemon, on the descriptor channel fd of a client
// that is closing, that it no longer maps the load/store segments of segs
// (retired already); best effort, within the client's WithTimeout.
func (c *Client) releaseAll(fd *fdpass.Conn, segs map[*Segment]struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	for s := range segs {
		if s.mappedBase() == nil {
			continue
		}
		_, sid, err := c.sess.Call(ctx)
		if err != nil {
			return
		}
		if _, err := fd.Do(fdpass.Request{Op: fdpass.OpRelease, Session: sid, Segment: s.info.Id}, deadline); err != nil {
			return
		}
	}
}
