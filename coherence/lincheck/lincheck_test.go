package lincheck

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
)

// never is the return of an operation of unknown outcome, as the Recorder
// records it.
const never = 1 << 62

func op(client int, in Input, out Output, call, ret int64) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret}
}

func unknown(client int, in Input, call int64) porcupine.Operation {
	in.Unknown = true
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Return: never}
}

func values(ops []porcupine.Operation) []uint64 {
	var v []uint64
	for _, o := range ops {
		in := o.Input.(Input)
		switch in.Kind {
		case Write:
			v = append(v, in.Value)
		case CAS:
			v = append(v, in.New)
		}
	}
	return v
}

// TestUnobservedDropsOnlyUnseenUnknowns: of the unknown-outcome operations
// Unobserved keeps those whose value a completed read returned, a swapped
// compare-and-swap expected, or a kept unknown compare-and-swap expected
// (a chain), and one that returned before a later call; it drops the rest
// and keeps every completed operation. Values count per register.
func TestUnobservedDropsOnlyUnseenUnknowns(t *testing.T) {
	ops := []porcupine.Operation{
		op(0, Input{Kind: Write, Value: 1}, Output{}, 0, 10),
		op(0, Input{Kind: Read}, Output{Value: 1}, 11, 20),
		unknown(1, Input{Kind: Write, Value: 2}, 5),         // read below: kept
		unknown(1, Input{Kind: Write, Value: 3}, 6),         // nobody saw 3: dropped
		unknown(2, Input{Kind: Write, Value: 5}, 7),         // the kept CAS below expects it: kept
		unknown(2, Input{Kind: CAS, Old: 5, New: 6}, 8),     // 6 is read: kept
		unknown(3, Input{Kind: Write, Value: 8}, 9),         // swapped from below: kept
		unknown(3, Input{Kind: Write, Value: 9, Key: 1}, 9), // 9 seen on register 0 only: dropped
		unknown(3, Input{Kind: CAS, Old: 30, New: 31}, 9),   // nobody saw 31: dropped
		op(4, Input{Kind: Read}, Output{Value: 2}, 21, 30),  // sees 2
		op(4, Input{Kind: Read}, Output{Value: 6}, 31, 40),  // sees 6
		op(4, Input{Kind: CAS, Old: 8, New: 10}, Output{Swapped: true}, 41, 50),
		op(4, Input{Kind: Read}, Output{Value: 9}, 51, 60),                                     // 9 on register 0
		op(5, Input{Kind: Write, Value: 40}, Output{}, 61, 70),                                 // completed: kept although unread
		{ClientId: 6, Input: Input{Kind: Write, Value: 41, Unknown: true}, Call: 1, Return: 2}, // returned before later calls: kept
	}
	got := Unobserved(ops)
	require.ElementsMatch(t, []uint64{1, 2, 5, 6, 8, 10, 40, 41}, values(got))
	require.Len(t, got, len(ops)-3)
}

// TestCheckFallsBackToTheWholeHistory: a compare-and-swap that failed is
// explained only by an unknown write nobody read, so the history without
// it is not linearizable while the whole one is: Check passes it.
func TestCheckFallsBackToTheWholeHistory(t *testing.T) {
	ops := []porcupine.Operation{
		unknown(0, Input{Kind: Write, Value: 5}, 0),
		op(1, Input{Kind: CAS, Old: 0, New: 7}, Output{Swapped: false}, 10, 20),
		op(1, Input{Kind: Write, Value: 9}, Output{}, 30, 40),
		op(1, Input{Kind: Read}, Output{Value: 9}, 50, 60),
	}
	require.NotEqual(t, porcupine.Ok, porcupine.CheckOperations(Model, Unobserved(ops)), "the reduced history alone fails")
	ok, path, err := Check(ops, time.Minute, t.TempDir())
	require.NoError(t, err)
	require.True(t, ok)
	require.Empty(t, path)
}

// TestCheckFindsAViolationAmongUnknowns: a read of a value nobody wrote is
// a violation however the unknown writes beside it are placed; Check says
// so and keeps the visualization.
func TestCheckFindsAViolationAmongUnknowns(t *testing.T) {
	ops := []porcupine.Operation{
		op(0, Input{Kind: Write, Value: 1}, Output{}, 0, 10),
		op(1, Input{Kind: Read}, Output{Value: 4}, 20, 30),
	}
	for i := range 8 {
		ops = append(ops, unknown(2+i, Input{Kind: Write, Value: 100 + uint64(i)}, 5))
	}
	dir := t.TempDir()
	ok, path, err := Check(ops, time.Minute, dir)
	require.NoError(t, err)
	require.False(t, ok)
	require.FileExists(t, path)
}
