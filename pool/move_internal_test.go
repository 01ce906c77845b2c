package pool

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// TestMoveOutSource: the source's side of a move, on a real data plane. A
// segment peer daemon x placed here for its client app is tracked, its
// changed chunks reported and cleared, sealed (the record says so; writes
// and the app's reads answer MOVED, x's own reads go on), sealed again by
// a restarted daemon, unsealed by ABORT, and withdrawn and freed by COMMIT
// (MOVED for its key, its memory free again). Refused with typed errors:
// another caller, an unknown segment, a bad chunk, an unknown phase.
func TestMoveOutSource(t *testing.T) {
	p, _ := newServingPool(t)
	cfg := p.cfg
	ctx := t.Context()
	x, y := peerCaller(t, p, "x", 1), peerCaller(t, p, "y", 2)
	const n = 256 << 10
	r, err := p.Alloc(ctx, x, allocRequest{Size: n, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true, ForClient: "app"})
	require.NoError(t, err)
	rdmaFree := func(p *core) int64 {
		for _, ti := range p.tiers() {
			if ti.Tier == poolv1.Tier_TIER_RDMA {
				return ti.Free
			}
		}
		return -1
	}
	free := rdmaFree(p)
	step := func(c caller, phase poolv1.MoveOutPhase, chunk int64) (*poolv1.MoveOutResponse, error) {
		return p.moveOut(ctx, c, &poolv1.MoveOutRequest{HomeId: r.ID, Phase: phase, Chunk: chunk}, moveTLS{})
	}
	dial := func(p *core, client string) *tcp.Client {
		c, err := tcp.Dial(ctx, p.dp.addr, tcp.WithCredential(p.auth.issue("s-"+client, client, client)))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	mover, app := dial(p, "poold/x"), dial(p, delegatedPrincipal("poold/x", "app"))
	reg := region(t, r)

	_, err = step(y, poolv1.MoveOutPhase_MOVE_OUT_TRACK, 4096)
	require.ErrorIs(t, err, errs.ErrAccessDenied, "another peer's step")
	_, err = p.moveOut(ctx, x, &poolv1.MoveOutRequest{HomeId: r.ID + 100, Phase: poolv1.MoveOutPhase_MOVE_OUT_TRACK, Chunk: 4096}, moveTLS{})
	require.ErrorIs(t, err, errs.ErrNotFound)
	_, err = step(x, poolv1.MoveOutPhase_MOVE_OUT_TRACK, 5000)
	require.ErrorIs(t, err, errs.ErrInvalid, "a chunk that is no power of two")
	_, err = step(x, poolv1.MoveOutPhase(99), 0)
	require.ErrorIs(t, err, errs.ErrInvalid, "an unknown phase")

	_, err = step(x, poolv1.MoveOutPhase_MOVE_OUT_TRACK, 64<<10)
	require.NoError(t, err)
	require.NoError(t, app.Write(ctx, reg, 3*64<<10+5, []byte("changed")))
	d, err := step(x, poolv1.MoveOutPhase_MOVE_OUT_DIRTY, 0)
	require.NoError(t, err)
	require.Equal(t, uint32(1), d.DirtyChunks)
	require.Equal(t, []byte{1 << 3}, d.Dirty, "chunk 3 changed")
	d, err = step(x, poolv1.MoveOutPhase_MOVE_OUT_DIRTY, 0)
	require.NoError(t, err)
	require.Zero(t, d.DirtyChunks, "reported chunks are cleared")

	sealed := func(p *core, c *tcp.Client, mover *tcp.Client) {
		t.Helper()
		require.ErrorIs(t, c.Write(ctx, reg, 0, []byte{1}), rdma.ErrMoved)
		_, err := c.FetchAdd64(ctx, reg, 8, 1)
		require.ErrorIs(t, err, rdma.ErrMoved)
		require.ErrorIs(t, c.Read(ctx, reg, 0, make([]byte, 8)), rdma.ErrMoved, "the app's reads wait for the new home")
		got := make([]byte, 7)
		require.NoError(t, mover.Read(ctx, reg, 3*64<<10+5, got), "the mover reads on")
		require.Equal(t, "changed", string(got))
		rec, err := p.Stat(r.ID)
		require.NoError(t, err)
		require.True(t, rec.Sealed)
	}
	_, err = step(x, poolv1.MoveOutPhase_MOVE_OUT_SEAL, 0)
	require.NoError(t, err)
	sealed(p, app, mover)

	// A restart keeps the seal: the record says so.
	require.NoError(t, p.close())
	p, _ = servingPool(t, cfg)
	x = peerCaller(t, p, "x", 1)
	mover, app = dial(p, "poold/x"), dial(p, delegatedPrincipal("poold/x", "app"))
	sealed(p, app, mover)

	_, err = step(x, poolv1.MoveOutPhase_MOVE_OUT_ABORT, 0)
	require.NoError(t, err)
	require.NoError(t, app.Write(ctx, reg, 0, []byte{1}), "unsealed")
	rec, err := p.Stat(r.ID)
	require.NoError(t, err)
	require.False(t, rec.Sealed)

	// ABORT ended the tracking: a SEAL without a TRACK is refused (the
	// move that sent it lost its changes); with one it goes through.
	_, err = step(x, poolv1.MoveOutPhase_MOVE_OUT_SEAL, 0)
	require.Error(t, err)
	require.NoError(t, app.Write(ctx, reg, 0, []byte{2}), "a failed SEAL leaves the segment unsealed")
	_, err = step(x, poolv1.MoveOutPhase_MOVE_OUT_TRACK, 4096)
	require.NoError(t, err)
	_, err = step(x, poolv1.MoveOutPhase_MOVE_OUT_SEAL, 0)
	require.NoError(t, err)
	_, err = step(x, poolv1.MoveOutPhase_MOVE_OUT_COMMIT, 0)
	require.NoError(t, err)
	for _, c := range []*tcp.Client{app, mover} {
		require.ErrorIs(t, c.Write(ctx, reg, 0, []byte{1}), rdma.ErrMoved)
		require.ErrorIs(t, c.Read(ctx, reg, 0, make([]byte, 1)), rdma.ErrMoved)
	}
	_, err = p.Stat(r.ID)
	require.ErrorIs(t, err, errs.ErrNotFound, "the record is gone")
	require.Equal(t, free+r.Extent, rdmaFree(p), "the memory is free again")
	_, err = step(x, poolv1.MoveOutPhase_MOVE_OUT_COMMIT, 0)
	require.ErrorIs(t, err, errs.ErrNotFound, "a COMMIT again finds nothing")
}

// TestMoveOutPush: the source writes the segment to the target's copy
// itself. A segment peer daemon x placed here is pushed to another
// segment of x's (the target's copy, on this same data plane, written
// with x's credential): a byte range first (the chunks that hold it, and
// nothing else), then whole, then only the chunk written since, then, at
// the seal, the chunk written last: the copy holds the same bytes each
// time, and the seal's answer says how long writes were refused. STATUS
// says whether the segment is sealed, its last chunks pushed to the
// target named (and no other) and its writes tracked. Refused: a push
// before TRACK, one without a target, one of a range outside the
// segment, one with a wrong key (the target refuses it), a STATUS without
// one. ABORT closes the connection to the target, unseals and forgets the
// push.
func TestMoveOutPush(t *testing.T) {
	m := newMoveOutSource(t)
	p, x, cred, ctx := m.p, m.x, m.cred, t.Context()
	const n = 256 << 10
	src, dst := m.alloc(n), m.alloc(n)
	mover := m.conn()
	target := m.home(dst)
	step := func(req *poolv1.MoveOutRequest) (*poolv1.MoveOutResponse, error) {
		req.HomeId = src.ID
		return p.moveOut(ctx, x, req, moveTLS{})
	}
	same := func() {
		t.Helper()
		a, b := make([]byte, n), make([]byte, n)
		require.NoError(t, mover.Read(ctx, region(t, src), 0, a))
		require.NoError(t, mover.Read(ctx, region(t, dst), 0, b))
		require.Equal(t, a, b, "the target's copy holds the source's bytes")
	}
	pattern := make([]byte, n)
	for i := range pattern {
		pattern[i] = byte(i * 7)
	}
	require.NoError(t, mover.Write(ctx, region(t, src), 0, pattern))

	_, err := step(&poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_PUSH, Target: target, All: true})
	require.ErrorIs(t, err, rdma.ErrNotTracked, "a push before TRACK: no changes are recorded")
	require.Equal(t, codes.NotFound, status.Code(errs.ToStatus(err)), "the refusal's gRPC code")
	_, err = step(&poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_TRACK, Chunk: 4096})
	require.NoError(t, err)
	_, err = step(&poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_PUSH, All: true})
	require.ErrorIs(t, err, errs.ErrInvalid, "a push without a target")

	for _, bad := range [][2]int64{{-1, 0}, {0, -1}, {n + 1, 0}} {
		_, err = step(&poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_PUSH, Target: target, All: true, Offset: bad[0], Length: bad[1]})
		require.ErrorIs(t, err, errs.ErrInvalid, "a push of %d bytes from %d", bad[1], bad[0])
	}
	resp, err := step(&poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_PUSH, Target: target, All: true, Offset: 6*4096 + 10, Length: 5000})
	require.NoError(t, err)
	require.EqualValues(t, 2, resp.DirtyChunks, "the chunks that hold a byte of the range")
	require.EqualValues(t, 2*4096, resp.PushedBytes)
	got := make([]byte, n)
	require.NoError(t, mover.Read(ctx, region(t, dst), 0, got))
	want := make([]byte, n)
	copy(want[6*4096:8*4096], pattern[6*4096:]) // up to the end of the bitmap's first byte
	require.Equal(t, want, got, "the target's copy holds those chunks and nothing else")

	resp, err = step(&poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_PUSH, Target: target, All: true})
	require.NoError(t, err)
	require.EqualValues(t, n, resp.PushedBytes)
	require.EqualValues(t, n/4096, resp.DirtyChunks)
	same()

	require.NoError(t, mover.Write(ctx, region(t, src), 3*4096+5, []byte("changed")))
	resp, err = step(&poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_PUSH, Target: target})
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.DirtyChunks)
	require.EqualValues(t, 4096, resp.PushedBytes)
	same()

	status := func(target *poolv1.SegmentHome) (sealed, pushed, tracked bool) {
		t.Helper()
		resp, err := step(&poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_STATUS, Target: target})
		require.NoError(t, err)
		return resp.Sealed, resp.Pushed, resp.Tracked
	}
	sealed, pushed, tracked := status(target)
	require.Equal(t, []bool{false, false, true}, []bool{sealed, pushed, tracked}, "pushing, not sealed")
	_, err = step(&poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_STATUS})
	require.ErrorIs(t, err, errs.ErrInvalid, "STATUS names no target")

	require.NoError(t, mover.Write(ctx, region(t, src), n-3, []byte("end")))
	resp, err = step(&poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_SEAL, Target: target})
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.DirtyChunks)
	require.EqualValues(t, 4096, resp.PushedBytes)
	require.GreaterOrEqual(t, resp.SealedUs, int64(0))
	require.ErrorIs(t, mover.Write(ctx, region(t, src), 0, []byte{1}), rdma.ErrMoved, "sealed")
	same()
	sealed, pushed, tracked = status(target)
	require.Equal(t, []bool{true, true, true}, []bool{sealed, pushed, tracked}, "sealed, the last chunks pushed to the target")
	_, pushed, _ = status(&poolv1.SegmentHome{Node: "elsewhere", HomeId: dst.ID})
	require.False(t, pushed, "pushed to another target")

	// The same copy under another key (and node name, so it is dialed
	// again): the target refuses the writes.
	bad := &poolv1.SegmentHome{Node: "elsewhere", HomeId: dst.ID, DataAddr: p.dp.addr, Key: make([]byte, len(dst.Key)), Epoch: dst.Epoch, DataCredential: cred}
	_, err = step(&poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_PUSH, Target: bad, All: true})
	require.ErrorIs(t, err, errMoveHome, "the target refuses a wrong key")

	_, err = step(&poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_ABORT})
	require.NoError(t, err)
	p.pushing.mu.Lock()
	require.Empty(t, p.pushing.m, "ABORT closed the connection to the target")
	p.pushing.mu.Unlock()
	sealed, pushed, tracked = status(target)
	require.Equal(t, []bool{false, false, false}, []bool{sealed, pushed, tracked}, "undone: unsealed, the push forgotten, not tracked")
}

