package pool

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/errs"
)

// TestOrphanMarks: a reconcile clears a peer's suspicion only when no mark
// came while it asked; a restarted daemon suspects each peer once, at its
// first return, and a fresh one none; one check loop runs per peer.
func TestOrphanMarks(t *testing.T) {
	var o orphans
	require.False(t, o.marked("b"))
	o.mark("b")
	before := time.Now()
	o.mark("b") // a free fails while the reconcile asks
	o.clear("b", before.Add(orphanSettle/2))
	require.True(t, o.marked("b"), "an answer right after the marks may miss an allocation still under way, or began before the last")
	later := time.Now().Add(2 * orphanSettle) // a reconcile begun well after the marks
	o.clear("b", later)
	require.False(t, o.marked("b"))
	require.Empty(t, o.nodes())
	o.mark("e")
	o.forget("e")
	require.False(t, o.marked("e"), "a node that left is forgotten")

	require.True(t, o.startCheck("c"))
	require.False(t, o.startCheck("c"), "one loop per peer")
	o.mark("c")
	require.True(t, o.stillSuspect("c"))
	o.clear("c", later)
	require.False(t, o.stillSuspect("c"), "the loop ends with the suspicion")
	require.True(t, o.startCheck("c"), "a later mark starts another")

	o.mark("f")
	require.WithinDuration(t, time.Now().Add(orphanSettle), o.settled("f"), time.Second)
	start := time.Now()
	require.False(t, o.expire("f", start), "marks before the loop began are forgotten when it ends")
	require.False(t, o.marked("f"))
	o.mark("f")
	require.True(t, o.expire("f", start), "a mark made while the loop ran wants a loop of its own")
	require.True(t, o.marked("f"))

	require.True(t, outcomeUnknown(context.DeadlineExceeded))
	require.True(t, outcomeUnknown(errs.ErrUnavailable))
	require.False(t, outcomeUnknown(errs.ToStatus(fmt.Errorf("tier full: %w", errs.ErrNoCapacity))), "a refusal the peer answered allocated nothing")

	require.False(t, o.firstReturn("d"), "a fresh daemon left nothing in flight")
	o.restarted = true
	require.True(t, o.firstReturn("d"))
	require.False(t, o.firstReturn("d"), "asked once")
}
