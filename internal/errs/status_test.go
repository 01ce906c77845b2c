package errs

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRoundTrip(t *testing.T) {
	for _, e := range table {
		t.Run(e.reason, func(t *testing.T) {
			wrapped := fmt.Errorf("alloc 5 GiB on cxl: %w", e.err)
			st := ToStatus(wrapped)
			require.Equal(t, e.code, status.Code(st))
			back := FromStatus(st)
			require.ErrorIs(t, back, e.err)
			require.Contains(t, back.Error(), "alloc 5 GiB on cxl")
			for _, other := range table {
				if !errors.Is(e.err, other.err) { // a Sub matches its parent too
					require.NotErrorIs(t, back, other.err)
				}
			}
		})
	}
}

func TestUnknownAndPlain(t *testing.T) {
	require.Nil(t, ToStatus(nil))
	require.Nil(t, FromStatus(nil))
	require.Equal(t, codes.Internal, status.Code(ToStatus(errors.New("boom"))))
	plain := errors.New("not grpc")
	require.Equal(t, plain, FromStatus(plain))
	require.ErrorIs(t, FromStatus(status.Error(codes.Unavailable, "connection refused")), ErrUnavailable)
	require.True(t, Retryable(FromStatus(status.Error(codes.Unavailable, "x"))))
	require.ErrorIs(t, FromStatus(status.Error(codes.NotFound, "x")), ErrNotFound)
}

// TestIndeterminate: ErrIndeterminate matches ErrUnavailable too, wrapped
// or not, so callers that check only ErrUnavailable still see a failure to
// reach the home; but it is not Retryable, since retrying could apply the
// operation twice.
func TestIndeterminate(t *testing.T) {
	err := fmt.Errorf("segment 7: %w", ErrIndeterminate)
	require.ErrorIs(t, err, ErrIndeterminate)
	require.ErrorIs(t, err, ErrUnavailable)
	require.NotErrorIs(t, ErrUnavailable, ErrIndeterminate)
	require.False(t, Retryable(err))
	require.True(t, Retryable(fmt.Errorf("x: %w", ErrUnavailable)))
}

// TestSub: a package's own sentinel made with Sub matches itself and its
// parent, and crosses the wire as the parent.
func TestSub(t *testing.T) {
	full := Sub(ErrNoCapacity, "no space left on the backing memory")
	err := fmt.Errorf("device emulated0: segment 0x5: %w", full)
	require.ErrorIs(t, err, full)
	require.ErrorIs(t, err, ErrNoCapacity)
	require.NotErrorIs(t, err, Sub(ErrNoCapacity, "no space left on the backing memory"), "compared by identity")
	require.Equal(t, "device emulated0: segment 0x5: no space left on the backing memory", err.Error())
	st := ToStatus(err)
	require.Equal(t, codes.ResourceExhausted, status.Code(st))
	require.ErrorIs(t, FromStatus(st), ErrNoCapacity)
}

// TestFarSubs: a far home's failure, a redundant segment's homes that
// cannot serve a call, or a segment changing under a request, is retried
// as ErrUnavailable, on this side of the wire and on the other, and its
// message, which crosses the wire whole, never sends the reader to start
// poold.
func TestFarSubs(t *testing.T) {
	for _, sub := range []error{ErrHomeUnreachable, ErrTooFewHomes, ErrSegmentChanging} {
		err := fmt.Errorf("segment 9 on b: %w", sub)
		require.ErrorIs(t, err, ErrUnavailable)
		require.True(t, Retryable(err))
		st := ToStatus(err)
		require.Equal(t, codes.Unavailable, status.Code(st))
		back := FromStatus(st)
		require.ErrorIs(t, back, ErrUnavailable)
		require.True(t, Retryable(back))
		require.Equal(t, err.Error(), back.Error())
		require.NotContains(t, back.Error(), "is poold running")
	}
}

// TestOverBudget: ErrOverBudget crosses the wire as itself, still matching
// its parent ErrNoCapacity, while a plain ErrNoCapacity, or a bare
// ResourceExhausted code from a generic server, does not become it.
func TestOverBudget(t *testing.T) {
	back := FromStatus(ToStatus(fmt.Errorf("alloc 4096 bytes: %w", ErrOverBudget)))
	require.ErrorIs(t, back, ErrOverBudget)
	require.ErrorIs(t, back, ErrNoCapacity)
	require.Equal(t, "OVER_BUDGET", Reason(back))
	require.NotErrorIs(t, FromStatus(ToStatus(ErrNoCapacity)), ErrOverBudget)
	bare := FromStatus(status.Error(codes.ResourceExhausted, "full"))
	require.ErrorIs(t, bare, ErrNoCapacity)
	require.NotErrorIs(t, bare, ErrOverBudget)
	require.ErrorIs(t, FromReason("OVER_BUDGET", "x"), ErrNoCapacity)
}

// TestAnswered: a status the daemon made from a sentinel is its answer;
// a transport failure, a deadline or a plain error is not.
func TestAnswered(t *testing.T) {
	require.True(t, Answered(ToStatus(fmt.Errorf("home up: %w", ErrInvalid))))
	require.True(t, Answered(ToStatus(ErrUnavailable)))
	require.False(t, Answered(status.Error(codes.Unavailable, "connection reset")))
	require.False(t, Answered(ToStatus(context.DeadlineExceeded)))
	require.False(t, Answered(errors.New("plain")))
	require.False(t, Answered(nil))
}