// TestMoveIntents: a move intent survives the store as written; the
// switch-over commits the record that names the target and marks the
// intent switched in one transaction; a daemon that starts with intents
// left takes them up, switched when its record names the target, and
// reconcile keeps the copies they still need.
func TestMoveIntents(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	r := &record{ID: 7, Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: 4096, Owner: "app", Epoch: 1,
		Key: rdma.Key{1}, Home: "b", HomeID: 70, DataAddr: "127.0.0.1:1"}
	require.NoError(t, p.st.put(r))
	r2 := *r
	r2.ID, r2.HomeID = 8, 80
	require.NoError(t, p.st.put(&r2))
	in7 := intent{ID: 7, From: "b", FromID: 70, To: "c", ToID: 700}
	in8 := intent{ID: 8, From: "b", FromID: 80, To: "c", ToID: 800, FromAddr: "127.0.0.1:1", FromKey: rdma.Key{1}, FromEpoch: 1, FromTLS: true}
	require.NoError(t, p.st.putIntent(in7))
	require.NoError(t, p.st.putIntent(in8))
	next := *r
	next.Home, next.HomeID, next.Key = "c", 700, rdma.Key{2}
	require.NoError(t, p.st.switchMove(&next, in7)())
	ins, err := p.st.intents()
	require.NoError(t, err)
	in7.Switched = true
	require.Equal(t, []intent{in7, in8}, ins)
	require.NoError(t, p.close())

	p = newTestPool(t, cfg)
	defer p.close()
	in7.Switched, in8.Switched = true, false
	require.Equal(t, []intent{in7, in8}, p.leftMoves, "the intents, switched as the records say")
	rec, err := p.Stat(7)
	require.NoError(t, err)
	require.Equal(t, "c", rec.Home)
	known := map[uint64]bool{}
	p.moving.held("b", known)
	require.Equal(t, map[uint64]bool{70: true}, known, "the switched move's source until it COMMITs")
	known = map[uint64]bool{}
	p.moving.held("c", known)
	require.Equal(t, map[uint64]bool{800: true}, known, "the other's copy until it is undone")
	require.False(t, p.moving.begin(8), "a segment with a move left does not move again")
	require.True(t, p.moving.involves("c"), "reconcile asks c even when no record names it")
	require.False(t, p.moving.involves("d"))

	require.NoError(t, p.st.deleteIntent(7))
	ins, err = p.st.intents()
	require.NoError(t, err)
	require.Equal(t, []intent{in8}, ins)
}

