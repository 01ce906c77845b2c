package pool

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"
	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// TestRebuildNeed: which home of a record a rebuild takes on, for
// replicas and erasure coding, with the segment's redundancy state.
func TestRebuildNeed(t *testing.T) {
	const (
		ok   = poolv1.HomeState_HOME_STATE_OK
		lost = poolv1.HomeState_HOME_STATE_LOST
		rb   = poolv1.HomeState_HOME_STATE_REBUILDING
	)
	rec := func(red redundancy, states ...poolv1.HomeState) *record {
		r := &record{ID: 1, Redundancy: red}
		for i, s := range states {
			r.Homes = append(r.Homes, homeRef{Node: string(rune('a' + i)), HomeID: uint64(i + 1), State: s})
		}
		r.settle() // lost when more homes are lost than it survives
		return r
	}
	rep2, ec42 := redundancy{Replicas: 2}, redundancy{Data: 4, Parity: 2}
	for _, tc := range []struct {
		name  string
		r     *record
		want  int
		state poolv1.RedundancyState
	}{
		{"not redundant", &record{ID: 1}, -1, poolv1.RedundancyState_REDUNDANCY_STATE_NONE},
		{"replicas ok", rec(rep2, ok, ok), -1, poolv1.RedundancyState_REDUNDANCY_STATE_OK},
		{"backup lost", rec(rep2, ok, lost), 1, poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED},
		{"backup rebuilding", rec(rep2, ok, rb), 1, poolv1.RedundancyState_REDUNDANCY_STATE_REBUILDING},
		{"primary lost, not promoted yet", rec(rep2, lost, ok), -1, poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED},
		{"every copy lost", rec(rep2, lost, lost), -1, poolv1.RedundancyState_REDUNDANCY_STATE_LOST},
		{"the last copy lost while another rebuilds", rec(rep2, lost, rb), -1, poolv1.RedundancyState_REDUNDANCY_STATE_LOST},
		{"ec ok", rec(ec42, ok, ok, ok, ok, ok, ok), -1, poolv1.RedundancyState_REDUNDANCY_STATE_OK},
		{"ec data shard lost", rec(ec42, ok, ok, lost, ok, ok, ok), 2, poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED},
		{"ec two lost, first first", rec(ec42, ok, ok, ok, ok, lost, lost), 4, poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED},
		{"ec one rebuilding one lost", rec(ec42, rb, ok, ok, ok, ok, lost), 0, poolv1.RedundancyState_REDUNDANCY_STATE_REBUILDING},
		{"ec below k", rec(ec42, lost, ok, ok, lost, ok, lost), -1, poolv1.RedundancyState_REDUNDANCY_STATE_LOST},
		{"ec below k with one rebuilding", rec(ec42, lost, ok, ok, rb, ok, lost), -1, poolv1.RedundancyState_REDUNDANCY_STATE_LOST},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, rebuildNeed(tc.r))
			require.Equal(t, tc.state, tc.r.redundancyState())
		})
	}
	require.Equal(t, "rebuilding", redundancyLabel(poolv1.RedundancyState_REDUNDANCY_STATE_REBUILDING))
}

// TestRateLimit: the limiter paces bytes to its rate (the time taken is
// compared with the time the bytes take at the rate, never with a fixed
// figure), gives no credit for idle time, and a canceled wait returns
// the context's error.
func TestRateLimit(t *testing.T) {
	var none *rateLimit
	require.NoError(t, none.wait(t.Context(), 1<<40), "nil: unlimited")

	l := &rateLimit{perSec: 64 << 20}
	start := time.Now()
	for range 9 {
		require.NoError(t, l.wait(t.Context(), 4<<20))
	}
	// 9 batches of 4 MiB: the first goes at once, the other 8 wait 1/16 s each.
	require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond-10*time.Millisecond)

	time.Sleep(100 * time.Millisecond) // past the last batch's turn: idle
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.NoError(t, l.wait(ctx, 64<<20), "due at once after idling")
	require.ErrorIs(t, l.wait(ctx, 1), context.Canceled, "a second of bytes ahead: it waits, and is canceled")
}

