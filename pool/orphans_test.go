package pool

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOrphanMarks: a reconcile clears a peer's suspicion only when no mark
// came while it asked; a restarted daemon suspects each peer once, at its
// first return, and a fresh one none; one check loop runs per peer.
func TestOrphanMarks(t *testing.T) {
	var o orphans
	require.Zero(t, o.marked("b"))
	o.mark("b")
	n := o.marked("b")
	o.mark("b") // a free fails while the reconcile asks
	o.clear("b", n)
	require.NotZero(t, o.marked("b"), "a mark that came during the reconcile stays")
	o.clear("b", o.marked("b"))
	require.Zero(t, o.marked("b"))
	require.Empty(t, o.nodes())

	require.True(t, o.startCheck("c"))
	require.False(t, o.startCheck("c"), "one loop per peer")
	o.mark("c")
	require.True(t, o.stillSuspect("c"))
	o.clear("c", o.marked("c"))
	require.False(t, o.stillSuspect("c"), "the loop ends with the suspicion")
	require.True(t, o.startCheck("c"), "a later mark starts another")

	require.False(t, o.firstReturn("d"), "a fresh daemon left nothing in flight")
	o.restarted = true
	require.True(t, o.firstReturn("d"))
	require.False(t, o.firstReturn("d"), "asked once")
}