// FuzzDecodeIntent: a stored move intent either decodes to one that
// encodes and decodes back to itself, or fails with an error matching
// ErrInvalid (corrupt) or ErrNotSupported (a newer form); never a panic.
func FuzzDecodeIntent(f *testing.F) {
	for _, in := range []intent{{ID: 1, From: "b", FromID: 2, To: "c", ToID: 3}, {ID: 1 << 60, From: "node-b", FromID: 1<<64 - 1, To: "c", Switched: true},
		{ID: 4, From: "b", FromID: 5, To: "c", ToID: 6, ToAddr: "10.0.0.3:7960", ToKey: rdma.Key{7, 8}, ToEpoch: 2, ToTLS: true},
		{ID: 9, From: "b", FromID: 5, To: "c", ToID: 6, Switched: true, ToAddr: "10.0.0.3:7960", ToKey: rdma.Key{7}, ToEpoch: 2,
			FromAddr: "10.0.0.2:7960", FromKey: rdma.Key{9}, FromEpoch: 1, FromTLS: true}} {
		f.Add(encodeIntent(in))
	}
	// Version 1 (no target's copy), version 2 (no leaving home's copy).
	f.Add([]byte{1, 1, 0, 1, 'b', 2, 1, 'c', 3})
	f.Add(append(append([]byte{2, 1, 0, 1, 'b', 2, 1, 'c', 3, 0}, make([]byte, 16)...), 0, 0))
	f.Add([]byte{})
	f.Add([]byte{2, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := decodeIntent(b)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) && !errors.Is(err, errs.ErrNotSupported) {
				t.Fatalf("decodeIntent(%x): %v matches neither ErrInvalid nor ErrNotSupported", b, err)
			}
			return
		}
		back, err := decodeIntent(encodeIntent(in))
		if err != nil || back != in {
			t.Fatalf("decodeIntent(%x) = %+v, which encodes to one decoding to %+v, %v", b, in, back, err)
		}
	})
}