// TestRebuildDecode: the decode of a lost shard reads the same spans of
// k surviving shards from real data planes and reconstructs the lost
// shard's bytes, data or parity, for spans of any length and offset.
func TestRebuildDecode(t *testing.T) {
	const k, m, shard = 4, 2, 64 << 10
	enc, shards, regions, conn, srv := codedShards(t, k, m, shard)

	batch := [][2]int64{{0, 4096}, {8192, 8192 + 100}, {shard - 7000, shard}}
	n := int64(0)
	for _, s := range batch {
		n += s[1] - s[0]
	}
	for _, lost := range []int{1, k + 1} { // a data shard, a parity shard
		f := decodeFill(enc, k, m, lost, []int{lost}, n, conn, regions, srv)
		buf := make([]byte, n)
		require.NoError(t, f.decode(t.Context(), buf, batch), "shard %d", lost)
		checkSpans(t, shards[lost], buf, batch)
	}

	// A data shard decoded with a spare: parity shard 5 disagrees with
	// the others in the second span (a write hole). Before the seal the
	// decode stands (from the sources) and the span's chunk is suspect;
	// sealed, shard 5's span is rewritten in line with the data shards,
	// under a raised epoch: a data home's parity delta that was on its
	// way from before the seal (its forward timed out, and the shard's
	// loss could not be recorded) is refused, not applied a second time.
	ctx := t.Context()
	parity := func() []byte {
		b := make([]byte, shard)
		require.NoError(t, conn.Do(ctx, &rdma.Op{Kind: rdma.OpRead, Region: regions[5], Buf: b}))
		return b
	}
	require.NoError(t, conn.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: regions[5], Offset: 8192 + 10, Buf: []byte{^shards[5][8192+10]}}))
	f := decodeFill(enc, k, m, 1, []int{1}, n, conn, regions, srv)
	buf := make([]byte, n)
	require.NoError(t, f.decode(ctx, buf, batch))
	checkSpans(t, shards[1], buf, batch)
	want, _ := rangeChunks(8192, 8192+100, f.m.chunk)
	require.Equal(t, want, f.suspect, "the disagreeing span's chunk is suspect")
	require.NotEqual(t, shards[5], parity(), "unsealed, the spare is left as it is")
	f.sealed = true
	clear(buf)
	require.NoError(t, f.decode(ctx, buf, batch))
	checkSpans(t, shards[1], buf, batch)
	require.NoError(t, f.repair(ctx))
	regions[5].Epoch++ // raised by the repair's fence
	require.Equal(t, shards[5], parity(), "sealed, the spare is brought in line")
	require.Equal(t, int64(100), f.repaired.Load())
	late := &rdma.Op{Kind: rdma.OpXor, Region: rdma.Region{Segment: regions[5].Segment, Key: regions[5].Key, Epoch: 1}, Offset: 8192 + 10, Buf: []byte{0x5a}}
	require.ErrorIs(t, conn.Do(ctx, late), rdma.ErrLeaseExpired, "a delta sent under the old epoch is applied after the repair")
	require.Equal(t, shards[5], parity(), "a late delta undid the repair")

	// A spare that fails its read (here: a wrong key) is taken out of the
	// checks; the decode goes on from the sources.
	f.spares[0].reg.Key[0] ^= 1
	clear(buf)
	require.NoError(t, f.decode(ctx, buf, batch))
	checkSpans(t, shards[1], buf, batch)
	require.True(t, f.down[0].Load(), "the failed spare is down")

	// A spare whose repair fails stays out of line with the data shards:
	// it is marked lost (and rebuilt), never left OK as it is.
	require.NoError(t, conn.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: regions[5], Offset: 8192 + 20, Buf: []byte{^shards[5][8192+20]}}))
	f = decodeFill(enc, k, m, 1, []int{1}, n, conn, regions, srv)
	f.spares[0].conn = failWrites{conn}
	f.sealed = true
	require.NoError(t, f.decode(ctx, buf, batch))
	checkSpans(t, shards[1], buf, batch)
	require.NoError(t, f.repair(ctx))
	require.Zero(t, f.repaired.Load())
	require.True(t, f.outOfLine[k].Load(), "the spare whose repair failed is not to be marked lost")
	require.False(t, f.outOfLine[k-1].Load(), "parity shard 4, in line, is to be marked lost")
}

