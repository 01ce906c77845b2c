package pool

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/coherence"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

func coherenceBatch(ms ...coherence.Message) []byte { return coherence.AppendBatch(nil, ms) }

// TestCoherenceReaderWritesNothing: a data-plane connection that may only
// read a shared segment (its principal among the segment's readers) is
// refused every coherence message that writes the home's memory or asks
// to own a page: a WriteReq, a WriteBack, an InvAck carrying data; it may
// still ask for a shared copy. The memory is unchanged.
func TestCoherenceReaderWritesNothing(t *testing.T) {
	h := newCoherenceHost(slog.New(slog.DiscardHandler))
	defer h.close()
	mem := make([]byte, 2*4096)
	page := make([]byte, 4096)
	for i := range page {
		page[i] = 0xEE
	}
	call := func(ms ...coherence.Message) tcp.MessageCall {
		return tcp.MessageCall{Seg: 1, Mem: mem, Req: coherenceBatch(ms...), MaxResp: 1 << 20, Principal: "reader"}
	}
	for _, m := range []coherence.Message{
		{Kind: coherence.WriteReq, From: 7, PageSize: 4096, Seq: 1},
		{Kind: coherence.WriteBack, From: 7, PageSize: 4096, Page: 1, Gen: 1, WBSeq: 1, Data: page},
	} {
		_, err := h.message(t.Context(), call(m))
		require.ErrorIs(t, err, rdma.ErrAccessDenied, "%s", m.Kind)
	}
	poll := coherence.Message{Kind: coherence.Poll, From: 7, PageSize: 4096}
	ack := coherence.Message{Kind: coherence.InvAck, From: 7, PageSize: 4096, HasData: true, Data: page}
	_, err := h.message(t.Context(), call(poll, ack))
	require.ErrorIs(t, err, rdma.ErrAccessDenied, "an InvAck with data riding a poll")
	_, err = h.message(t.Context(), call(coherence.Message{Kind: coherence.ReadReq, From: 7, PageSize: 4096, Seq: 2}))
	require.NoError(t, err, "a reader asks for a shared copy")
	require.Equal(t, make([]byte, len(mem)), mem)
}

// TestCoherenceSharerBoundToPrincipal: a sharer id belongs to the
// data-plane principal that first spoke as it. Another principal that
// speaks as it (a Release of its page, a Poll that would take its
// invalidations, an InvAck riding its own poll) is refused and changes
// nothing: the owner's page stays granted, so a write by a third sharer
// still waits for the owner's acknowledgement. A minute after the id was
// last heard from its binding is dropped. A principal binds at most
// maxSharersPerPrincipal ids of a segment at once, whatever it sends
// (acks riding a poll bind nothing: they must be the poller's own), and
// others are not crowded out.
func TestCoherenceSharerBoundToPrincipal(t *testing.T) {
	h := newCoherenceHost(slog.New(slog.DiscardHandler))
	defer h.close()
	mem := make([]byte, 2*4096)
	call := func(principal string, ms ...coherence.Message) ([]coherence.Message, error) {
		b, err := h.message(t.Context(), tcp.MessageCall{Seg: 1, Mem: mem, Req: coherenceBatch(ms...), MaxResp: 1 << 20, Writable: true, Principal: principal})
		if err != nil {
			return nil, err
		}
		return coherence.DecodeBatch(b)
	}
	const owner, other coherence.SharerID = 7, 8
	got, err := call("alice", coherence.Message{Kind: coherence.ReadReq, From: owner, PageSize: 4096, Page: 0, Seq: 1})
	require.NoError(t, err)
	require.Len(t, got, 1)
	gen := got[0].Gen

	for _, m := range [][]coherence.Message{
		{{Kind: coherence.Release, From: owner, PageSize: 4096, Page: 0, Gen: gen}},
		{{Kind: coherence.Poll, From: owner, PageSize: 4096}},
		{{Kind: coherence.Poll, From: other, PageSize: 4096}, {Kind: coherence.InvAck, From: owner, PageSize: 4096, Page: 0, Gen: gen}},
	} {
		_, err := call("mallory", m...)
		require.ErrorIs(t, err, rdma.ErrAccessDenied, "%s as alice's sharer", m[len(m)-1].Kind)
	}
	h.mu.Lock()
	_, bound := h.homes[1].owners[other]
	h.mu.Unlock()
	require.False(t, bound, "a refused batch binds none of its ids")

	// alice's copy still stands: bob's write waits for her
	// acknowledgement (answered within a twentieth of a lease, not granted).
	got, err = call("bob", coherence.Message{Kind: coherence.WriteReq, From: 9, PageSize: 4096, Page: 0, Seq: 1})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.NotEqual(t, coherence.Grant, got[0].Kind, "bob is not granted the page while alice holds a copy")

	// The owner's own messages go on.
	_, err = call("alice", coherence.Message{Kind: coherence.Poll, From: owner, PageSize: 4096})
	require.NoError(t, err)

	h.dropIdleOwners(time.Now().Add(ownerIdle + time.Second))
	_, err = call("mallory", coherence.Message{Kind: coherence.Poll, From: owner, PageSize: 4096})
	require.NoError(t, err, "a binding idle for longer than ownerIdle is dropped")

	// carol fills her share, one poll per id; a poll carrying acks of
	// other ids is refused whole.
	acks := []coherence.Message{{Kind: coherence.Poll, From: 5000, PageSize: 4096}}
	for i := range 100 {
		acks = append(acks, coherence.Message{Kind: coherence.InvAck, From: coherence.SharerID(6000 + i), PageSize: 4096})
	}
	_, err = call("carol", acks...)
	require.ErrorIs(t, err, rdma.ErrAccessDenied, "acks of other sharers riding a poll")
	for i := range maxSharersPerPrincipal {
		_, err = call("carol", coherence.Message{Kind: coherence.Poll, From: coherence.SharerID(1000 + i), PageSize: 4096})
		require.NoError(t, err)
	}
	_, err = call("carol", coherence.Message{Kind: coherence.Poll, From: 99, PageSize: 4096})
	require.ErrorIs(t, err, rdma.ErrAccessDenied, "past maxSharersPerPrincipal bound ids")
	_, err = call("carol", coherence.Message{Kind: coherence.Poll, From: 1000, PageSize: 4096})
	require.NoError(t, err, "her bound ids go on")
	_, err = call("dave", coherence.Message{Kind: coherence.ReadReq, From: 100, PageSize: 4096, Page: 1, Seq: 1})
	require.NoError(t, err, "another client is not crowded out")
	h.mu.Lock()
	n := len(h.homes[1].owners)
	h.mu.Unlock()
	require.Equal(t, 1+maxSharersPerPrincipal+1, n, "mallory's (alice's and bob's went idle), carol's and dave's ids")
	h.dropIdleOwners(time.Now().Add(ownerIdle + time.Second))
	_, err = call("carol", coherence.Message{Kind: coherence.Poll, From: 99, PageSize: 4096})
	require.NoError(t, err, "idle bindings no longer count")
}