// TestMoveSubject: who may move which segment. By id or name: its owner,
// an attacher, an administrator, not another client; by its home and id
// there: that home's daemon only. Segments that cannot move live are
// refused with typed errors, and a segment moves once at a time.
func TestMoveSubject(t *testing.T) {
	p := newTestPool(t, testConfig(t))
	defer p.close()
	peerRec := func(id uint64, home string, homeID uint64) *record {
		r := &record{ID: id, Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: 4096, Owner: "app", Epoch: 1,
			Key: rdma.Key{byte(id)}, Home: home, HomeID: homeID, Attached: []string{"reader"}}
		p.mu.Lock()
		p.link(r)
		p.mu.Unlock()
		return r
	}
	r := peerRec(5, "b", 50)
	lost := peerRec(6, "b", 60)
	lost.Lost = true
	cxl, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Persist: true})
	require.NoError(t, err)
	as := func(id string) caller { return caller{client: &client{id: id}, ident: "cn:" + id} }

	for _, tc := range []struct {
		name string
		c    caller
		req  *poolv1.MoveRequest
		want error
	}{
		{"owner", as("app"), &poolv1.MoveRequest{Id: 5}, nil},
		{"attacher", as("reader"), &poolv1.MoveRequest{Id: 5}, nil},
		{"administrator", admin(), &poolv1.MoveRequest{Id: 5}, nil},
		{"its home", as("poold/b"), &poolv1.MoveRequest{Home: "b", HomeId: 50}, nil},
		{"another client", as("other"), &poolv1.MoveRequest{Id: 5}, errs.ErrAccessDenied},
		{"another home", as("poold/c"), &poolv1.MoveRequest{Home: "b", HomeId: 50}, errs.ErrAccessDenied},
		{"its home, to a node it names", as("poold/b"), &poolv1.MoveRequest{Home: "b", HomeId: 50, ToNode: "c"}, errs.ErrAccessDenied},
		{"its home, to this host's cxl tier", as("poold/b"), &poolv1.MoveRequest{Home: "b", HomeId: 50, ToTier: poolv1.Tier_TIER_CXL}, errs.ErrAccessDenied},
		{"an administrator by home id", admin(), &poolv1.MoveRequest{Home: "b", HomeId: 50}, errs.ErrAccessDenied},
		{"unknown at its home", as("poold/b"), &poolv1.MoveRequest{Home: "b", HomeId: 51}, errs.ErrNotFound},
		{"unknown", admin(), &poolv1.MoveRequest{Id: 99}, errs.ErrNotFound},
		{"nothing named", admin(), &poolv1.MoveRequest{}, errs.ErrInvalid},
		{"to the cxl tier", admin(), &poolv1.MoveRequest{Id: 5, ToTier: poolv1.Tier_TIER_CXL}, nil},
		{"to an unknown tier", admin(), &poolv1.MoveRequest{Id: 5, ToTier: 9}, errs.ErrInvalid},
		{"a cxl segment", admin(), &poolv1.MoveRequest{Id: cxl.ID}, errs.ErrInvalid},
		{"a cxl segment to the local tier", admin(), &poolv1.MoveRequest{Id: cxl.ID, ToTier: poolv1.Tier_TIER_LOCAL}, errs.ErrNotSupported},
		{"a lost segment", admin(), &poolv1.MoveRequest{Id: 6}, errs.ErrSegmentLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.moveSubject(tc.c, tc.req)
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
				return
			}
			require.NoError(t, err)
			require.Equal(t, *r, got)
			_, err = p.moveSubject(tc.c, tc.req)
			require.ErrorIs(t, err, errs.ErrLimit, "a second move while one is under way")
			p.moving.end(r.ID)
		})
	}
}

// TestAwaitSwitch: a Stat of a segment whose switch-over is under way
// waits for its announcement and is answered the record announced; one
// undone, or none under way, leaves Stat to the table. A Free waits for
// the switch-over's end (switchDone), which comes after its announcement.
func TestAwaitSwitch(t *testing.T) {
	var ms moves
	_, ok := ms.awaitSwitch(t.Context(), 7)
	require.False(t, ok, "no switch-over under way")
	require.Nil(t, ms.switchDone(7))

	// The switch-over is announced (or undone) a little after the Stat
	// began to wait, and ends when the test says.
	endSoon := func(announced *record) (end func()) {
		sw := ms.sealing(7)
		go func() {
			time.Sleep(20 * time.Millisecond)
			if announced == nil {
				sw.end()
				return
			}
			sw.announce(announced)
		}()
		return sw.end
	}
	end := endSoon(&record{ID: 7, Home: "c"})
	r, ok := ms.awaitSwitch(t.Context(), 7)
	require.True(t, ok)
	require.Equal(t, "c", r.Home)
	done := ms.switchDone(7)
	require.NotNil(t, done, "announced, not committed yet")
	select {
	case <-done:
		t.Fatal("the switch-over ended before its end")
	default:
	}
	end()
	<-done
	_, ok = ms.awaitSwitch(t.Context(), 7)
	require.False(t, ok, "ended")

	endSoon(nil)
	_, ok = ms.awaitSwitch(t.Context(), 7)
	require.False(t, ok, "an undone switch-over answers nothing")
	require.Nil(t, ms.switchDone(7), "undone is ended")
}

// TestAwaitIdle: a settled Stat's wait (awaitIdle) for a segment that is
// not moving returns at once; for one that is, it returns when that move
// ends, woken by its end: in a synctest bubble, whose clock moves only
// when every goroutine waits, no time has passed (a poll would have
// needed the clock to move). The end of another segment's move does not
// wake it. A wait whose ctx ends first returns ErrUnavailable at the
// deadline, the move still under way, which can end later.
func TestAwaitIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ms moves
		require.NoError(t, ms.awaitIdle(t.Context(), 7), "no move under way")

		require.True(t, ms.begin(7))
		require.True(t, ms.begin(8))
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- ms.awaitIdle(t.Context(), 7) }()
		synctest.Wait()
		ms.end(8)
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("the wait for segment 7 returned while it moves: %v", err)
		default:
		}
		ms.end(7)
		require.NoError(t, <-done)
		require.Zero(t, time.Since(start), "woken by the move's end, not by a clock")

		const deadline = time.Second
		require.True(t, ms.begin(9))
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		defer cancel()
		start = time.Now()
		err := ms.awaitIdle(ctx, 9)
		require.ErrorIs(t, err, errs.ErrUnavailable)
		require.ErrorContains(t, err, "segment 9 is still moving")
		require.Equal(t, deadline, time.Since(start), "returned at the deadline")
		require.True(t, ms.has(9), "the move is still under way")
		ms.end(9)
		require.NoError(t, ms.awaitIdle(t.Context(), 9), "ended")
	})
}

