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
