package alloc

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/coherence"
	"github.com/farmem/farmem/rdma"
)

// stubConn is a connection a sharedLink test hands out; only Close is
// called on it.
type stubConn struct {
	rdma.Conn
	cred string
}

func (*stubConn) Close() error { return nil }

// TestSharedLinkRenewal: how a shared link answers a home that refuses
// its credential, by what the daemon says when asked for a new one.
func TestSharedLinkRenewal(t *testing.T) {
	refused := fmt.Errorf("test: %w", rdma.ErrAccessDenied)
	unreachable := fmt.Errorf("test home: connection refused")
	for _, tc := range []struct {
		name    string
		accept  string // the credential the home accepts ("" none)
		homeErr error  // the dial's error for any other credential
		renew   []byte // what the daemon hands out
		renewE  error
		since   time.Duration // how long the home has refused already (0: not)
		want    string        // "conn", "retry" (not final) or "lost"
	}{
		{"a new credential", "new", refused, []byte("new"), nil, 0, "conn"},
		{"the same credential, just refused", "", refused, []byte("old"), nil, 0, "retry"},
		{"no credential yet (no peer session at the home)", "", refused, nil, nil, 0, "retry"},
		{"this client's session ended", "", refused, nil, fmt.Errorf("test: %w", ErrLeaseExpired), 0, "retry"},
		{"the same credential, refused for longer than renewGrace", "", refused, []byte("old"), nil, renewGrace + time.Second, "lost"},
		{"a new one refused too, for longer than renewGrace", "", refused, []byte("new"), nil, renewGrace + time.Second, "lost"},
		{"the daemon is not reached", "", refused, nil, fmt.Errorf("test: %w", ErrUnavailable), renewGrace + time.Second, "retry"},
		{"the daemon does not answer in time", "", refused, nil, context.DeadlineExceeded, renewGrace + time.Second, "retry"},
		{"the daemon refuses: the segment is not this client's", "", refused, nil, fmt.Errorf("test: %w", ErrNotFound), 0, "lost"},
		{"the home is not reached", "", unreachable, nil, nil, renewGrace + time.Second, "retry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var renewed atomic.Int32
			l := &sharedLink{addr: "home:7960", cred: []byte("old"),
				dial: func(_ context.Context, cred []byte) (rdma.Conn, error) {
					if tc.accept != "" && string(cred) == tc.accept {
						return &stubConn{cred: string(cred)}, nil
					}
					return nil, tc.homeErr
				},
				renew: func(context.Context) ([]byte, error) {
					renewed.Add(1)
					return tc.renew, tc.renewE
				},
			}
			if tc.since > 0 {
				l.refusedSince = time.Now().Add(-tc.since)
			}
			c, err := l.conn(t.Context(), connPoll)
			switch tc.want {
			case "conn":
				require.NoError(t, err)
				require.Equal(t, tc.accept, c.(*stubConn).cred)
				require.Equal(t, tc.accept, string(l.cred), "the link keeps the new credential")
				require.True(t, l.refusedSince.IsZero())
			case "retry":
				require.Error(t, err)
				require.NotErrorIs(t, linkErr(err), coherence.ErrSegmentLost, "asked again on the next call")
			case "lost":
				require.ErrorIs(t, linkErr(err), coherence.ErrSegmentLost)
			}
			if errors.Is(tc.homeErr, rdma.ErrAccessDenied) {
				require.EqualValues(t, 1, renewed.Load())
			} else {
				require.Zero(t, renewed.Load(), "only a refusal asks the daemon")
				require.True(t, l.refusedSince.IsZero(), "a dial that does not reach the home ends the refusal episode")
			}
		})
	}
}

// TestSharedLinkRenewsUnlocked: a connection whose dial waits on the
// daemon does not hold up the link's other connections.
func TestSharedLinkRenewsUnlocked(t *testing.T) {
	release := make(chan struct{})
	l := &sharedLink{addr: "home:7960", cred: []byte("old"),
		dial: func(_ context.Context, cred []byte) (rdma.Conn, error) {
			if string(cred) == "old" {
				return nil, rdma.ErrAccessDenied
			}
			return &stubConn{cred: string(cred)}, nil
		},
		renew: func(ctx context.Context) ([]byte, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return []byte("new"), nil
		},
	}
	l.conns[connCalls] = &stubConn{cred: "old"}
	done := make(chan error, 1)
	go func() {
		_, err := l.conn(t.Context(), connPoll)
		done <- err
	}()
	got := make(chan rdma.Conn, 1)
	go func() {
		c, _ := l.conn(t.Context(), connCalls)
		got <- c
	}()
	select {
	case c := <-got:
		require.Equal(t, "old", c.(*stubConn).cred)
	case <-time.After(10 * time.Second):
		t.Fatal("the calls connection waited for the poll connection's renewal")
	}
	close(release)
	require.NoError(t, <-done)
}

// TestSharedLinkRefusalsOutlastDeadlines: a dial cut short by its caller's
// own deadline does not end a refusal episode (else calls with short
// deadlines would keep a link the home refuses for good from ever ending),
// and a call that renewed with a stale credential does not overwrite the
// one another call renewed meanwhile.
func TestSharedLinkRefusalsOutlastDeadlines(t *testing.T) {
	since := time.Now().Add(-time.Second)
	l := &sharedLink{addr: "home:7960", cred: []byte("old"), refusedSince: since,
		dial: func(ctx context.Context, _ []byte) (rdma.Conn, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
		renew: func(context.Context) ([]byte, error) { return nil, nil },
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	_, err := l.conn(ctx, connPoll)
	require.Error(t, err)
	require.Equal(t, since, l.refusedSince, "the refusal episode goes on")

	entered, gate := make(chan struct{}), make(chan struct{})
	l = &sharedLink{addr: "home:7960", cred: []byte("old"),
		dial: func(_ context.Context, cred []byte) (rdma.Conn, error) {
			if string(cred) == "old" {
				close(entered)
				<-gate // accepted just before the home withdrew it
			}
			return &stubConn{cred: string(cred)}, nil
		},
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = l.conn(t.Context(), connPoll)
	}()
	<-entered
	l.mu.Lock()
	l.cred = []byte("new") // another call renewed meanwhile
	l.mu.Unlock()
	close(gate)
	<-done
	require.Equal(t, "new", string(l.cred), "the stale credential does not overwrite the renewed one")
}
