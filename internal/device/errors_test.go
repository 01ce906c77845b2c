package device

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNotSupportedErrorMatches(t *testing.T) {
	err := error(&notSupportedError{feature: "mbind", reason: "no NUMA"})
	require.ErrorIs(t, err, ErrNotSupported)
	require.NotErrorIs(t, err, ErrInvalid)
	require.Contains(t, err.Error(), "mbind")
	require.Contains(t, err.Error(), "no NUMA")
	require.False(t, errors.Is(ErrInvalid, ErrNotSupported))
}
