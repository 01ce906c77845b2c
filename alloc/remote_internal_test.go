package alloc

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

// TestFinal: the data plane's refusals are the home's answer, returned at
// once and matching the farmem sentinel an application tests; a broken
// connection, a protocol error or an ended context is a failure to reach
// the home, which remoteOp retries.
func TestFinal(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{rdma.ErrAccessDenied, ErrAccessDenied},
		{rdma.ErrOutOfRange, ErrOutOfRange},
		{rdma.ErrSegmentLost, ErrSegmentLost},
		{rdma.ErrLeaseExpired, ErrLeaseExpired},
		{rdma.ErrUnaligned, ErrUnaligned},
		{&rdma.NotSupportedError{Feature: "tcp fadd", Reason: "the server does not know this operation; upgrade it"}, ErrNotSupported},
		{rdma.ErrIndeterminate, ErrIndeterminate},
	} {
		err := fmt.Errorf("rdma/tcp: write segment 3 offset 0 length 8: status 2: %w", tc.err)
		require.True(t, final(err), "%v", err)
		require.ErrorIs(t, err, tc.want)
	}
	for _, err := range []error{rdma.ErrClosed, rdma.ErrProtocol, io.EOF, context.DeadlineExceeded, context.Canceled} {
		require.False(t, final(fmt.Errorf("rdma/tcp: read segment 3: %w", err)), "%v", err)
	}
}
