package rdma_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

// TestTryAcquire: TryAcquire takes free slots like Acquire, each ticket
// with the slot's next sequence number, and reports false instead of
// waiting once all SessionSlots are taken; a released slot is taken again.
func TestTryAcquire(t *testing.T) {
	s := rdma.NewSession()
	var held []*rdma.Ticket
	slots := map[uint16]bool{}
	for range rdma.SessionSlots {
		tk, ok := s.TryAcquire()
		require.True(t, ok)
		require.False(t, slots[tk.Slot], "slot %d handed out twice", tk.Slot)
		require.Equal(t, uint32(1), tk.Seq)
		slots[tk.Slot] = true
		held = append(held, tk)
	}
	_, ok := s.TryAcquire()
	require.False(t, ok, "a ticket past SessionSlots")
	held[7].Release()
	tk, ok := s.TryAcquire()
	require.True(t, ok)
	require.Equal(t, held[7].Slot, tk.Slot)
	require.Equal(t, uint32(2), tk.Seq)
}
