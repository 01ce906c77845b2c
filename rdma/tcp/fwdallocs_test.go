package tcp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

// TestForwardAllocs: an exactly-once 4 KiB WRITE to a segment that copies
// it to one backup, and one to the data home of a 4+2 stripe that sends
// parity deltas to two parity homes, allocate (client, primary and
// targets together, all in this process) at most five times per hop,
// about what each hop's ticket and its leading reader's context hook
// take: the forwarded op, its sends, payloads, origin block and deadline
// come from pools (without them: 29 and 39).
func TestForwardAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items: allocation counts are meaningless")
	}
	const size = 1 << 16
	copies := startHomes(t, 2, 1, size)
	require.NoError(t, copies[0].srv.Forward(1, &Forwarding{Mode: ForwardCopy, Targets: targets(t, copies[1:])}))
	stripe := startHomes(t, 3, 1, size)
	require.NoError(t, stripe[0].srv.Forward(1, &Forwarding{Mode: ForwardParity, Shard: 0, DataShards: 4, ParityShards: 2, Targets: targets(t, stripe[1:])}))
	buf := make([]byte, 4096)
	for _, tc := range []struct {
		name string
		h    *home
		hops float64
	}{{"copy", copies[0], 2}, {"parity4+2", stripe[0], 3}} {
		t.Run(tc.name, func(t *testing.T) {
			sess := rdma.NewSession()
			cl := dial(t, tc.h.srv.addr, WithConns(1), WithSession(sess))
			op := &rdma.Op{Kind: rdma.OpWrite, Offset: 8192, Buf: buf}
			write := func() {
				tk, err := sess.Acquire(t.Context())
				require.NoError(t, err)
				op.Region, op.Once = tc.h.r, tk
				if err := cl.Do(t.Context(), op); err != nil {
					t.Error(err)
				}
				tk.Release()
			}
			write() // dials the targets' connections
			n := testing.AllocsPerRun(200, write)
			require.LessOrEqual(t, n, 5*tc.hops, "allocations per forwarded 4 KiB WRITE (%s)", tc.name)
		})
	}
}