// TestSwitchOverCommit: the table names the target at the switch-over,
// and the commit follows outside p.mu: switch-overs that commit at once
// share one transaction (one fsync), and a change to the record made
// after the switch-over (a delegate added) commits after it, naming the
// target: the table and the store agree.
func TestSwitchOverCommit(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	const n = 4
	movers := make([]*mover, n)
	for i := range movers {
		id := uint64(7 + i)
		r := &record{ID: id, Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: 4096, Owner: "app", Epoch: 1,
			Key: rdma.Key{1}, Home: "b", HomeID: 10 * id, DataAddr: "127.0.0.1:1"}
		require.NoError(t, p.st.put(r))
		p.mu.Lock()
		p.link(r)
		p.mu.Unlock()
		m := &mover{p: p, rec: *r, to: "c", in: intent{ID: id, From: "b", FromID: 10 * id, To: "c", ToID: 100 * id,
			ToAddr: "127.0.0.1:2", ToKey: rdma.Key{2}, ToEpoch: 1}}
		require.NoError(t, p.st.putIntent(m.in))
		movers[i] = m
	}
	// A commit held open: what is submitted meanwhile forms the next group.
	release := holdCommit(p.st.storeFile)
	before := p.st.commits.Load()
	results := make(chan error, n+1)
	for i, m := range movers {
		next, err := m.switchOver()
		require.NoError(t, err)
		require.Equal(t, "c", next.Home)
		rec, err := p.Stat(m.rec.ID)
		require.NoError(t, err)
		require.Equal(t, m.in.ToID, rec.HomeID, "the table names the target before the commit")
		go func() { results <- p.commitSwitch(m.in) }()
		require.Eventually(t, queued(p.st.storeFile, i+1), 10*time.Second, time.Millisecond, "switch-over %d queued its commit", i)
	}
	go func() {
		results <- p.authorize(caller{client: &client{id: "app"}, ident: "cn:app"}, 7, "helper", false)
	}()
	require.Eventually(t, queued(p.st.storeFile, n+1), 10*time.Second, time.Millisecond, "the delegate queued behind the switch-overs")
	require.NoError(t, release())
	for range n + 1 {
		require.NoError(t, <-results)
	}
	// The held commit, then one group: the four switch-overs and the
	// delegate.
	require.EqualValues(t, 2, p.st.commits.Load()-before)

	check := func(p *core) {
		for _, m := range movers {
			rec, err := p.Stat(m.rec.ID)
			require.NoError(t, err)
			require.Equal(t, "c", rec.Home)
			require.Equal(t, m.in.ToID, rec.HomeID)
			require.Equal(t, rdma.Key{2}, rec.Key)
		}
		rec, err := p.Stat(7)
		require.NoError(t, err)
		require.Equal(t, []string{"helper"}, rec.Delegates, "the delegate added after the switch-over")
	}
	check(p)
	require.NoError(t, p.close())
	p = newTestPool(t, cfg)
	defer p.close()
	check(p)
	require.Len(t, p.leftMoves, n)
	for _, in := range p.leftMoves {
		require.True(t, in.Switched, "intent %d", in.ID)
	}
}

// peerCaller opens a session of peer daemon node ("poold/"+node, as
// process pid) on p and returns its caller.
func peerCaller(t *testing.T, p *core, node string, pid int64) caller {
	t.Helper()
	p.openSession("s-"+node, "poold/"+node, "", "poold "+node, pid, 0)
	c, err := p.callerFor("s-" + node)
	require.NoError(t, err)
	return c
}

// moveOutSource is the setup the MoveOut tests share: a serving pool p,
// the peer x that moves its segments, and the data-plane credential its
// moves push with.
type moveOutSource struct {
	t    *testing.T
	p    *core
	x    caller
	cred []byte
}

func newMoveOutSource(t *testing.T) *moveOutSource {
	p, _ := newServingPool(t)
	return &moveOutSource{t: t, p: p, x: peerCaller(t, p, "x", 1), cred: p.auth.issue("s-x2", "poold/x", "poold x")}
}

// alloc places an rdma segment of n bytes on p for x's client "app".
func (m *moveOutSource) alloc(n int64) *record {
	r, err := m.p.Alloc(m.t.Context(), m.x, allocRequest{Size: n, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true, ForClient: "app"})
	require.NoError(m.t, err)
	return r
}

// home names r as a move's target, reached with the moves' credential.
func (m *moveOutSource) home(r *record) *poolv1.SegmentHome {
	return &poolv1.SegmentHome{Node: m.p.cfg.Node, HomeId: r.ID, DataAddr: m.p.dp.addr, Key: r.Key[:], Epoch: r.Epoch, DataCredential: m.cred}
}

// conn is a data-plane connection to p with the moves' credential, closed
// when the test ends.
func (m *moveOutSource) conn() *tcp.Client {
	c, err := tcp.Dial(m.t.Context(), m.p.dp.addr, tcp.WithCredential(m.cred))
	require.NoError(m.t, err)
	m.t.Cleanup(func() { c.Close() })
	return c
}

// holdCommit holds a commit of f open until release is called (which
// returns its outcome): what is submitted meanwhile waits for it.
func holdCommit(f *storeFile) (release func() error) {
	entered, let := make(chan struct{}), make(chan struct{})
	blocked := make(chan error, 1)
	go func() {
		blocked <- f.update(func(*bolt.Tx) error {
			close(entered)
			<-let
			return nil
		}, false)
	}()
	<-entered
	return func() error {
		close(let)
		return <-blocked
	}
}

// queued reports whether k changes wait in f's queue.
func queued(f *storeFile, k int) func() bool {
	return func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.queue) == k
	}
}