// TestRebuildDecodeVotes: sealed, a span the spares disagree with is
// decoded from the parity shards the most others agree with, not from the
// sources' first ones, and the parity shards that disagree with it are
// brought in line. Two data shards of ec=4+4 missing: the decode rests on
// two parity shards, and data shard 0's home died after its write's delta
// reached parity shard 4 and before it reached 5, 6 and 7; a decode from
// 4 and 5 would be bytes nobody wrote in both data shards, data shard 1's
// acknowledged bytes among them. One data shard of ec=4+3 missing: parity
// shard 4, a source, missed a write of the live data shard 0 that 5 and 6
// hold; a decode from it would be wrong where the write was.
func TestRebuildDecodeVotes(t *testing.T) {
	const shard, off, n = 16 << 10, 100, 512
	for _, tc := range []struct {
		name     string
		k, m, i  int
		lost     []int
		wrote    []int // the shards that hold data shard 0's write
		outvoted int   // the parity shard rewritten
	}{
		{"write hole, two data shards missing", 4, 4, 0, []int{0, 1}, []int{4}, 4},
		{"a parity source missed a write", 4, 3, 1, []int{1}, []int{0, 5, 6}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc, shards, regions, conn, srv := codedShards(t, tc.k, tc.m, shard)
			ctx := t.Context()
			after := make([][]byte, tc.k+tc.m)
			for i := range after {
				after[i] = slices.Clone(shards[i])
			}
			_, _ = rand.Read(after[0][off : off+n])
			require.NoError(t, enc.Encode(after))
			for _, i := range tc.wrote {
				require.NoError(t, conn.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: regions[i], Offset: off, Buf: after[i][off : off+n]}))
			}

			f := decodeFill(enc, tc.k, tc.m, tc.i, tc.lost, shard, conn, regions, srv)
			f.sealed = true
			buf := make([]byte, shard)
			var batch [][2]int64 // spans of a chunk, as the mover's
			for c := int64(0); c < shard; c += moveChunkMin {
				batch = append(batch, [2]int64{c, c + moveChunkMin})
			}
			require.NoError(t, f.decode(ctx, buf, batch))
			require.NoError(t, f.repair(ctx))
			require.True(t, bytes.Equal(shards[tc.i], buf), "data shard %d holds bytes nobody wrote", tc.i)
			got := make([][]byte, tc.k+tc.m)
			for i := range got {
				got[i] = make([]byte, shard)
				require.NoError(t, conn.Do(ctx, &rdma.Op{Kind: rdma.OpRead, Region: regions[i], Buf: got[i]}))
			}
			got[tc.i] = buf
			agree, err := enc.Verify(got)
			require.NoError(t, err)
			require.True(t, agree, "the shards are not a consistent code of the data shards' bytes")
			was := shards[tc.outvoted]
			if slices.Contains(tc.wrote, tc.outvoted) {
				was = after[tc.outvoted]
			}
			require.False(t, bytes.Equal(was, got[tc.outvoted]), "parity shard %d is not rewritten", tc.outvoted)
			require.Equal(t, int64(moveChunkMin), f.repaired.Load(), "parity shard %d's span is rewritten, and only it", tc.outvoted)
		})
	}
	// The vote's choices, bounded: beyond maxVote the sources' stand.
	require.Equal(t, 6, choices(4, 2))
	require.Equal(t, 20, choices(20, 19))
	require.Greater(t, choices(63, 31), maxVote)
}

// codedShards serves the k+m shards of size bytes of a random erasure-
// coded stripe on one real data plane and returns the code, the shards,
// their regions and a connection to it.
func codedShards(t *testing.T, k, m, size int) (reedsolomon.Encoder, [][]byte, []rdma.Region, rdma.Conn, *tcp.Server) {
	t.Helper()
	srv := tcp.NewServer(tcp.ServerConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		require.NoError(t, srv.Close())
		require.NoError(t, <-served)
	})
	enc, err := reedsolomon.New(k, m)
	require.NoError(t, err)
	shards := make([][]byte, k+m)
	regions := make([]rdma.Region, k+m)
	for i := range shards {
		shards[i] = make([]byte, size)
		if i < k {
			_, _ = rand.Read(shards[i])
		}
	}
	require.NoError(t, enc.Encode(shards))
	for i := range shards {
		mem := append([]byte(nil), shards[i]...)
		key, err := srv.Export(uint64(i+1), mem, 1)
		require.NoError(t, err)
		regions[i] = rdma.Region{Segment: uint64(i + 1), Key: key, Epoch: 1}
	}
	conn, err := tcp.Dial(t.Context(), l.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return enc, shards, regions, conn, srv
}

