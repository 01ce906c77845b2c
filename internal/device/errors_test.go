package device

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/errs"
)

func TestNotSupportedErrorMatches(t *testing.T) {
	err := error(&notSupportedError{feature: "mbind", reason: "no NUMA"})
	require.ErrorIs(t, err, ErrNotSupported)
	require.NotErrorIs(t, err, ErrInvalid)
	require.Contains(t, err.Error(), "mbind")
	require.Contains(t, err.Error(), "no NUMA")
	require.False(t, errors.Is(ErrInvalid, ErrNotSupported))
}

// TestSentinelsMatchFarmem: the device conditions a client acts on match
// the farmem sentinel of the same meaning, so the daemon's gRPC status
// carries them (never INTERNAL); the daemon-internal ones match none.
func TestSentinelsMatchFarmem(t *testing.T) {
	for _, tc := range []struct {
		err, want error
	}{
		{ErrNoSpace, errs.ErrNoCapacity},
		{ErrLost, errs.ErrSegmentLost},
		{ErrNotSupported, errs.ErrNotSupported},
		{&notSupportedError{feature: "mbind", reason: "no NUMA"}, errs.ErrNotSupported},
		{ErrClosed, errs.ErrUnavailable},
	} {
		err := fmt.Errorf("device emulated0: segment 0x5: %w", tc.err)
		require.ErrorIs(t, err, tc.want, tc.err.Error())
		require.ErrorIs(t, errs.FromStatus(errs.ToStatus(err)), tc.want, tc.err.Error())
	}
	for _, err := range []error{ErrInvalid, ErrUnaligned, ErrInUse} {
		require.Equal(t, "INTERNAL", errs.Reason(err), err.Error())
	}
}