// TestPushNotesGo: a source's push notes last no longer than the seal
// they belong to. Each segment is pushed to a target and sealed, which
// notes the push; then a COMMIT (in one commit of the store, the record's
// removal), an ABORT that names no target (one that names the target
// the SEAL handed over to is refused, errHandedOver), a plain Free: the
// meta bucket holds no note of the segment. A restart keeps the note of a segment still sealed (an
// origin restarted later asks for it) and removes a note a daemon left
// behind for a segment that is not.
func TestPushNotesGo(t *testing.T) {
	p, _ := newServingPool(t)
	cfg := p.cfg
	ctx := t.Context()
	x := peerCaller(t, p, "x", 1)
	alloc := func() *record {
		r, err := p.Alloc(ctx, x, allocRequest{Size: 64 << 10, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true, ForClient: "app"})
		require.NoError(t, err)
		return r
	}
	dst := alloc()
	cred := p.auth.issue("s-x2", "poold/x", "poold x")
	target := &poolv1.SegmentHome{Node: p.cfg.Node, HomeId: dst.ID, DataAddr: p.dp.addr, Key: dst.Key[:], Epoch: dst.Epoch, DataCredential: cred}
	step := func(src *record, phase poolv1.MoveOutPhase) {
		t.Helper()
		_, err := p.moveOut(ctx, x, &poolv1.MoveOutRequest{HomeId: src.ID, Phase: phase, Chunk: 4096, Target: target}, moveTLS{})
		require.NoError(t, err)
	}
	notes := func(p *core) map[uint64]bool {
		t.Helper()
		out := map[uint64]bool{}
		for _, f := range p.st.files() {
			require.NoError(t, f.db.View(func(tx *bolt.Tx) error {
				c := tx.Bucket(bucketMeta).Cursor()
				for k, _ := c.Seek(pushedPrefix); bytes.HasPrefix(k, pushedPrefix); k, _ = c.Next() {
					out[binary.BigEndian.Uint64(k[len(pushedPrefix):])] = true
				}
				return nil
			}))
		}
		return out
	}
	sealed := func() *record {
		t.Helper()
		r := alloc()
		step(r, poolv1.MoveOutPhase_MOVE_OUT_TRACK)
		step(r, poolv1.MoveOutPhase_MOVE_OUT_SEAL)
		require.True(t, notes(p)[r.ID], "the SEAL noted its push")
		return r
	}

	committed := sealed()
	f := p.st.fileFor(committed)
	before := f.commits.Load()
	step(committed, poolv1.MoveOutPhase_MOVE_OUT_COMMIT)
	require.Equal(t, before+1, f.commits.Load(), "the COMMIT is one commit of the store")
	require.False(t, notes(p)[committed.ID], "the COMMIT removed the note")

	aborted := sealed()
	_, err := p.moveOut(ctx, x, &poolv1.MoveOutRequest{HomeId: aborted.ID, Phase: poolv1.MoveOutPhase_MOVE_OUT_ABORT, Target: target}, moveTLS{})
	require.ErrorIs(t, err, errHandedOver, "an ABORT naming the target the SEAL handed over to is refused")
	require.True(t, notes(p)[aborted.ID], "the refused ABORT kept the note")
	_, err = p.moveOut(ctx, x, &poolv1.MoveOutRequest{HomeId: aborted.ID, Phase: poolv1.MoveOutPhase_MOVE_OUT_ABORT}, moveTLS{})
	require.NoError(t, err, "an ABORT naming no target (a rebuild's) unseals")
	require.False(t, notes(p)[aborted.ID], "the ABORT removed the note")

	freed := sealed()
	require.NoError(t, p.Free(x, freed.ID, ""))
	require.False(t, notes(p)[freed.ID], "the Free removed the note")

	kept := sealed()
	left := alloc() // a note left behind by a daemon that did not remove it
	require.NoError(t, p.st.putPushed(left, target))
	require.NoError(t, p.close())
	p, _ = servingPool(t, cfg)
	require.Equal(t, map[uint64]bool{kept.ID: true}, notes(p), "a restart keeps the sealed segment's note alone")
}

// TestMoveOutAborted: a source remembers the moves whose ABORT named
// their target and refuses a later PUSH or SEAL of one (errMoveAborted),
// also once a later move's TRACK tracks the segment again: the segment
// stays unsealed and tracked, with no push note; a SEAL to another copy
// (a later move's) is not refused. A handover checks again, under
// p.handing, for an ABORT that ran after moveOut's check.
func TestMoveOutAborted(t *testing.T) {
	m := newMoveOutSource(t)
	p, x, ctx := m.p, m.x, t.Context()
	src, first, second := m.alloc(64<<10), m.home(m.alloc(64<<10)), m.home(m.alloc(64<<10))
	step := func(phase poolv1.MoveOutPhase, target *poolv1.SegmentHome) error {
		_, err := p.moveOut(ctx, x, &poolv1.MoveOutRequest{HomeId: src.ID, Phase: phase, Chunk: 4096, Target: target}, moveTLS{})
		return err
	}
	unsealed := func(why string) {
		t.Helper()
		p.mu.Lock()
		sealed := p.segs[src.ID].Sealed
		p.mu.Unlock()
		require.False(t, sealed, why)
		_, _, ok, err := p.st.pushed(src)
		require.NoError(t, err)
		require.False(t, ok, "no push note: %s", why)
	}

	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_TRACK, nil))
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_PUSH, first))
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_ABORT, first))
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_TRACK, nil), "a later move's TRACK")
	require.ErrorIs(t, step(poolv1.MoveOutPhase_MOVE_OUT_SEAL, first), errMoveAborted, "a late SEAL of the aborted move")
	unsealed("the refused SEAL")
	require.ErrorIs(t, step(poolv1.MoveOutPhase_MOVE_OUT_PUSH, first), errMoveAborted, "a late PUSH of the aborted move")
	_, err := p.dp.srv.Chunk(src.ID)
	require.NoError(t, err, "the later move's tracking is left as it was")

	// An ABORT that runs after moveOut's check of a SEAL and before its
	// handover.
	p.mu.Lock()
	r := p.segs[src.ID]
	p.mu.Unlock()
	require.NoError(t, p.setSealed(r, true))
	late := &poolv1.MoveOutRequest{HomeId: src.ID, Phase: poolv1.MoveOutPhase_MOVE_OUT_SEAL, Target: second}
	mv, _ := moveOf(src.ID, late)
	p.aborted.add(mv, time.Now())
	require.ErrorIs(t, p.handOver(ctx, r, *r, late), errMoveAborted)
	require.NoError(t, p.setSealed(r, false))
	unsealed("the refused handover")

	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_SEAL, m.home(m.alloc(64<<10))), "a SEAL to another copy")
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_ABORT, nil))
}

// TestMoveOutAbortedFill: a fill of a redundant segment's new home (a
// rebuild's, a home move's) names itself on its steps (MoveOutRequest's
// fill): its ABORT is remembered without a target, and a late TRACK,
// DIRTY, PUSH or SEAL of it is refused, also once a later fill of the
// same target tracks the segment again, whose steps go on. A fill's
// ABORT unseals even after its SEAL noted a push to the target.
func TestMoveOutAbortedFill(t *testing.T) {
	m := newMoveOutSource(t)
	p, x, ctx := m.p, m.x, t.Context()
	src, dst := m.alloc(64<<10), m.alloc(64<<10)
	target := m.home(dst)
	const first, second = 0x11, 0x23
	step := func(phase poolv1.MoveOutPhase, fill uint64) error {
		req := &poolv1.MoveOutRequest{HomeId: src.ID, Phase: phase, Chunk: 4096, Fill: fill}
		if phase == poolv1.MoveOutPhase_MOVE_OUT_PUSH || phase == poolv1.MoveOutPhase_MOVE_OUT_SEAL {
			req.Target = target
		}
		_, err := p.moveOut(ctx, x, req, moveTLS{})
		return err
	}
	sealed := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.segs[src.ID].Sealed
	}

	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_TRACK, first))
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_PUSH, first))
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_ABORT, first))
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_TRACK, second), "a later fill of the same target")
	for _, phase := range []poolv1.MoveOutPhase{poolv1.MoveOutPhase_MOVE_OUT_SEAL, poolv1.MoveOutPhase_MOVE_OUT_PUSH, poolv1.MoveOutPhase_MOVE_OUT_DIRTY, poolv1.MoveOutPhase_MOVE_OUT_TRACK} {
		require.ErrorIs(t, step(phase, first), errMoveAborted, "a late %s of the aborted fill", phase)
	}
	require.False(t, sealed(), "the late SEAL sealed nothing")
	_, err := p.dp.srv.Chunk(src.ID)
	require.NoError(t, err, "the later fill's tracking is left as it was")
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_PUSH, second))
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_SEAL, second))
	_, _, noted, err := p.st.pushed(src)
	require.NoError(t, err)
	require.True(t, noted, "the fill's SEAL noted its push")
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_ABORT, second), "a fill's ABORT after its SEAL's push")
	require.False(t, sealed(), "the fill's ABORT unsealed")
}

