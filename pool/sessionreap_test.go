package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
)

// TestSessionAcrossReap: a client whose lease lapsed reconnects, and the
// reap that reclaims its last segment runs between its new session's bind
// and the session's start. That reap forgets the client id's binding (it
// holds nothing now), yet the new session serves the client: it is not
// refused on every call as a session of another identity's.
func TestSessionAcrossReap(t *testing.T) {
	cfg := testConfig(t)
	var d *Daemon
	second := make(chan struct{})
	cfg.sim.sessionBound = func(id string) {
		select {
		case <-second:
		default:
			return // the first session
		}
		// The lease of the first session runs out meanwhile; the daemon's
		// reaper (every LeaseTTL/4) reclaims the segment.
		require.Eventually(t, func() bool {
			return !slices.ContainsFunc(d.pool.List(), func(r record) bool { return r.Owner == id })
		}, 10*time.Second, 5*time.Millisecond, "the lapsed lease is not reaped")
	}
	var err error
	d, err = Start(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	dial := func() *session.Conn {
		s, err := session.Dial(t.Context(), "unix", cfg.Socket, session.Options{ClientID: "app"})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}
	alloc := func(s *session.Conn) error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		cctx, _, err := s.Call(ctx)
		require.NoError(t, err)
		_, err = s.API().Alloc(cctx, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL})
		return errs.FromStatus(err)
	}
	first := dial()
	require.NoError(t, alloc(first))
	require.NoError(t, first.Close())
	close(second)
	s := dial()
	require.NoError(t, alloc(s), "the session opened across the reap serves its client")
	require.NotEmpty(t, d.pool.credentials().identity("app"), "the client id is bound again")
}

// TestReapOneBatch: many clients whose leases ran out, each owning a
// segment and attached to another client's: the reap commits their
// removals and the shared segment's record without them in one batch, a
// transaction per store file, not one commit each under p.mu. A batch
// the store refuses changes nothing, in the store or the table, and the
// next reap reclaims them.
func TestReapOneBatch(t *testing.T) {
	for _, refused := range []bool{false, true} {
		t.Run(map[bool]string{false: "batch", true: "refused"}[refused], func(t *testing.T) {
			p, now := servingPool(t, testConfig(t))
			ctx := t.Context()
			session := func(client string) caller {
				p.openSession("s-"+client, client, client, 1, 1000)
				c, err := p.callerFor("s-" + client)
				require.NoError(t, err)
				c.ident = "uid:1000"
				return c
			}
			shared, err := p.Alloc(ctx, session("keeper"), allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "shared"})
			require.NoError(t, err)
			const n = 16
			var owned []uint64
			for i := range n {
				c := session(fmt.Sprintf("app-%d", i))
				r, err := p.Alloc(ctx, c, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL})
				require.NoError(t, err)
				owned = append(owned, r.ID)
				_, err = p.Attach(c, "shared")
				require.NoError(t, err)
				p.closeSession(fmt.Sprintf("s-app-%d", i))
			}
			*now = now.Add(2 * p.cfg.LeaseTTL)
			held := func() []int {
				segs := 0
				for _, id := range owned {
					if _, err := p.Stat(id); err == nil {
						segs++
					}
				}
				r, err := p.Stat(shared.ID)
				require.NoError(t, err)
				return []int{segs, len(r.Attached)}
			}
			refuse := func(on bool) {
				for _, f := range p.st.files() {
					f.mu.Lock()
					f.inject = nil
					if on {
						f.inject = func(bool) error { return errors.New("injected: the disk refused the write") }
					}
					f.mu.Unlock()
				}
			}

			if refused {
				refuse(true)
				p.reap()
				refuse(false)
				require.Equal(t, []int{n, n}, held(), "a refused batch changes nothing in the table")
				require.Len(t, storedIDs(t, p), n+1, "nor in the store")
			}
			commits := func() (n uint64) {
				for _, f := range p.st.files() {
					n += f.commits.Load()
				}
				return n
			}
			before := commits()
			p.reap()
			require.LessOrEqual(t, commits()-before, uint64(len(p.st.files())), "one transaction per store file")
			require.Equal(t, []int{0, 0}, held(), "the reap reclaims the segments and ends the attachments")
			require.Equal(t, []uint64{shared.ID}, storedIDs(t, p))
		})
	}
}