// decodeFill is the fill of shard i of the stripe at regions (over conn,
// served by srv), decoded in batches of n bytes, with the shards lost
// missing: the first k others are its sources and, for a data shard as
// newFill has it, the rest its spares. Its fence raises the epochs at srv.
func decodeFill(enc reedsolomon.Encoder, k, m, i int, lost []int, n int64, conn rdma.Conn, regions []rdma.Region, srv *tcp.Server) *rebuildFill {
	f := &rebuildFill{r: record{ID: 9, Redundancy: redundancy{Data: k, Parity: m}}, i: i, enc: enc}
	f.p = &core{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	f.m = &mover{batch: n, chunk: moveChunkMin}
	f.bufs.New = func() any { b := make([]byte, f.m.batch); return &b }
	for j := range k + m {
		s := rebuildPeer{idx: j, conn: conn, reg: regions[j], home: homeRef{Node: "x"}}
		switch {
		case slices.Contains(lost, j):
		case len(f.sources) < k:
			f.sources = append(f.sources, s)
		case i < k:
			f.spares = append(f.spares, s)
		}
	}
	f.down = make([]atomic.Bool, len(f.spares))
	f.late = make([]atomic.Int32, len(f.spares))
	read := slices.Concat(f.sources, f.spares)
	f.repairs = make([][]repairSpan, len(read))
	f.outOfLine = make([]atomic.Bool, len(read))
	f.fence = func(_ context.Context, pos []int) ([]uint64, error) {
		epochs := make([]uint64, len(pos))
		for y, j := range pos {
			reg := read[j].reg
			epochs[y] = reg.Epoch + 1
			if err := srv.SetEpoch(reg.Segment, epochs[y]); err != nil {
				return nil, err
			}
		}
		return epochs, nil
	}
	return f
}

// TestRebuildSlowSpare: a spare that answers, but slowly, does not slow
// every batch of the decode: a batch waits for it only a few times as
// long as for the sources, marks its chunks suspect when it was late (the
// sealed round checks them), and after spareLateMax late batches in a row
// the spare is down for the rest of the fill: it is asked in the first
// spareLateMax batches only, and no batch waits out its delay.
func TestRebuildSlowSpare(t *testing.T) {
	const k, m, shard, batches = 4, 2, 64 << 10, 6
	enc, shards, regions, conn, srv := codedShards(t, k, m, shard)
	ctx := t.Context()
	const n = shard / batches / moveChunkMin * moveChunkMin
	f := decodeFill(enc, k, m, 1, []int{1}, n, conn, regions, srv)
	slow := &slowConn{Conn: conn, delay: time.Second}
	f.spares[0].conn = slow
	buf := make([]byte, n)
	for b := range int64(batches) {
		batch := [][2]int64{{b * n, (b + 1) * n}}
		require.NoError(t, f.decode(ctx, buf, batch))
		checkSpans(t, shards[1], buf, batch)
	}
	require.True(t, f.down[0].Load(), "the slow spare is not down")
	require.EqualValues(t, spareLateMax, slow.calls.Load(), "batches that asked the slow spare")
	require.Zero(t, slow.answered.Load(), "batches that waited out the slow spare's %v", slow.delay)
	want, _ := rangeChunks(0, spareLateMax*n, f.m.chunk)
	require.Equal(t, want, f.suspect[:len(want)], "the batches the slow spare was late for are suspect")
}

// slowConn is a connection that answers each call after delay (or the
// call's end), counting the calls and those it answered.
type slowConn struct {
	rdma.Conn
	delay           time.Duration
	calls, answered atomic.Int32
}

func (c *slowConn) Do(ctx context.Context, ops ...*rdma.Op) error {
	c.calls.Add(1)
	select {
	case <-time.After(c.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	c.answered.Add(1)
	return c.Conn.Do(ctx, ops...)
}

// failWrites is a connection whose writes fail.
type failWrites struct{ rdma.Conn }

func (c failWrites) Do(ctx context.Context, ops ...*rdma.Op) error {
	if slices.ContainsFunc(ops, func(o *rdma.Op) bool { return o.Kind == rdma.OpWrite }) {
		return fmt.Errorf("a write refused by the test: %w", rdma.ErrClosed)
	}
	return c.Conn.Do(ctx, ops...)
}

// checkSpans checks that buf holds want's bytes of the batch's spans, in
// turn.
func checkSpans(t *testing.T, want, buf []byte, batch [][2]int64) {
	t.Helper()
	off := int64(0)
	for _, s := range batch {
		require.Equal(t, want[s[0]:s[1]], buf[off:off+s[1]-s[0]], "span %v", s)
		off += s[1] - s[0]
	}
}