// TestMoveOutStaleFillAbort: an ABORT of fill X that arrives after the
// origin's next fill Y of the segment tracked and sealed it (a background
// retry of X's undo, or its call delivered late) leaves Y be: writes
// still answer MOVED until Y ends, and Y's new home holds every write
// the source acknowledged. X's late steps are refused from Y's TRACK on,
// though X's ABORT had not arrived yet.
func TestMoveOutStaleFillAbort(t *testing.T) {
	m := newMoveOutSource(t)
	p, x, ctx := m.p, m.x, t.Context()
	const n = 64 << 10
	src, dst := m.alloc(n), m.alloc(n)
	writer := m.conn()
	target := m.home(dst)
	const stale, next = 0x31, 0x47
	step := func(phase poolv1.MoveOutPhase, fill uint64) error {
		req := &poolv1.MoveOutRequest{HomeId: src.ID, Phase: phase, Chunk: 4096, Fill: fill, All: true}
		if phase == poolv1.MoveOutPhase_MOVE_OUT_PUSH || phase == poolv1.MoveOutPhase_MOVE_OUT_SEAL {
			req.Target = target
		}
		_, err := p.moveOut(ctx, x, req, moveTLS{})
		return err
	}
	same := func(msg string) {
		t.Helper()
		a, b := make([]byte, n), make([]byte, n)
		require.NoError(t, writer.Read(ctx, region(t, src), 0, a))
		require.NoError(t, writer.Read(ctx, region(t, dst), 0, b))
		require.Equal(t, a, b, msg)
	}

	// Fill X tracks and pushes; its ABORT does not arrive. The origin's
	// next fill Y unseals before its TRACK (an ABORT naming no fill).
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_TRACK, stale))
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_PUSH, stale))
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_ABORT, 0))
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_TRACK, next))
	for _, phase := range []poolv1.MoveOutPhase{poolv1.MoveOutPhase_MOVE_OUT_DIRTY, poolv1.MoveOutPhase_MOVE_OUT_PUSH, poolv1.MoveOutPhase_MOVE_OUT_SEAL} {
		require.ErrorIs(t, step(phase, stale), errMoveAborted, "a late %s of the fill the next one's TRACK superseded", phase)
	}
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_PUSH, next))
	require.NoError(t, writer.Write(ctx, region(t, src), 5*4096+3, []byte("acknowledged")))
	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_SEAL, next))
	require.ErrorIs(t, writer.Write(ctx, region(t, src), 0, []byte("held")), rdma.ErrMoved, "sealed for the fill")

	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_ABORT, stale), "the stale fill's ABORT arrives")
	require.ErrorIs(t, writer.Write(ctx, region(t, src), 0, []byte("late")), rdma.ErrMoved, "still sealed for the next fill")
	p.mu.Lock()
	sealed := p.segs[src.ID].Sealed
	p.mu.Unlock()
	require.True(t, sealed, "the record stays sealed")
	require.True(t, p.tracked(src.ID), "the next fill's tracking is left as it was")
	same("the next fill's new home holds every acknowledged write")
	require.ErrorIs(t, step(poolv1.MoveOutPhase_MOVE_OUT_TRACK, stale), errMoveAborted, "the stale fill stays refused")

	require.NoError(t, step(poolv1.MoveOutPhase_MOVE_OUT_ABORT, next), "the fill ends: its switch unseals the writers")
	require.NoError(t, writer.Write(ctx, region(t, src), 0, []byte("after")), "unsealed")
	require.False(t, p.tracked(src.ID))
}

