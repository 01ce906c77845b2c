package alloc

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

// TestFinal: the data plane's refusals (each matches the farmem sentinel an
// application tests; rdma's tests check which) are the home's answer,
// returned at once; a broken connection, a protocol error or an ended
// context is a failure to reach the home, which remoteOp retries.
func TestFinal(t *testing.T) {
	refused := []error{rdma.ErrAccessDenied, rdma.ErrOutOfRange, rdma.ErrSegmentLost, rdma.ErrLeaseExpired, rdma.ErrUnaligned,
		&rdma.NotSupportedError{Feature: "tcp fadd", Reason: "the server does not know this operation; upgrade it"}, rdma.ErrIndeterminate}
	for _, err := range refused {
		require.True(t, final(fmt.Errorf("rdma/tcp: write segment 3 offset 0 length 8: status 2: %w", err)), "%v", err)
	}
	for _, err := range []error{rdma.ErrClosed, rdma.ErrProtocol, io.EOF, context.DeadlineExceeded, context.Canceled} {
		require.False(t, final(fmt.Errorf("rdma/tcp: read segment 3: %w", err)), "%v", err)
	}
}

// TestHandedOverOnce: an operation refused MOVED with the token of the
// move told ahead sends the segment to the copy, counts one handover and
// forgets the move (the plane left the home it leaves); a second refusal
// with that token, from an operation in flight at the old home
// meanwhile, still goes to the copy but counts nothing, and a MOVED
// without the token follows as without a move told.
func TestHandedOverOnce(t *testing.T) {
	r := &remote{c: &Client{}}
	from := &plane{addr: "old:1", region: rdma.Region{Segment: 1}}
	to := &plane{addr: "new:1", region: rdma.Region{Segment: 2}}
	h := &handover{from: from, to: to, token: 7}
	r.plane.Store(from)
	r.next.Store(h)
	refused := []*rdma.Op{{Err: &rdma.MovedError{Token: 7}}}
	require.True(t, r.handedOver(from, refused))
	require.Same(t, to, r.plane.Load())
	require.EqualValues(t, 1, r.c.pre.handovers.Load())
	require.Nil(t, r.next.Load(), "the move ended: nothing to wait for at any home")

	r.next.Store(h) // as an operation that loaded it before the first handover
	require.True(t, r.handedOver(from, refused), "to the copy, where the segment is now")
	require.Same(t, to, r.plane.Load())
	require.EqualValues(t, 1, r.c.pre.handovers.Load(), "one handover")
	require.Nil(t, r.next.Load())
	require.False(t, r.handedOver(to, []*rdma.Op{{Err: rdma.ErrMoved}}))
}
