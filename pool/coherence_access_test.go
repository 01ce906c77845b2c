package pool

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/coherence"
	"github.com/farmem/farmem/rdma"
)

// TestCoherenceReaderWritesNothing: a data-plane connection that may only
// read a shared segment (its principal among the segment's readers) is
// refused every coherence message that writes the home's memory or asks
// to own a page: a WriteReq, a WriteBack, an InvAck carrying data (each
// may name any sharer as its sender); it may still ask for a shared copy.
// The memory is unchanged.
func TestCoherenceReaderWritesNothing(t *testing.T) {
	h := newCoherenceHost(slog.New(slog.DiscardHandler))
	defer h.close()
	mem := make([]byte, 2*4096)
	page := make([]byte, 4096)
	for i := range page {
		page[i] = 0xEE
	}
	batch := func(ms ...coherence.Message) []byte { return coherence.AppendBatch(nil, ms) }
	for _, m := range []coherence.Message{
		{Kind: coherence.WriteReq, From: 7, PageSize: 4096, Seq: 1},
		{Kind: coherence.WriteBack, From: 7, PageSize: 4096, Page: 1, Gen: 1, WBSeq: 1, Data: page},
	} {
		_, err := h.message(t.Context(), 1, mem, batch(m), 1<<20, false)
		require.ErrorIs(t, err, rdma.ErrAccessDenied, "%s", m.Kind)
	}
	poll := coherence.Message{Kind: coherence.Poll, From: 7, PageSize: 4096}
	ack := coherence.Message{Kind: coherence.InvAck, From: 7, PageSize: 4096, HasData: true, Data: page}
	_, err := h.message(t.Context(), 1, mem, batch(poll, ack), 1<<20, false)
	require.ErrorIs(t, err, rdma.ErrAccessDenied, "an InvAck with data riding a poll")
	_, err = h.message(t.Context(), 1, mem, batch(coherence.Message{Kind: coherence.ReadReq, From: 7, PageSize: 4096, Seq: 2}), 1<<20, false)
	require.NoError(t, err, "a reader asks for a shared copy")
	require.Equal(t, make([]byte, len(mem)), mem)
}
