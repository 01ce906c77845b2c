package coherence

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A transcript step: at time at (ms from start), sharer from sends msg to
// the directory (or the clock ticks, when msg.Kind is 0); the step names
// the reply kind and the pushes expected, and the page's state after.
type step struct {
	at     int
	msg    Message
	reply  Kind
	pushes string // "Invalidate>2 Grant>1" : kind>addressee, in order
	state  string // "Shared[1 2]" or "Modified(1)" or "Invalid"
}

func req(k Kind, from SharerID, seq uint64) Message {
	return Message{Kind: k, From: from, PageSize: 512, Seq: seq}
}

func ack(from SharerID, inv uint64, data bool) Message {
	m := Message{Kind: InvAck, From: from, InvID: inv, HasData: data}
	if data {
		m.Data = make([]byte, 512)
	}
	return m
}

func describe(d *Directory) string {
	st, owner, holders := d.State(0)
	switch st {
	case Modified:
		return fmt.Sprintf("Modified(%d)", owner)
	case Shared:
		return fmt.Sprintf("Shared%v", holders)
	}
	return "Invalid"
}

func TestTranscripts(t *testing.T) {
	tick := Message{}
	cases := []struct {
		name  string
		steps []step
	}{
		{"two readers share", []step{
			{0, req(ReadReq, 1, 1), Grant, "", "Shared[1]"},
			{1, req(ReadReq, 2, 1), Grant, "", "Shared[1 2]"},
		}},
		{"writer invalidates two readers and gets ownership after both acks", []step{
			{0, req(ReadReq, 1, 1), Grant, "", "Shared[1]"},
			{0, req(ReadReq, 2, 1), Grant, "", "Shared[1 2]"},
			{1, req(WriteReq, 3, 1), Wait, "Invalidate>1 Invalidate>2", "Shared[1 2]"},
			{2, ack(1, 1, false), OK, "", "Shared[2]"},
			{2, req(ReadReq, 4, 1), Busy, "", "Shared[2]"},
			{3, ack(2, 2, false), OK, "Grant>3", "Modified(3)"},
		}},
		{"upgrade from shared keeps no other sharer", []step{
			{0, req(ReadReq, 1, 1), Grant, "", "Shared[1]"},
			{1, req(WriteReq, 1, 2), Grant, "", "Modified(1)"},
		}},
		{"reader downgrades the owner, who writes back", []step{
			{0, req(WriteReq, 1, 1), Grant, "", "Modified(1)"},
			{1, req(ReadReq, 2, 1), Wait, "Invalidate>1", "Modified(1)"},
			{2, ack(1, 1, false), OK, "", "Modified(1)"}, // an ack without the data is not enough
			{2, ack(1, 1, true), OK, "Grant>2", "Shared[1 2]"},
		}},
		{"a dead sharer delays the writer by its lease, not forever", []step{
			{0, req(ReadReq, 1, 1), Grant, "", "Shared[1]"},
			{10, req(WriteReq, 2, 1), Wait, "Invalidate>1", "Shared[1]"},
			{50, tick, 0, "Invalidate>1", "Shared[1]"}, // resent every tenth of a lease
			{99, tick, 0, "Invalidate>1", "Shared[1]"}, // resent, still within the lease
			{100, tick, 0, "Grant>2", "Modified(2)"},
		}},
		{"a dead owner's page reverts to the home's copy after its lease", []step{
			{0, req(WriteReq, 1, 1), Grant, "", "Modified(1)"},
			{5, req(ReadReq, 2, 1), Wait, "Invalidate>1", "Modified(1)"},
			{100, tick, 0, "Grant>2", "Shared[2]"},
		}},
		{"a stale write-back is refused", []step{
			{0, req(WriteReq, 1, 1), Grant, "", "Modified(1)"},
			{5, req(WriteReq, 2, 1), Wait, "Invalidate>1", "Modified(1)"},
			{100, tick, 0, "Grant>2", "Modified(2)"},
			{101, Message{Kind: WriteBack, From: 1, Gen: 1, WBSeq: 1, Data: make([]byte, 512)}, Stale, "", "Modified(2)"},
		}},
		{"write-back renews the owner's lease", []step{
			{0, req(WriteReq, 1, 1), Grant, "", "Modified(1)"},
			{80, Message{Kind: WriteBack, From: 1, Gen: 1, WBSeq: 1, Data: make([]byte, 512)}, OK, "", "Modified(1)"},
			{120, req(ReadReq, 2, 1), Wait, "Invalidate>1", "Modified(1)"},
			{179, tick, 0, "Invalidate>1", "Modified(1)"},
			{180, tick, 0, "Grant>2", "Shared[2]"},
		}},
		{"release of the last copy leaves the page invalid", []step{
			{0, req(ReadReq, 1, 1), Grant, "", "Shared[1]"},
			{1, Message{Kind: Release, From: 1, Gen: 1}, OK, "", "Invalid"},
		}},
		{"a duplicate request while waiting is told to wait", []step{
			{0, req(ReadReq, 1, 1), Grant, "", "Shared[1]"},
			{1, req(WriteReq, 2, 7), Wait, "Invalidate>1", "Shared[1]"},
			{2, req(WriteReq, 2, 7), Wait, "", "Shared[1]"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{PageSize: 512, Lease: 100 * time.Millisecond}
			t0 := time.Unix(0, 0)
			d, err := NewDirectory(cfg, make([]byte, 1024), 9, t0)
			require.NoError(t, err)
			for i, s := range tc.steps {
				now := t0.Add(time.Duration(s.at) * time.Millisecond)
				var out []Message
				if s.msg.Kind == 0 {
					out = d.Tick(now, cfg.Lease/10)
				} else {
					var rep Message
					rep, out = d.Handle(now, s.msg)
					require.Equal(t, s.reply, rep.Kind, "step %d: reply to %s is %s", i, s.msg, rep)
				}
				var got []string
				for _, m := range out {
					got = append(got, fmt.Sprintf("%s>%d", m.Kind, m.From))
				}
				require.Equal(t, s.pushes, strings.Join(got, " "), "step %d pushes", i)
				require.Equal(t, s.state, describe(d), "step %d state", i)
				require.NoError(t, d.Check())
			}
		})
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(AppendBatch(nil, []Message{{Kind: Grant, From: 3, Page: 1, Seq: 2, Gen: 9, Lease: time.Second, Exclusive: true, Data: []byte("page")}}))
	f.Add(AppendBatch(nil, []Message{{Kind: Invalidate, Downgrade: true}, {Kind: InvAck, HasData: true, Data: []byte{1, 2}}}))
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, err := DecodeBatch(b)
		if err != nil {
			return
		}
		again, err := DecodeBatch(AppendBatch(nil, msgs))
		require.NoError(t, err)
		require.Len(t, again, len(msgs))
		for i := range msgs {
			require.Equal(t, msgs[i].String(), again[i].String())
		}
	})
}
