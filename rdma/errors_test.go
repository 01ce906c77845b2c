package rdma_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// TestSentinelsMatchFarmem: every rdma sentinel for a condition an
// application acts on matches the farmem sentinel of the same meaning,
// wrapped or not, matches no other, and crosses the control plane as it
// (never as INTERNAL).
func TestSentinelsMatchFarmem(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"access denied", rdma.ErrAccessDenied, errs.ErrAccessDenied},
		{"out of range", rdma.ErrOutOfRange, errs.ErrOutOfRange},
		{"segment lost", rdma.ErrSegmentLost, errs.ErrSegmentLost},
		{"lease expired", rdma.ErrLeaseExpired, errs.ErrLeaseExpired},
		{"unaligned", rdma.ErrUnaligned, errs.ErrUnaligned},
		{"not supported", rdma.ErrNotSupported, errs.ErrNotSupported},
		{"not supported error", &rdma.NotSupportedError{Feature: "verbs transport", Reason: "no device"}, errs.ErrNotSupported},
		{"closed", rdma.ErrClosed, errs.ErrUnavailable},
		{"indeterminate", rdma.ErrIndeterminate, errs.ErrIndeterminate},
		{"moved", rdma.ErrMoved, errs.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := fmt.Errorf("rdma/tcp: read segment 3: %w", tc.err)
			require.ErrorIs(t, err, tc.err)
			require.ErrorIs(t, err, tc.want)
			for _, other := range []error{errs.ErrAccessDenied, errs.ErrOutOfRange, errs.ErrSegmentLost, errs.ErrLeaseExpired,
				errs.ErrUnaligned, errs.ErrNotSupported, errs.ErrClosed, errs.ErrNoCapacity, errs.ErrInvalid} {
				if other != tc.want {
					require.NotErrorIs(t, err, other)
				}
			}
			// The control plane carries ErrIndeterminate as ErrUnavailable,
			// which it matches.
			wire := tc.want
			if wire == errs.ErrIndeterminate {
				wire = errs.ErrUnavailable
			}
			require.ErrorIs(t, errs.FromStatus(errs.ToStatus(err)), wire)
			require.NotEqual(t, codes.Internal, status.Code(errs.ToStatus(err)))
		})
	}
}

// TestIndeterminateIsUnavailable: rdma.ErrIndeterminate, like the farmem
// sentinel, also reads as ErrUnavailable, but is never Retryable: a retry
// could apply the write twice.
func TestIndeterminateIsUnavailable(t *testing.T) {
	err := fmt.Errorf("segment 7: %w", rdma.ErrIndeterminate)
	require.ErrorIs(t, err, errs.ErrUnavailable)
	require.False(t, errs.Retryable(err))
	require.True(t, errs.Retryable(fmt.Errorf("segment 7: %w", rdma.ErrClosed)))
	require.NotErrorIs(t, rdma.ErrClosed, errs.ErrIndeterminate)
}

// TestInternalSentinelsStayLocal: the conditions only the daemon sees match
// no farmem sentinel, so they never reach an application as one.
func TestInternalSentinelsStayLocal(t *testing.T) {
	for _, err := range []error{rdma.ErrProtocol, rdma.ErrNotExported, rdma.ErrAlreadyExported} {
		require.Equal(t, "INTERNAL", errs.Reason(err), err.Error())
	}
}