// TestMoveOutLateStepRecheck: a late DIRTY, PUSH or SEAL of fill X that
// passed moveOut's check before the origin's next fill Y unsealed (an
// ABORT naming no fill) and tracked the segment, but reaches the taking
// of changed chunks, or the seal, after them, is refused: it takes none
// of Y's changed chunks (Y's new home then holds every write the source
// acknowledged), seals nothing and leaves Y's tracking be. The
// moveOutRecheck hook runs Y's steps and a write at the k-th recheck of
// X's step (whileCurrent): before the take, or each of a SEAL's record
// seal, early round, data-plane seal and last round.
func TestMoveOutLateStepRecheck(t *testing.T) {
	m := newMoveOutSource(t)
	p, x, ctx := m.p, m.x, t.Context()
	const n = 64 << 10
	src, dst, stale := m.alloc(n), m.alloc(n), m.alloc(n)
	writer := m.conn()
	to := m.home
	req := func(phase poolv1.MoveOutPhase, fill uint64, target *poolv1.SegmentHome) *poolv1.MoveOutRequest {
		return &poolv1.MoveOutRequest{HomeId: src.ID, Phase: phase, Chunk: 4096, Fill: fill, Target: target}
	}
	step := func(r *poolv1.MoveOutRequest) error {
		_, err := p.moveOut(ctx, x, r, moveTLS{})
		return err
	}
	const (
		dirty = poolv1.MoveOutPhase_MOVE_OUT_DIRTY
		push  = poolv1.MoveOutPhase_MOVE_OUT_PUSH
		seal  = poolv1.MoveOutPhase_MOVE_OUT_SEAL
	)
	for i, c := range []struct {
		phase  poolv1.MoveOutPhase
		target bool // the late step pushes to the stale fill's target
		k      int  // the recheck of the late step Y's steps run at
	}{
		{dirty, false, 1}, {push, true, 1},
		{seal, true, 1}, {seal, true, 2}, {seal, true, 3}, {seal, true, 4},
		{seal, false, 1}, {seal, false, 2}, {seal, false, 3},
	} {
		name := fmt.Sprintf("late %s (target %v) at recheck %d", c.phase, c.target, c.k)
		t.Run(name, func(t *testing.T) {
			xf, yf := uint64(0x100+i), uint64(0x200+i)
			var xTarget *poolv1.SegmentHome
			if c.target {
				xTarget = to(stale)
			}
			require.NoError(t, step(req(poolv1.MoveOutPhase_MOVE_OUT_TRACK, xf, nil)))
			all := req(push, xf, to(stale))
			all.All = true
			require.NoError(t, step(all))

			rechecks := 0
			p.cfg.sim.moveOutRecheck = func(r *poolv1.MoveOutRequest) {
				if r.Fill != xf {
					return
				}
				if rechecks++; rechecks != c.k {
					return
				}
				require.NoError(t, step(req(poolv1.MoveOutPhase_MOVE_OUT_ABORT, 0, nil)))
				require.NoError(t, step(req(poolv1.MoveOutPhase_MOVE_OUT_TRACK, yf, nil)))
				all := req(push, yf, to(dst))
				all.All = true
				require.NoError(t, step(all))
				require.NoError(t, writer.Write(ctx, region(t, src), int64(i)*4096+3, []byte(name)))
			}
			require.ErrorIs(t, step(req(c.phase, xf, xTarget)), errMoveAborted)
			p.cfg.sim.moveOutRecheck = nil
			require.GreaterOrEqual(t, rechecks, c.k, "Y's steps ran")
			require.NoError(t, writer.Write(ctx, region(t, src), n-4096, []byte(name)), "not sealed for the late step")
			require.True(t, p.tracked(src.ID), "Y's tracking is left be")

			require.NoError(t, step(req(seal, yf, to(dst))))
			a, b := make([]byte, n), make([]byte, n)
			require.NoError(t, writer.Read(ctx, region(t, src), 0, a))
			require.NoError(t, writer.Read(ctx, region(t, dst), 0, b))
			require.Equal(t, a, b, "Y's new home holds every acknowledged write")
			require.NoError(t, step(req(poolv1.MoveOutPhase_MOVE_OUT_ABORT, yf, nil)))
		})
	}
}

// TestAbortedMovesBounded: abortedMoves forgets a move abortedFor after
// its ABORT, and the oldest once abortedMax are remembered; a move
// aborted again is remembered from its last ABORT.
func TestAbortedMovesBounded(t *testing.T) {
	var a abortedMoves
	to := func(id uint64) *poolv1.SegmentHome { return &poolv1.SegmentHome{Node: "n", HomeId: id} }
	mv := func(seg, id uint64) abortedMove {
		m, ok := moveOf(seg, &poolv1.MoveOutRequest{Target: to(id)})
		require.True(t, ok)
		return m
	}
	now := time.Now()
	a.add(mv(1, 1), now.Add(-abortedFor))
	require.False(t, a.has(mv(1, 1)), "forgotten abortedFor after its ABORT")
	_, ok := moveOf(1, &poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_SEAL})
	require.False(t, ok, "a step without a target or fill names no move")
	m, ok := moveOf(1, &poolv1.MoveOutRequest{Phase: poolv1.MoveOutPhase_MOVE_OUT_SEAL, Target: to(1), Fill: 7})
	require.True(t, ok)
	require.Equal(t, abortedMove{seg: 1, fill: 7}, m, "a fill's step names the fill, not its target")

	a.add(mv(1, 2), now)
	a.add(mv(1, 3), now)
	a.add(mv(1, 2), now)                     // aborted again: its first slot is overwritten first
	for id := range uint64(abortedMax - 1) { // the ring wraps past (1, 3)
		a.add(mv(2, id), now)
	}
	require.False(t, a.has(mv(1, 3)), "the oldest forgotten once abortedMax are remembered")
	require.True(t, a.has(mv(1, 2)), "remembered from its last ABORT")
	require.True(t, a.has(mv(2, 0)))
	require.Len(t, a.at, abortedMax)
}

// TestStatSettledForeign: a Stat that asks for the settled segment
// (StatRequest.settled) of another client's segment is refused at once,
// also while the segment moves: a foreign client learns nothing of its
// moves (not "still moving" for one under way) and holds no wait on them.
// Its owner's waits for the move's end, within its deadline.
func TestStatSettledForeign(t *testing.T) {
	cfg := testConfig(t)
	d, err := Start(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	dial := func(id string) *session.Conn {
		s, err := session.Dial(t.Context(), "unix", cfg.Socket, session.Options{ClientID: id})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}
	stat := func(s *session.Conn, id uint64, wait time.Duration) error {
		ctx, cancel := context.WithTimeout(t.Context(), wait)
		defer cancel()
		cctx, _, err := s.Call(ctx)
		require.NoError(t, err)
		_, err = s.API().Stat(cctx, &poolv1.StatRequest{Id: id, Settled: true})
		return errs.FromStatus(err)
	}
	victim, mallory := dial("victim"), dial("mallory")
	cctx, _, err := victim.Call(t.Context())
	require.NoError(t, err)
	seg, err := victim.API().Alloc(cctx, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL})
	require.NoError(t, errs.FromStatus(err))

	require.ErrorIs(t, stat(mallory, seg.Id, 5*time.Second), errs.ErrAccessDenied, "not moving")
	require.True(t, d.pool.moving.begin(seg.Id), "a move of the segment under way")
	err = stat(mallory, seg.Id, 5*time.Second)
	require.ErrorIs(t, err, errs.ErrAccessDenied, "moving: refused as when it is not, before any wait")
	require.NotContains(t, err.Error(), "moving")
	err = stat(victim, seg.Id, 100*time.Millisecond)
	require.Error(t, err, "the owner's waits for the move's end")
	require.NotErrorIs(t, err, errs.ErrAccessDenied)
	owner := make(chan error, 1)
	go func() { owner <- stat(victim, seg.Id, 10*time.Second) }()
	d.pool.moving.end(seg.Id)
	require.NoError(t, <-owner, "answered at the move's end")
}
