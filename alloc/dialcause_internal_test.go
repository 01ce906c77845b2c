package alloc

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// closedPort is a loopback address nothing listens on: a dial there is
// refused at once.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// hangUpNode is a loopback listener that closes every connection it
// accepts at once, before the handshake's reply.
func hangUpNode(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
	})
	return l.Addr().String()
}

// TestUnreachableHomeNamesDialCause: an operation on a segment whose far
// home's data plane cannot be dialed (nothing listens, or the port hangs
// up at once) fails, when the caller's context or the operation timeout
// ends, with a message that keeps why the dial failed and says what to
// check, not a bare "context deadline exceeded"; errors.Is still matches
// the context's error, and ErrHomeUnreachable after the operation
// timeout. A replicated segment's caller keeps the cause too.
func TestUnreachableHomeNamesDialCause(t *testing.T) {
	pcfg := pooltest.Config(t)
	pooltest.Start(t, pcfg)
	for _, tc := range []struct {
		name  string
		addr  func(t *testing.T) string
		cause string // what the dial error says
	}{
		{"nothing listens", closedPort, "connection refused"},
		{"hangs up", hangUpNode, "handshake"},
	} {
		for _, byCaller := range []bool{true, false} {
			bound := "operation timeout"
			if byCaller {
				bound = "caller's context"
			}
			t.Run(tc.name+"/"+bound, func(t *testing.T) {
				opTimeout := 300 * time.Millisecond
				ctx := t.Context()
				if byCaller {
					opTimeout = time.Minute
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
					defer cancel()
				}
				c, err := Dial(t.Context(), pcfg.Socket, WithOpTimeout(opTimeout))
				require.NoError(t, err)
				t.Cleanup(func() { c.Close() })
				var key rdma.Key
				seg, err := c.open(t.Context(), "", &poolv1.Segment{Id: 1 << 40, Tier: poolv1.Tier_TIER_RDMA, Size: 4096, Node: "h0",
					HomeId: 7, DataAddr: tc.addr(t), Key: key[:], Epoch: 1}, allocConfig{})
				require.NoError(t, err)
				err = seg.ReadBatch(ctx, []Span{{Off: 0, Buf: make([]byte, 64)}})
				t.Log(err)
				require.ErrorIs(t, err, context.DeadlineExceeded)
				if !byCaller {
					require.ErrorIs(t, err, errs.ErrHomeUnreachable)
				}
				require.Contains(t, err.Error(), tc.cause, "the dial's failure is kept")
				require.Contains(t, err.Error(), "--data-listen", "the message says what to check")
			})
		}
	}
	t.Run("copies", func(t *testing.T) {
		f := startFakeHomesAs(t, Replicas(2), 4096, 4096, tcp.DefaultConfig(), nil, func(info *poolv1.Segment) {
			for _, h := range info.Homes {
				h.DataAddr = closedPort(t)
			}
		})
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		err := f.seg.ReadBatch(ctx, []Span{{Off: 0, Buf: make([]byte, 64)}})
		t.Log(err)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Contains(t, err.Error(), "connection refused", "the dial's failure is kept")
		require.Contains(t, err.Error(), "--data-listen", "the message says what to check")
	})
}
