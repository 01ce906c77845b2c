package tcp

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"log/slog"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"
	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/faultproxy"
	"github.com/farmem/farmem/internal/syncbuf"
	"github.com/farmem/farmem/rdma"
)

// fwdConfig is the server configuration of the forwarding tests: no busy
// polling (the test hosts are small and shared), quiet logs, and a
// ForwardTimeout that a loaded -race run does not trip by accident.
func fwdConfig() ServerConfig {
	return ServerConfig{BusyPoll: -1, ForwardTimeout: 10 * time.Second}
}

// home is one in-process data plane exporting one segment: a copy or a
// shard of a redundant segment.
type home struct {
	srv *testServer
	mem []byte
	r   rdma.Region
}

// startHomes starts n data planes, each exporting segment seg of size
// bytes.
func startHomes(t testing.TB, n int, seg uint64, size int) []*home {
	t.Helper()
	return homesWith(t, fwdConfig(), n, seg, size)
}

// homesWith is startHomes with the servers configured by cfg.
func homesWith(t testing.TB, cfg ServerConfig, n int, seg uint64, size int) []*home {
	t.Helper()
	hs := make([]*home, n)
	for i := range hs {
		srv := startServer(t, cfg)
		mem, r := srv.export(t, seg, size)
		hs[i] = &home{srv: srv, mem: mem, r: r}
	}
	return hs
}

// failures records OnFail calls; with refuse set it answers them with
// that error (the loss could not be recorded).
type failures struct {
	mu     sync.Mutex
	calls  map[int]int
	errs   []error
	refuse error
}

func (f *failures) onFail(target int, err error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = make(map[int]int)
	}
	f.calls[target]++
	f.errs = append(f.errs, err)
	return f.refuse
}

func (f *failures) count() map[int]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.calls)
}

// targets dials every home of hs as the forwarding side does and returns
// them as forward targets.
func targets(t testing.TB, hs []*home, opts ...Option) []ForwardTarget {
	t.Helper()
	ts := make([]ForwardTarget, len(hs))
	for i, h := range hs {
		ts[i] = ForwardTarget{Conn: dial(t, h.srv.addr, append([]Option{WithConns(2), WithBusyPoll(-1)}, opts...)...), Region: h.r}
	}
	return ts
}

// replicated starts n homes of a segment of size bytes, the first
// forwarding copies to the others and reporting failures to fails. The
// servers take cfg over fwdConfig's fields where set, and every client
// opts.
func replicated(t *testing.T, cfg ServerConfig, opts []Option, n, size int, fails *failures) []*home {
	t.Helper()
	fc := fwdConfig()
	fc.TLS = cfg.TLS
	hs := homesWith(t, fc, n, 1, size)
	require.NoError(t, hs[0].srv.Forward(1, &Forwarding{Mode: ForwardCopy, Targets: targets(t, hs[1:], opts...), OnFail: fails.onFail}))
	return hs
}

// TestForwardCopy: four clients write, CAS and FADD a primary with two
// backups concurrently, on overlapping bytes; afterwards both backups hold
// exactly the primary's bytes, and the counter every client added to holds
// the number of acknowledged adds. In plaintext and over TLS (forwarded
// ops' answers are written from other goroutines than the connection's).
func TestForwardCopy(t *testing.T) { overBoth(t, forwardCopy) }

func forwardCopy(t *testing.T, cfg ServerConfig, opts []Option) {
	const size = 64 << 10
	var fails failures
	hs := replicated(t, cfg, opts, 3, size, &fails)
	p := hs[0]

	const workers, rounds = 4, 300
	var adds atomic.Uint64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := dial(t, p.srv.addr, append([]Option{WithConns(2), WithBusyPoll(-1)}, opts...)...)
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			buf := make([]byte, 4096)
			for range rounds {
				switch rng.IntN(4) {
				case 0, 1:
					n := 1 + rng.IntN(len(buf))
					off := 64 + rng.IntN(size-64-n)
					for i := range buf[:n] {
						buf[i] = byte(rng.Uint32())
					}
					if err := cl.Write(t.Context(), p.r, int64(off), buf[:n]); err != nil {
						t.Error(err)
						return
					}
				case 2:
					if _, err := cl.FetchAdd64(t.Context(), p.r, 0, 1); err != nil {
						t.Error(err)
						return
					}
					adds.Add(1)
				case 3:
					off := int64(8 * (1 + rng.IntN(7)))
					prev, err := cl.FetchAdd64(t.Context(), p.r, off, 0)
					if err == nil {
						_, _, err = cl.CompareAndSwap64(t.Context(), p.r, off, prev, prev*31+uint64(w))
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	within(t, "forwarding writers", wg.Wait)
	require.Empty(t, fails.count(), "no target failed: %v", fails.errs)
	require.Equal(t, adds.Load(), binary.NativeEndian.Uint64(p.mem[0:8]), "every acknowledged add counted once")
	for i, b := range hs[1:] {
		require.True(t, equalBytes(p.mem, b.mem), "backup %d differs from the primary", i)
	}
}

// writeLoad starts writers clients of the data plane at addr, each
// writing count blocks of block random bytes at random offsets of r (size
// bytes), one at a time, sending a write again while it answers MOVED (a
// sealed switch-over). acked counts the acknowledged writes; the returned
// wait waits for the clients (failing the test if they hang).
func writeLoad(t *testing.T, addr string, r rdma.Region, size, block, writers, count int, acked *atomic.Int64) (wait func()) {
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := dial(t, addr, WithConns(1), WithBusyPoll(-1))
			rng := rand.New(rand.NewPCG(uint64(w), uint64(block)))
			buf := make([]byte, block)
			for range count {
				off := rng.IntN(size - block)
				for j := range buf {
					buf[j] = byte(rng.Uint32())
				}
				err := cl.Write(t.Context(), r, int64(off), buf)
				for errors.Is(err, rdma.ErrMoved) {
					time.Sleep(100 * time.Microsecond)
					err = cl.Write(t.Context(), r, int64(off), buf)
				}
				if err != nil {
					t.Error(err)
					return
				}
				acked.Add(1)
			}
		}()
	}
	return func() { within(t, "writers", wg.Wait) }
}

// equalBytes compares without printing megabytes on failure.
func equalBytes(a, b []byte) bool { return string(a) == string(b) }

// TestXor: XOR combines the payload with the segment's bytes, exactly
// once with a ticket even when the ticket is posted again.
func TestXor(t *testing.T) {
	srv := startServer(t, fwdConfig())
	mem, r := srv.export(t, 1, 8192)
	for i := range mem {
		mem[i] = byte(i)
	}
	sess := rdma.NewSession()
	cl := dial(t, srv.addr, WithSession(sess), WithBusyPoll(-1))
	x := make([]byte, 1000)
	for i := range x {
		x[i] = 0xA5
	}
	// Unaligned at both ends: the bytes around it stay.
	require.NoError(t, cl.Xor(t.Context(), r, 3, x))
	for i := range 1010 {
		want := byte(i)
		if i >= 3 && i < 1003 {
			want ^= 0xA5
		}
		require.Equal(t, want, mem[i], "byte %d", i)
	}

	tk, err := sess.Acquire(t.Context())
	require.NoError(t, err)
	op := &rdma.Op{Kind: rdma.OpXor, Region: r, Offset: 5000, Buf: []byte{1, 2, 3}, Once: tk}
	require.NoError(t, cl.Do(t.Context(), op))
	// The same ticket again (as after a lost answer): answered, not applied.
	require.NoError(t, cl.Do(t.Context(), op))
	tk.Release()
	require.Equal(t, []byte{byte(5000%256) ^ 1, byte(5001%256) ^ 2, byte(5002%256) ^ 3}, mem[5000:5003])

	// Out of range and via Do, split past MaxPayload is not needed here.
	err = cl.Xor(t.Context(), r, 8190, []byte{1, 2, 3})
	require.ErrorIs(t, err, rdma.ErrOutOfRange)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, cl.Do(ctx, &rdma.Op{Kind: rdma.OpXor, Region: r, Offset: 0, Buf: []byte{0xFF}}))
	require.Equal(t, byte(0xFF), mem[0])
}

// stripe starts the k data and m parity homes of an erasure-coded
// segment, each exporting shard bytes as segment seg, and sets every data
// home forwarding its changes as parity to the parity homes.
func stripe(t *testing.T, k, m, shard int, fails *failures, opts ...Option) (data, parity []*home) {
	t.Helper()
	hs := startHomes(t, k+m, 1, shard)
	data, parity = hs[:k], hs[k:]
	for i, d := range data {
		require.NoError(t, d.srv.Forward(1, &Forwarding{
			Mode: ForwardParity, Shard: i, DataShards: k, ParityShards: m,
			Targets: targets(t, parity, opts...), OnFail: fails.onFail,
		}))
	}
	return data, parity
}

// requireParity checks that the parity homes hold the Reed-Solomon parity
// of the data homes, and that a data shard reconstructed from the others
// and the parity is that shard.
func requireParity(t *testing.T, data, parity []*home) {
	t.Helper()
	enc, err := reedsolomon.New(len(data), len(parity))
	require.NoError(t, err)
	shards := make([][]byte, 0, len(data)+len(parity))
	for _, d := range data {
		shards = append(shards, slices.Clone(d.mem))
	}
	for range parity {
		shards = append(shards, make([]byte, len(data[0].mem)))
	}
	require.NoError(t, enc.Encode(shards))
	for j, p := range parity {
		require.True(t, equalBytes(shards[len(data)+j], p.mem), "parity shard %d is not the parity of the data shards", j)
	}
	for i := range data {
		got := make([][]byte, len(shards))
		for j, s := range shards {
			if j != i {
				got[j] = slices.Clone(s)
			}
		}
		require.NoError(t, enc.ReconstructData(got))
		require.True(t, equalBytes(data[i].mem, got[i]), "data shard %d reconstructed from the others and the parity differs", i)
	}
}

// TestForwardParity: the four data homes of an erasure-coded (4+2) segment
// take random writes and adds from two clients each, concurrently; every
// data home XORs its parity deltas into both parity homes, which then
// hold the parity of the data, and a lost data shard is rebuilt from the
// others and the parity.
func TestForwardParity(t *testing.T) {
	const k, m, shard = 4, 2, 32 << 10
	var fails failures
	data, parity := stripe(t, k, m, shard, &fails)
	var wg sync.WaitGroup
	for i, d := range data {
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cl := dial(t, d.srv.addr, WithConns(1), WithBusyPoll(-1))
				rng := rand.New(rand.NewPCG(uint64(i), uint64(w)))
				buf := make([]byte, 4096)
				for range 150 {
					if rng.IntN(4) == 0 {
						if _, err := cl.FetchAdd64(t.Context(), d.r, int64(8*rng.IntN(shard/8)), rng.Uint64()); err != nil {
							t.Error(err)
							return
						}
						continue
					}
					n := 1 + rng.IntN(len(buf))
					off := rng.IntN(shard - n)
					for j := range buf[:n] {
						buf[j] = byte(rng.Uint32())
					}
					if err := cl.Write(t.Context(), d.r, int64(off), buf[:n]); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	within(t, "parity writers", wg.Wait)
	require.Empty(t, fails.count(), "no target failed: %v", fails.errs)
	requireParity(t, data, parity)
}

// TestForwardParityEmptyWrite: empty writes to an erasure-coded segment's
// data home are answered OK and forwarded as empty changes, with no
// warning: a client can send them as fast as the network allows, and the
// parity of an empty change, which the code refuses to compute, is empty.
func TestForwardParityEmptyWrite(t *testing.T) {
	const k, m, shard = 2, 1, 4096
	var logs syncbuf.Buffer
	cfg := fwdConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var fails failures
	hs := homesWith(t, cfg, k+m, 1, shard)
	data, parity := hs[:k], hs[k:]
	for i, d := range data {
		require.NoError(t, d.srv.Forward(1, &Forwarding{
			Mode: ForwardParity, Shard: i, DataShards: k, ParityShards: m,
			Targets: targets(t, parity), OnFail: fails.onFail,
		}))
	}
	cl := dial(t, data[0].srv.addr, WithConns(1), WithBusyPoll(-1))
	for i := range 100 {
		require.NoError(t, cl.Write(t.Context(), data[0].r, int64(i), nil))
	}
	require.NoError(t, cl.Write(t.Context(), data[0].r, 10, []byte{1, 2, 3}))
	require.Empty(t, fails.count(), "no target failed: %v", fails.errs)
	require.Empty(t, logs.String())
	requireParity(t, data, parity)
}

// failingCode is a Reed-Solomon code whose parity of a change fails.
type failingCode struct{ reedsolomon.Encoder }

func (failingCode) EncodeIdx([]byte, int, [][]byte) error { return errors.New("the code failed") }

// TestForwardParityCodeFails: were the parity of a change not computed,
// the parity homes would get a zero delta and keep a parity the data no
// longer matches, silently; they are failed as targets that missed the
// write instead, each reported to OnFail once.
func TestForwardParityCodeFails(t *testing.T) {
	const k, m, shard = 2, 2, 4096
	var fails failures
	hs := homesWith(t, fwdConfig(), k+m, 1, shard)
	data, parity := hs[:k], hs[k:]
	require.NoError(t, data[0].srv.Forward(1, &Forwarding{
		Mode: ForwardParity, Shard: 0, DataShards: k, ParityShards: m,
		Targets: targets(t, parity), OnFail: fails.onFail,
	}))
	fw := (*data[0].srv.exports.Load())[1].fwd.Load()
	fw.enc = failingCode{fw.enc}
	cl := dial(t, data[0].srv.addr, WithConns(1), WithBusyPoll(-1))
	require.NoError(t, cl.Write(t.Context(), data[0].r, 10, []byte{1, 2, 3}))
	require.Equal(t, map[int]int{0: 1, 1: 1}, fails.count(), "both parity homes failed, once each")
	for _, err := range fails.errs {
		require.ErrorContains(t, err, "parity of the change")
	}
}

// TestForwardTargetKilled: a backup's data plane dies while clients write
// the primary: the primary reports that target to OnFail once, goes on
// answering every op OK, and the surviving backup holds the primary's
// bytes.
func TestForwardTargetKilled(t *testing.T) {
	const size = 32 << 10
	var fails failures
	hs := replicated(t, ServerConfig{}, nil, 3, size, &fails)
	p := hs[0]
	var acked atomic.Int64
	wait := writeLoad(t, p.srv.addr, p.r, size, 2048, 3, 400, &acked)
	for acked.Load() < 200 {
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, hs[2].srv.Close())
	wait()
	require.Equal(t, map[int]int{1: 1}, fails.count(), "target 1 (the killed backup) reported once")
	require.ErrorIs(t, fails.errs[0], rdma.ErrClosed)
	require.True(t, equalBytes(p.mem, hs[1].mem), "the surviving backup holds the primary's bytes")
}

// TestForwardUnrecordedLoss: a backup dies and OnFail cannot record the
// loss (the daemon that must hear of it does not answer): the write that
// found the backup gone and every later one are applied at the primary
// but answered INDETERMINATE, never OK, since a copy that missed them may
// be promoted; once forwarding is set again without the dead backup,
// writes are acknowledged again.
func TestForwardUnrecordedLoss(t *testing.T) {
	const size = 8 << 10
	fails := failures{refuse: errors.New("the origin does not answer")}
	hs := replicated(t, ServerConfig{}, nil, 3, size, &fails)
	p := hs[0]
	c := dial(t, p.srv.addr)
	ctx := t.Context()
	require.NoError(t, c.Write(ctx, p.r, 0, []byte("acknowledged")))
	require.NoError(t, hs[2].srv.Close())
	err := c.Write(ctx, p.r, 0, []byte("found target 2 gone"))
	require.ErrorIs(t, err, rdma.ErrIndeterminate)
	require.Equal(t, "found target 2 gone", string(p.mem[:19]), "applied at the primary")
	err = c.Write(ctx, p.r, 100, []byte("skips it"))
	require.ErrorIs(t, err, rdma.ErrIndeterminate, "a write that skips the unrecorded target is not acknowledged either")
	_, err = c.FetchAdd64(ctx, p.r, 1024, 1)
	require.ErrorIs(t, err, rdma.ErrIndeterminate)
	require.Equal(t, map[int]int{1: 1}, fails.count(), "target 1 (the closed backup) reported once")

	require.NoError(t, p.srv.Forward(1, &Forwarding{Mode: ForwardCopy, Targets: targets(t, hs[1:2]), OnFail: fails.onFail}))
	require.NoError(t, c.Write(ctx, p.r, 200, []byte("after forwarding is set again")))
	require.Equal(t, p.mem[200:229], hs[1].mem[200:229], "the live backup holds it")
}

// TestForwardLateDeltaFenced: a forwarded XOR that its target has not
// answered within ForwardTimeout, and whose loss OnFail could not record,
// is not withdrawn: held on the way (a proxy stalls the link), it reaches
// the target after the client's op was answered INDETERMINATE. A target
// whose epoch was raised meanwhile, as a daemon does before it rewrites a
// parity shard (pool: rebuildFill.repair), refuses it, since it carries
// the old one; without the raise it applies it.
func TestForwardLateDeltaFenced(t *testing.T) {
	const k, m, shard = 2, 1, 4096
	cfg := fwdConfig()
	cfg.ForwardTimeout = 200 * time.Millisecond
	hs := homesWith(t, cfg, k+m, 1, shard)
	data, parity := hs[:k], hs[k]
	var hold atomic.Bool
	gate := make(chan struct{})
	px, err := faultproxy.Start(faultproxy.Config{
		Target: parity.srv.addr,
		Record: func(fromClient bool, _ []byte) {
			if fromClient && hold.Load() {
				<-gate
			}
		},
	})
	require.NoError(t, err)
	defer px.Close()
	// One connection: a read sent after the late XOR is taken after it.
	tgt := dial(t, px.Addr(), WithConns(1), WithBusyPoll(-1))
	fails := failures{refuse: errors.New("the origin does not answer")}
	require.NoError(t, data[0].srv.Forward(1, &Forwarding{
		Mode: ForwardParity, Shard: 0, DataShards: k, ParityShards: m,
		Targets: []ForwardTarget{{Conn: tgt, Region: parity.r}}, OnFail: fails.onFail,
	}))
	ctx := t.Context()
	read := func() []byte {
		b := make([]byte, shard)
		require.NoError(t, tgt.Do(ctx, &rdma.Op{Kind: rdma.OpRead, Region: parity.r, Buf: b}))
		return b
	}
	before := read()

	hold.Store(true)
	c := dial(t, data[0].srv.addr)
	require.ErrorIs(t, c.Write(ctx, data[0].r, 0, []byte("a write whose delta is late")), rdma.ErrIndeterminate)
	require.Equal(t, map[int]int{0: 1}, fails.count(), "the target's loss was reported")
	require.NoError(t, parity.srv.SetEpoch(1, parity.r.Epoch+1))
	hold.Store(false)
	close(gate)
	require.Equal(t, before, read(), "the late delta was applied under the raised epoch")
}

// TestForwardLinkRetry: the primary-to-target link loses the answers of
// forwarded XORs (a proxy cuts the connection after a budget of answer
// bytes, the requests having reached the target); the forwarder sends the
// unanswered ops again, in order and with RETRY, on the next connection,
// and the target applies each once: an XOR applied twice would cancel
// out, and the parity would not match.
func TestForwardLinkRetry(t *testing.T) {
	const k, m, shard = 2, 1, 16 << 10
	var fails failures
	hs := startHomes(t, k+m, 1, shard)
	data, parity := hs[:k], hs[k:]
	var cut atomic.Int32
	px, err := faultproxy.Start(faultproxy.Config{
		Target: parity[0].srv.addr,
		// The first two connections lose their answers after 40, early
		// in the session (its slots' first uses: see
		// TestSessionFreshOnAnyConnection).
		ReplyBudget: func() int {
			if cut.Add(1) <= 2 {
				return respHeaderSize * 40
			}
			return 0
		},
	})
	require.NoError(t, err)
	defer px.Close()
	tgt := dial(t, px.Addr(), WithConns(3), WithBusyPoll(-1))
	require.NoError(t, data[0].srv.Forward(1, &Forwarding{
		Mode: ForwardParity, Shard: 0, DataShards: k, ParityShards: m,
		Targets: []ForwardTarget{{Conn: tgt, Region: parity[0].r}}, OnFail: fails.onFail,
	}))
	var acked atomic.Int64
	writeLoad(t, data[0].srv.addr, data[0].r, shard, 512, 4, 300, &acked)()
	require.Empty(t, fails.count(), "the link moved to another connection instead of failing: %v", fails.errs)
	require.GreaterOrEqual(t, px.Kills(), int64(1), "the proxy cut the link")
	requireParity(t, data, parity)
}

// principalAt is an Identify whose credentials read "principal@home": each
// home issues a client its own credential for the same principal, as
// poold's delegated credentials do.
func principalAt(cred []byte, _ *x509.Certificate) (string, string, error) {
	p, _, ok := strings.Cut(string(cred), "@")
	if !ok {
		return "", "", errors.New("credential is not principal@home")
	}
	return p, "", nil
}

// failoverPair starts a primary and a backup whose servers name
// principals (principalAt), each exporting segment 1, the primary
// forwarding copies to the backup as principal "poold/a" over link and
// reporting failures to fails.
func failoverPair(t *testing.T, fails *failures) (prim, back *testServer, pr, br rdma.Region, bmem []byte, link *Client) {
	t.Helper()
	cfg := fwdConfig()
	cfg.Identify = principalAt
	prim, back = startServer(t, cfg), startServer(t, cfg)
	_, pr = prim.export(t, 1, 4096)
	bmem, br = back.export(t, 1, 4096)
	link = dial(t, back.addr, WithCredential([]byte("poold/a@b")), WithBusyPoll(-1))
	require.NoError(t, prim.Forward(1, &Forwarding{Mode: ForwardCopy, Targets: []ForwardTarget{{Conn: link, Region: br}}, OnFail: fails.onFail}))
	return prim, back, pr, br, bmem, link
}

// TestForwardFailoverExactlyOnce: a client's exactly-once FADD and CAS are
// applied at the primary and forwarded with their origin; the primary
// dies before the client has its answers, and the client sends both again
// with RETRY to the backup (promoted), with the credential the backup
// issued it and its own session: the backup answers from its reply cache
// what the primary answered, and applies neither a second time. A new op
// after the failover runs normally.
func TestForwardFailoverExactlyOnce(t *testing.T) {
	var fails failures
	prim, back, pr, br, bmem, _ := failoverPair(t, &fails)
	require.NoError(t, prim.Allow(1, []string{"app"}))
	require.NoError(t, back.Allow(1, []string{"app", "poold/a"}))
	require.NoError(t, back.AllowReaders(1, []string{"app"}))

	sess := rdma.NewSession()
	app := dial(t, prim.addr, WithCredential([]byte("app@a")), WithSession(sess), WithBusyPoll(-1))
	ctx := t.Context()
	require.NoError(t, app.Write(ctx, pr, 0, le.AppendUint64(nil, 40)))
	add := &rdma.Op{Kind: rdma.OpFetchAdd, Region: pr, Offset: 0, Delta: 2}
	cas := &rdma.Op{Kind: rdma.OpCompareAndSwap, Region: pr, Offset: 8, Old: 0, New: 7}
	for _, op := range []*rdma.Op{add, cas} {
		doOnce(t, app, sess, op)
	}
	require.EqualValues(t, 40, add.Prev)
	require.True(t, cas.Swapped)
	require.EqualValues(t, 42, le.Uint64(bmem[0:]), "the backup holds the add's result")
	require.EqualValues(t, 7, le.Uint64(bmem[8:]))

	// The primary dies; the client never saw the answers (as far as it
	// knows) and fails over. The origin promotes the backup: clients may
	// write it now.
	require.NoError(t, prim.Close())
	require.NoError(t, back.AllowReaders(1, nil))
	app2 := dial(t, back.addr, WithCredential([]byte("app@b")), WithSession(sess), WithBusyPoll(-1))
	for _, op := range []*rdma.Op{add, cas} {
		op.Region, op.Prev, op.Swapped = br, 0, false
		require.NoError(t, app2.Do(ctx, op), "the retry is answered from the reply cache")
		op.Once.Release()
	}
	require.EqualValues(t, 40, add.Prev, "the FADD's original answer")
	require.True(t, cas.Swapped, "the CAS's original answer, not the \"not swapped\" a second run gives")
	require.EqualValues(t, 42, le.Uint64(bmem[0:]), "the add applied once")
	require.EqualValues(t, 7, le.Uint64(bmem[8:]))

	prev, err := app2.FetchAdd64(ctx, br, 0, 1)
	require.NoError(t, err)
	require.EqualValues(t, 42, prev)
	require.EqualValues(t, 43, le.Uint64(bmem[0:]))
	require.Empty(t, fails.count())
}

// TestForwardFailoverUnforwardedSlot: the backup learnt the client's
// session from a forwarded op on one slot; the client's op on another
// slot was posted to the primary, which died before forwarding it (the
// op never reached the backup, so no surviving copy applied it). Its
// RETRY at the promoted backup runs, once. A backup that evicted a
// session, or that restored memory from before it started, cannot tell
// and answers such a retry INDETERMINATE.
func TestForwardFailoverUnforwardedSlot(t *testing.T) {
	for _, tc := range []struct {
		name   string
		forget func(back *testServer)
		want   error
	}{
		{"runs", func(*testServer) {}, nil},
		{"after ExportKey", func(back *testServer) {
			require.NoError(t, back.ExportKey(9, make([]byte, 4096), 1, rdma.Key{1}))
		}, rdma.ErrIndeterminate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fails failures
			prim, back, pr, br, bmem, _ := failoverPair(t, &fails)
			require.NoError(t, prim.Allow(1, []string{"app"}))
			require.NoError(t, back.Allow(1, []string{"app", "poold/a"}))
			tc.forget(back)

			sess := rdma.NewSession()
			app := dial(t, prim.addr, WithCredential([]byte("app@a")), WithSession(sess), WithBusyPoll(-1))
			ctx := t.Context()
			tk := doOnce(t, app, sess, &rdma.Op{Kind: rdma.OpFetchAdd, Region: pr, Delta: 1})
			tk.Release()
			require.EqualValues(t, 1, le.Uint64(bmem), "forwarded: the backup opened the client's session")

			lost, err := sess.Acquire(ctx)
			require.NoError(t, err)
			require.NotEqual(t, tk.Slot, lost.Slot)
			lost.Post() // sent to the primary, which died before forwarding it
			require.NoError(t, prim.Close())

			app2 := dial(t, back.addr, WithCredential([]byte("app@b")), WithSession(sess), WithBusyPoll(-1))
			retry := &rdma.Op{Kind: rdma.OpFetchAdd, Region: br, Delta: 1, Once: lost}
			err = app2.Do(ctx, retry)
			lost.Release()
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
				require.EqualValues(t, 1, le.Uint64(bmem), "not run")
				return
			}
			require.NoError(t, err)
			require.EqualValues(t, 1, retry.Prev)
			require.EqualValues(t, 2, le.Uint64(bmem), "the retry ran once")
			require.Empty(t, fails.count())
		})
	}
}

// TestSessionForgotByEviction: once the table evicted a session, a
// session an origin block opens starts with its history unknown.
func TestSessionForgotByEviction(t *testing.T) {
	tbl := newSessionTable(1, nil)
	a := sessionKey{name: "p:a", id: [sessionIDSize]byte{1}}
	b := sessionKey{name: "p:b", id: [sessionIDSize]byte{2}}
	require.True(t, tbl.openForwarded(a).slots[5].known, "nothing evicted yet")
	tbl.open(b, "", false) // evicts a
	require.False(t, tbl.openForwarded(a).slots[5].known, "a may have run ops here before its eviction")
}

// TestAllowReaders: a principal the segment names a reader may read it
// but not write, CAS, FADD or XOR it (ACCESS_DENIED), also when Allow
// names it too; one in Allow's set only writes as before; clearing the
// readers lifts the restriction.
func TestAllowReaders(t *testing.T) {
	cfg := fwdConfig()
	cfg.Identify = namedCreds
	s := startServer(t, cfg)
	mem, r := s.export(t, 1, 4096)
	require.NoError(t, s.Allow(1, []string{"primary", "both"}))
	require.NoError(t, s.AllowReaders(1, []string{"app", "both"}))
	ctx := t.Context()
	primary := dial(t, s.addr, WithCredential([]byte("primary")), WithBusyPoll(-1))
	require.NoError(t, primary.Write(ctx, r, 0, []byte("by the primary")))
	for _, name := range []string{"app", "both"} {
		cl := dial(t, s.addr, WithCredential([]byte(name)), WithBusyPoll(-1))
		buf := make([]byte, 14)
		require.NoError(t, cl.Read(ctx, r, 0, buf), name)
		require.Equal(t, "by the primary", string(buf))
		require.ErrorIs(t, cl.Write(ctx, r, 0, []byte("x")), rdma.ErrAccessDenied, name)
		require.ErrorIs(t, cl.Xor(ctx, r, 0, []byte("x")), rdma.ErrAccessDenied, name)
		_, err := cl.FetchAdd64(ctx, r, 16, 1)
		require.ErrorIs(t, err, rdma.ErrAccessDenied, name)
		_, _, err = cl.CompareAndSwap64(ctx, r, 16, 0, 1)
		require.ErrorIs(t, err, rdma.ErrAccessDenied, name)
	}
	require.Equal(t, "by the primary", string(mem[:14]))
	require.ErrorIs(t, s.AllowReaders(2, nil), rdma.ErrNotExported)

	require.NoError(t, s.AllowReaders(1, nil))
	both := dial(t, s.addr, WithCredential([]byte("both")), WithBusyPoll(-1))
	require.NoError(t, both.Write(ctx, r, 0, []byte("B")))
	app := dial(t, s.addr, WithCredential([]byte("app")), WithBusyPoll(-1))
	require.ErrorIs(t, app.Read(ctx, r, 0, make([]byte, 1)), rdma.ErrAccessDenied, "no longer a reader, and not in Allow's set")
}

// TestForwardedFrames: a forwarded op whose origin block is malformed is
// answered PROTOCOL and applies nothing, the connection staying usable;
// FORWARD on an atomic is UNSUPPORTED; a well-formed one is applied and
// its origin's answer kept.
func TestForwardedFrames(t *testing.T) {
	s := startServer(t, fwdConfig())
	mem, r := s.export(t, 1, 4096)
	nc := rawConn(t, s.addr)
	handshake(t, nc)
	send := func(id uint64, op uint8, flags uint8, org []byte, data []byte) respHeader {
		t.Helper()
		h := reqHeader{id: id, op: op, flags: reqFlagOnce | flags, slot: uint16(id), seq: 1, seg: 1, key: r.Key, epoch: 1, off: 64, length: uint32(len(data)), payloadLen: uint32(len(org) + len(data))}
		if op == opFADD {
			h.length, h.arg0 = 8, 1
		}
		_, err := nc.Write(append(append(requestFrame(t, &h), org...), data...))
		require.NoError(t, err)
		rh := readResponse(t, nc)
		require.Equal(t, id, rh.id)
		return rh
	}
	org := origin{key: sessionKey{name: "c:someone", id: [sessionIDSize]byte{7}}, slot: 5, seq: 3, value: 99}
	bad := appendOrigin(nil, &org)
	bad[33] = 1 // a reserved byte
	require.Equal(t, statusProtocol, send(1, opWrite, reqFlagForward, bad, []byte("abcd")).status)
	require.Equal(t, []byte{0, 0, 0, 0}, mem[64:68], "nothing applied")
	require.Equal(t, statusUnsupported, send(2, opFADD, reqFlagForward, nil, nil).status)
	require.Equal(t, statusOK, send(3, opXor, reqFlagForward, appendOrigin(nil, &org), []byte{1, 2, 3, 4}).status)
	require.Equal(t, []byte{1, 2, 3, 4}, mem[64:68])

	sess := s.sessions.open(org.key, "", true)
	sl := &sess.slots[org.slot]
	sl.mu.Lock()
	defer sl.mu.Unlock()
	require.True(t, sl.known)
	require.Equal(t, org.seq, sl.seq)
	require.EqualValues(t, 99, sl.value)
}

// TestForwardOnlyFromForwarders: a forwarded op's origin block names
// another session's slot and the answer its cache is to keep. From a
// connection whose principal ServerConfig.Forwarders refuses (a tenant,
// not a peer daemon) it is ACCESS_DENIED and changes nothing: neither the
// memory nor the named session, whose own op would otherwise be answered
// from the cache and never applied. An origin naming the sending
// connection's own session (whose slot the op holds while it runs), or
// another forwarder's (whose op may hold its slot and name the sender's),
// is PROTOCOL, answered at once instead of waiting forever.
func TestForwardOnlyFromForwarders(t *testing.T) {
	cfg := fwdConfig()
	cfg.Identify = func(cred []byte, _ *x509.Certificate) (string, string, error) { return string(cred), "", nil }
	cfg.Forwarders = func(p string) bool { return strings.HasPrefix(p, "poold/") }
	s := startServer(t, cfg)
	mem, r := s.export(t, 1, 4096)
	as := func(cred string, session byte) func(org origin, data []byte) respHeader {
		nc := rawConn(t, s.addr)
		_, err := nc.Write(appendHello(nil, hello{version: Version, cred: []byte(cred), session: [sessionIDSize]byte{session}}))
		require.NoError(t, err)
		require.Equal(t, replyAccept, readReply(t, nc).code)
		id := uint64(0)
		return func(org origin, data []byte) respHeader {
			id++
			ob := appendOrigin(nil, &org)
			h := reqHeader{id: id, op: opWrite, flags: reqFlagOnce | reqFlagForward, slot: 5, seq: uint32(id), seg: 1, key: r.Key, epoch: 1, off: 64, length: uint32(len(data)), payloadLen: uint32(len(ob) + len(data))}
			_, err := nc.Write(append(append(requestFrame(t, &h), ob...), data...))
			require.NoError(t, err)
			return readResponse(t, nc)
		}
	}
	bob := origin{key: sessionKey{name: "p:bob", id: [sessionIDSize]byte{9}}, slot: 5, seq: 1, value: 7}

	alice := as("alice", 1)
	require.Equal(t, statusAccessDenied, alice(bob, []byte("evil")).status)
	require.Equal(t, []byte{0, 0, 0, 0}, mem[64:68], "nothing applied")
	sl := &s.sessions.open(bob.key, "", true).slots[bob.slot]
	sl.mu.Lock()
	require.False(t, sl.known, "bob's slot holds no answer alice made up")
	sl.mu.Unlock()

	peer := as("poold/a", 2)
	self := origin{key: sessionKey{name: "p:poold/a", id: [sessionIDSize]byte{2}}, slot: 5, seq: 1}
	require.Equal(t, statusProtocol, peer(self, []byte("self")).status, "an origin naming the sender's own session")
	// Two forwarders' ops naming each other's sessions would each hold
	// its own slot and wait for the other's: an origin never names a
	// forwarder's session.
	other := origin{key: sessionKey{name: "p:poold/b", id: [sessionIDSize]byte{3}}, slot: 5, seq: 1}
	require.Equal(t, statusProtocol, peer(other, []byte("peer")).status, "an origin naming another forwarder's session")
	require.Equal(t, []byte{0, 0, 0, 0}, mem[64:68], "nothing applied")
	require.Equal(t, statusOK, peer(bob, []byte("copy")).status)
	require.Equal(t, []byte("copy"), mem[64:68])
	sl.mu.Lock()
	defer sl.mu.Unlock()
	require.True(t, sl.known, "a peer's forwarded op keeps its origin's answer")
	require.EqualValues(t, 7, sl.value)
}

// TestForwardAddTarget: the rebuild's switch-over adds a target while
// clients write: Seal waits out the writes in flight (forwarded ones until
// their targets acknowledged), the new copy takes the sealed bytes,
// Forward adds it, and Unseal lets the writers go on; afterwards every
// copy holds the primary's bytes. Sealed writes answer MOVED, which the
// writers here simply send again.
func TestForwardAddTarget(t *testing.T) {
	const size = 32 << 10
	hs := startHomes(t, 3, 1, size)
	p, old, added := hs[0], hs[1], hs[2]
	var fails failures
	ts := targets(t, []*home{old, added})
	require.NoError(t, p.srv.Forward(1, &Forwarding{Mode: ForwardCopy, Targets: ts[:1], OnFail: fails.onFail}))
	var acked atomic.Int64
	wait := writeLoad(t, p.srv.addr, p.r, size, 1024, 3, 300, &acked)
	for acked.Load() < 150 {
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, p.srv.Seal(1, ""))
	copy(added.mem, p.mem) // the rebuild's last copy round
	require.NoError(t, p.srv.Forward(1, &Forwarding{Mode: ForwardCopy, Targets: ts, OnFail: fails.onFail}))
	require.NoError(t, p.srv.Unseal(1))
	wait()
	require.Empty(t, fails.count(), "%v", fails.errs)
	require.True(t, equalBytes(p.mem, old.mem), "the old backup holds the primary's bytes")
	require.True(t, equalBytes(p.mem, added.mem), "the added backup holds the primary's bytes")
}

// TestForwardParityLostTarget: a parity shard lost before forwarding
// starts (nil Conn) is skipped, and its index still counts: the other
// parity shard gets its own parity, not the lost one's.
func TestForwardParityLostTarget(t *testing.T) {
	const k, m, shard = 2, 2, 8 << 10
	hs := startHomes(t, k+m, 1, shard)
	data, parity := hs[:k], hs[k:]
	ts := targets(t, parity)
	ts[0].Conn = nil
	var fails failures
	require.NoError(t, data[1].srv.Forward(1, &Forwarding{Mode: ForwardParity, Shard: 1, DataShards: k, ParityShards: m, Targets: ts, OnFail: fails.onFail}))
	var acked atomic.Int64
	writeLoad(t, data[1].srv.addr, data[1].r, shard, 700, 2, 50, &acked)()
	require.Empty(t, fails.count(), "a target lost before is not reported: %v", fails.errs)
	enc, err := reedsolomon.New(k, m)
	require.NoError(t, err)
	shards := [][]byte{slices.Clone(data[0].mem), slices.Clone(data[1].mem), make([]byte, shard), make([]byte, shard)}
	require.NoError(t, enc.Encode(shards))
	require.True(t, equalBytes(shards[3], parity[1].mem), "parity shard 1 holds its parity")
	require.True(t, equalBytes(make([]byte, shard), parity[0].mem), "the lost parity shard got nothing")
}

// hungPair starts a primary exporting segment 1 (4 KiB) that forwards
// copies, with forwardTimeout and onFail, to a target whose connection's
// goroutine is held once held is set, until release is called (or the
// test ends).
func hungPair(t *testing.T, forwardTimeout time.Duration, onFail func(int, error) error) (prim *testServer, pr rdma.Region, held *atomic.Bool, release func()) {
	released := make(chan struct{})
	release = sync.OnceFunc(func() { close(released) })
	held = new(atomic.Bool)
	hcfg := fwdConfig()
	hcfg.Observe = func(Observation) {
		if held.Load() {
			<-released
		}
	}
	hung := startServer(t, hcfg)
	_, hr := hung.export(t, 1, 4096)
	t.Cleanup(release) // before the servers close

	cfg := fwdConfig()
	cfg.ForwardTimeout = forwardTimeout
	prim = startServer(t, cfg)
	_, pr = prim.export(t, 1, 4096)
	link := dial(t, hung.addr, WithConns(1), WithBusyPoll(-1))
	require.NoError(t, prim.Forward(1, &Forwarding{Mode: ForwardCopy, Targets: []ForwardTarget{{Conn: link, Region: hr}}, OnFail: onFail}))
	return prim, pr, held, release
}

// TestForwardHungTarget: a target that stops answering (its connection's
// goroutine is held) is reported to OnFail once ForwardTimeout has passed,
// and the client's write is answered OK; later writes skip it.
func TestForwardHungTarget(t *testing.T) {
	var fails failures
	prim, pr, held, _ := hungPair(t, 200*time.Millisecond, fails.onFail)
	cl := dial(t, prim.addr, WithBusyPoll(-1))
	require.NoError(t, cl.Write(t.Context(), pr, 0, []byte("answered")))
	require.Empty(t, fails.count())

	held.Store(true)
	require.NoError(t, cl.Write(t.Context(), pr, 0, []byte("held")), "answered OK without the hung target")
	require.Equal(t, map[int]int{0: 1}, fails.count())
	require.ErrorIs(t, fails.errs[0], context.DeadlineExceeded)
	require.NoError(t, cl.Write(t.Context(), pr, 0, []byte("skipped")))
	require.Equal(t, map[int]int{0: 1}, fails.count(), "reported once")
}

// TestStopForwardWaitsApart: StopForward returns at once while a write
// forwarded to a target that does not answer is in flight; its wait
// returns once the write was answered, as does a Forward set meanwhile,
// which waits for the stopped forwarding's ops too.
func TestStopForwardWaitsApart(t *testing.T) {
	prim, pr, held, release := hungPair(t, time.Hour, func(int, error) error { return nil })
	cl := dial(t, prim.addr, WithBusyPoll(-1))
	require.NoError(t, cl.Write(t.Context(), pr, 0, []byte("answered")))
	held.Store(true)
	wrote := make(chan error, 1)
	go func() { wrote <- cl.Write(t.Context(), pr, 0, []byte("in flight")) }()
	e := prim.lookup(1)
	// The write is forwarded once its range waits to settle.
	require.Eventually(t, func() bool { return e.nUnsettled.Load() > 0 }, 20*time.Second, time.Millisecond, "the write is forwarded")

	var wait func()
	within(t, "StopForward while a forwarded write is in flight", func() {
		var err error
		wait, err = prim.StopForward(1)
		require.NoError(t, err)
	})
	waited, reset := make(chan struct{}), make(chan error, 1)
	go func() { wait(); close(waited) }()
	go func() { reset <- prim.Forward(1, nil) }()
	select {
	case <-waited:
		t.Fatal("the stop's wait returned while its forwarded write was in flight")
	case err := <-reset:
		t.Fatalf("a Forward set after the stop returned (%v) while the stopped forwarding's write was in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	release()
	within(t, "the stop's wait once the target answers", func() { <-waited })
	within(t, "the Forward set meanwhile", func() { require.NoError(t, <-reset) })
	require.NoError(t, <-wrote)
	_, err := prim.StopForward(2)
	require.ErrorIs(t, err, rdma.ErrNotExported)
}

// TestReadWaitsForForward: a read at the primary that overlaps a write
// whose forward has not settled (its target hung, and its loss not yet
// recorded: OnFail is held) waits until it has, so that no reader sees a
// write that a failover to the target could still lose; once OnFail has
// returned it reads the write. A read of other bytes meanwhile does not
// wait.
func TestReadWaitsForForward(t *testing.T) {
	inFail, letFail := make(chan struct{}), make(chan struct{})
	var failed atomic.Bool
	onFail := func(int, error) error {
		close(inFail)
		<-letFail
		failed.Store(true)
		return nil
	}
	prim, pr, held, _ := hungPair(t, 100*time.Millisecond, onFail)
	cl := dial(t, prim.addr, WithBusyPoll(-1))
	require.NoError(t, cl.Write(t.Context(), pr, 0, []byte("old!")))

	held.Store(true)
	wrote := make(chan error, 1)
	go func() { wrote <- cl.Write(t.Context(), pr, 0, []byte("new!")) }()
	<-inFail // applied at the primary, the target timed out, its loss not yet recorded
	reader := dial(t, prim.addr, WithBusyPoll(-1))
	other := make([]byte, 4)
	require.NoError(t, reader.Read(t.Context(), pr, 100, other), "a read of other bytes does not wait")
	type got struct {
		b      []byte
		failed bool
		err    error
	}
	read := make(chan got, 1)
	go func() {
		b := make([]byte, 4)
		err := reader.Read(t.Context(), pr, 0, b)
		read <- got{b, failed.Load(), err}
	}()
	time.Sleep(100 * time.Millisecond) // time for a read that does not wait to come back
	close(letFail)
	g := <-read
	require.NoError(t, g.err)
	require.True(t, g.failed, "the read came back with %q before the write's forward settled", g.b)
	require.Equal(t, "new!", string(g.b))
	require.NoError(t, <-wrote)
}

// TestForwardRefusesBadSettings: what Forward refuses, with which error.
func TestForwardRefusesBadSettings(t *testing.T) {
	s := startServer(t, fwdConfig())
	_, r := s.export(t, 1, 4096)
	other := startServer(t, fwdConfig())
	link := dial(t, other.addr, WithBusyPoll(-1))
	tgt := []ForwardTarget{{Conn: link, Region: r}}
	for _, tc := range []struct {
		name string
		f    Forwarding
		want error
	}{
		{"parity without a code", Forwarding{Mode: ForwardParity, Targets: tgt}, errs.ErrInvalid},
		{"shard past the data shards", Forwarding{Mode: ForwardParity, Shard: 4, DataShards: 4, ParityShards: 1, Targets: tgt}, errs.ErrInvalid},
		{"fewer targets than parity shards", Forwarding{Mode: ForwardParity, DataShards: 4, ParityShards: 2, Targets: tgt}, errs.ErrInvalid},
		{"more shards than the code takes", Forwarding{Mode: ForwardParity, DataShards: 300, ParityShards: 1, Targets: tgt}, errs.ErrInvalid},
		{"unknown mode", Forwarding{Mode: 7, Targets: tgt}, errs.ErrInvalid},
		{"a target that is not a tcp Client", Forwarding{Mode: ForwardCopy, Targets: []ForwardTarget{{Conn: notTCP{}, Region: r}}}, rdma.ErrNotSupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, s.Forward(1, &tc.f), tc.want)
		})
	}
	require.ErrorIs(t, s.Forward(2, &Forwarding{Targets: tgt}), rdma.ErrNotExported)
	require.NoError(t, s.Forward(1, nil))
}

// notTCP is an rdma.Conn of another transport.
type notTCP struct{ rdma.Conn }

// TestForwardPipelined: one Do of many writes and reads on a forwarding
// segment over one connection: the reads are answered at once, the writes
// once the backup acknowledged, so answers come out of order; each
// matches its op, and a read sees the writes sent before it on the
// connection (the primary applied them before it read).
func TestForwardPipelined(t *testing.T) {
	var fails failures
	hs := replicated(t, ServerConfig{}, nil, 2, 64<<10, &fails)
	p := hs[0]
	cl := dial(t, p.srv.addr, WithConns(1), WithBusyPoll(-1))
	var ops []*rdma.Op
	for i := range 64 {
		blk := bytes.Repeat([]byte{byte(i + 1)}, 512)
		ops = append(ops,
			&rdma.Op{Kind: rdma.OpWrite, Region: p.r, Offset: int64(i * 1024), Buf: blk},
			&rdma.Op{Kind: rdma.OpRead, Region: p.r, Offset: int64(i * 1024), Buf: make([]byte, 512)},
			&rdma.Op{Kind: rdma.OpFetchAdd, Region: p.r, Offset: int64(i*1024 + 512), Delta: uint64(i)},
		)
	}
	require.NoError(t, cl.Do(t.Context(), ops...))
	for i := range 64 {
		require.Equal(t, ops[3*i].Buf, ops[3*i+1].Buf, "read %d sees the write before it", i)
		require.Zero(t, ops[3*i+2].Prev)
	}
	require.Empty(t, fails.count())
	require.True(t, equalBytes(p.mem, hs[1].mem))
}

// TestForwardFailoverUnderLoad: clients add to one counter at a primary
// with one backup, each op with an exactly-once ticket, when the primary
// dies: every op whose answer was lost is sent again with RETRY to the
// backup (promoted), which answers from the forwarded replies or runs it.
// The answers the clients got are then exactly 0..n-1, each once, and the
// backup's counter is n: every add applied once.
func TestForwardFailoverUnderLoad(t *testing.T) {
	var fails failures
	prim, back, pr, br, bmem, link := failoverPair(t, &fails)
	promoted := make(chan struct{})

	const clients = 4
	var (
		mu      sync.Mutex
		answers []uint64
		started sync.WaitGroup
		wg      sync.WaitGroup
	)
	started.Add(clients)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			ready := func() { once.Do(started.Done) }
			defer ready()
			sess := rdma.NewSession()
			cl, err := Dial(t.Context(), prim.addr, WithCredential([]byte("app@a")), WithSession(sess), WithBusyPoll(-1))
			if err != nil {
				t.Error(err)
				return
			}
			defer cl.Close()
			op := &rdma.Op{Kind: rdma.OpFetchAdd, Region: pr, Delta: 1}
			for i := 0; ; i++ {
				if i == 2*rdma.SessionSlots { // every slot has run at the backup
					ready()
				}
				tk, err := sess.Acquire(t.Context())
				if err != nil {
					t.Error(err)
					return
				}
				op.Once = tk
				if err := cl.Do(t.Context(), op); err != nil {
					if !errors.Is(err, rdma.ErrClosed) {
						t.Error(err)
						return
					}
					break
				}
				tk.Release()
				mu.Lock()
				answers = append(answers, op.Prev)
				mu.Unlock()
			}
			// The primary is gone: once the backup is promoted, send the
			// unanswered op there.
			select {
			case <-promoted:
			case <-t.Context().Done():
				return
			}
			bc, err := Dial(t.Context(), back.addr, WithCredential([]byte("app@b")), WithSession(sess), WithBusyPoll(-1))
			if err != nil {
				t.Error(err)
				return
			}
			defer bc.Close()
			op.Region = br
			if err := bc.Do(t.Context(), op); err != nil {
				t.Errorf("the retry at the backup: %v", err)
				return
			}
			op.Once.Release()
			mu.Lock()
			answers = append(answers, op.Prev)
			mu.Unlock()
		}()
	}
	within(t, "clients' first ops", started.Wait)
	require.NoError(t, prim.Close())
	// The backup is promoted once the dead primary's link is gone and
	// every forwarded op that reached it was applied, as a daemon
	// promotes it only after its failure detection, seconds later: a
	// retry must not overtake its own forward.
	require.NoError(t, link.Close())
	require.Eventually(t, func() bool { return back.nconns.Load() == 0 }, 10*time.Second, time.Millisecond, "the link's connections at the backup end")
	close(promoted)
	within(t, "clients failing over", wg.Wait)
	require.False(t, t.Failed())
	require.Empty(t, fails.count(), "%v", fails.errs)
	slices.Sort(answers)
	for i, a := range answers {
		require.EqualValues(t, i, a, "answer %d of %d", i, len(answers))
	}
	require.EqualValues(t, len(answers), le.Uint64(bmem), "every add applied once at the backup")
}

// copiedSpare starts a spare whose segment 1 is exported by ExportCopy,
// filled with pmem's bytes, and joins the primary's forwarding over a
// link as principal "poold/a"; join (Server.Join) is called once the
// forwarding is set.
func copiedSpare(t *testing.T, prim *testServer, pmem []byte, fails *failures) (spare *testServer, smem []byte, sr rdma.Region) {
	t.Helper()
	cfg := fwdConfig()
	cfg.Identify = principalAt
	spare = startServer(t, cfg)
	smem = mapMem(t, len(pmem))
	key, err := spare.ExportCopy(1, smem, 1)
	require.NoError(t, err)
	sr = rdma.Region{Segment: 1, Key: key, Epoch: 1}
	require.NoError(t, spare.Allow(1, []string{"app", "poold/a"}))
	copy(smem, pmem)
	link := dial(t, spare.addr, WithCredential([]byte("poold/a@b")), WithBusyPoll(-1))
	require.NoError(t, prim.Forward(1, &Forwarding{Mode: ForwardCopy, Targets: []ForwardTarget{{Conn: link, Region: sr}}, OnFail: fails.onFail}))
	require.NoError(t, spare.Join(1))
	return spare, smem, sr
}

// TestRetryAtCopiedHomeIndeterminate: a copy filled by copying the
// primary's memory (ExportCopy) holds the effect of every op the primary
// applied before it joined the forwarding, but no answer of theirs. Once
// an origin block of another slot opened the client's session there (its
// slots known at seq 0), a RETRY of such an op at the copy, promoted after
// the primary died, must not run a second time: it answers INDETERMINATE.
func TestRetryAtCopiedHomeIndeterminate(t *testing.T) {
	var fails failures
	cfg := fwdConfig()
	cfg.Identify = principalAt
	prim := startServer(t, cfg)
	pmem, pr := prim.export(t, 1, 4096)
	require.NoError(t, prim.Allow(1, []string{"app"}))

	sess := rdma.NewSession()
	app := dial(t, prim.addr, WithCredential([]byte("app@a")), WithSession(sess), WithBusyPoll(-1))
	ctx := t.Context()
	// A FADD the primary applies while it has no target; the client never
	// sees the answer (its connection is cut).
	lost := &rdma.Op{Kind: rdma.OpFetchAdd, Region: pr, Delta: 1}
	tk := doOnce(t, app, sess, lost)
	require.EqualValues(t, 1, le.Uint64(pmem))

	spare, smem, sr := copiedSpare(t, prim, pmem, &fails)

	// Another op of the client's session (another slot) is forwarded: the
	// spare opens the session, every slot known.
	tk2 := doOnce(t, app, sess, &rdma.Op{Kind: rdma.OpFetchAdd, Region: pr, Offset: 8, Delta: 1})
	require.NotEqual(t, tk.Slot, tk2.Slot)
	tk2.Release()

	// The primary dies; the spare takes its place; the client retries the
	// FADD whose answer it never had, with RETRY and the same ticket.
	require.NoError(t, prim.Close())
	app2 := dial(t, spare.addr, WithCredential([]byte("app@b")), WithSession(sess), WithBusyPoll(-1))
	lost.Region, lost.Prev = sr, 0
	err := app2.Do(ctx, lost)
	tk.Release()
	require.ErrorIs(t, err, rdma.ErrIndeterminate, "the retry ran again at the copy (prev %d)", lost.Prev)
	require.EqualValues(t, 1, le.Uint64(smem))
	require.Empty(t, fails.count())
}

// TestRetryAtCopiedHomeAfterJoinRuns: at a copy that joined, a RETRY whose
// slot recorded an op there since the join runs (its seq came after that
// op's, so had the primary applied it, it would have been forwarded), and
// is answered from the cache when its forward arrived.
func TestRetryAtCopiedHomeAfterJoinRuns(t *testing.T) {
	var fails failures
	cfg := fwdConfig()
	cfg.Identify = principalAt
	prim := startServer(t, cfg)
	pmem, pr := prim.export(t, 1, 4096)
	require.NoError(t, prim.Allow(1, []string{"app"}))
	spare, smem, sr := copiedSpare(t, prim, pmem, &fails)

	sess := rdma.NewSession()
	app := dial(t, prim.addr, WithCredential([]byte("app@a")), WithSession(sess), WithBusyPoll(-1))
	ctx := t.Context()
	// One op on the slot after the join: forwarded, recorded at the copy.
	tk := doOnce(t, app, sess, &rdma.Op{Kind: rdma.OpFetchAdd, Region: pr, Delta: 1})
	tk.Release()
	require.EqualValues(t, 1, le.Uint64(smem))

	// The slot's next op never reached the primary, which dies; its retry
	// at the copy runs once, and a repeat is answered from the cache.
	require.NoError(t, prim.Close())
	slot := tk.Slot
	for tk = nil; tk == nil; {
		next, ok := sess.TryAcquire()
		require.True(t, ok)
		defer next.Release()
		if next.Slot == slot {
			tk = next
		}
	}
	tk.Post() // sent to the primary, which never received it
	app2 := dial(t, spare.addr, WithCredential([]byte("app@b")), WithSession(sess), WithBusyPoll(-1))
	for range 2 {
		retry := &rdma.Op{Kind: rdma.OpFetchAdd, Region: sr, Delta: 1, Once: tk}
		require.NoError(t, app2.Do(ctx, retry))
		require.EqualValues(t, 1, retry.Prev)
	}
	require.EqualValues(t, 2, le.Uint64(smem))
	require.Empty(t, fails.count())
}

// TestForwardSlowTargetKept: a target that is slow but keeps answering is
// waited for, however long the forward of a large write takes in all,
// and one that stops answering is still reported to OnFail. With a
// ForwardTimeout of 200ms:
//   - parity: a 2 MiB write cut into 4 KiB ops (as a client cuts a write
//     of an erasure-coded segment at its chunks), whose deltas queue for
//     the 128 exactly-once slots of the link to a parity home that
//     answers one op per 4ms: the last ones wait far longer than the
//     timeout for a slot and their answer, while answers keep coming;
//     then the parity home stops answering, and the next write's forward
//     fails it;
//   - copy: one 16 MiB write forwarded through a proxy that passes the
//     bytes at 16 MiB/s, so that no answer comes for a second.
func TestForwardSlowTargetKept(t *testing.T) {
	const timeout = 200 * time.Millisecond
	t.Run("parity", func(t *testing.T) {
		const k, m, size, piece = 2, 1, 2 << 20, 4096
		var slow, held atomic.Bool
		release := make(chan struct{})
		pcfg := fwdConfig()
		pcfg.Observe = func(Observation) {
			if slow.Load() {
				time.Sleep(4 * time.Millisecond)
			}
			if held.Load() {
				<-release
			}
		}
		cfg := fwdConfig()
		cfg.ForwardTimeout = timeout
		data := homesWith(t, cfg, k, 1, size)
		parity := homesWith(t, pcfg, m, 1, size)
		t.Cleanup(func() { close(release) }) // before the servers close
		var fails failures
		for i, d := range data {
			link := dial(t, parity[0].srv.addr, WithConns(1), WithBusyPoll(-1))
			require.NoError(t, d.srv.Forward(1, &Forwarding{
				Mode: ForwardParity, Shard: i, DataShards: k, ParityShards: m,
				Targets: []ForwardTarget{{Conn: link, Region: parity[0].r}}, OnFail: fails.onFail,
			}))
		}
		want := make([]byte, size)
		for i := range want {
			want[i] = byte(rand.Uint32())
		}
		c := dial(t, data[0].srv.addr, WithBusyPoll(-1))
		ops := make([]*rdma.Op, 0, size/piece)
		for off := 0; off < size; off += piece {
			ops = append(ops, &rdma.Op{Kind: rdma.OpWrite, Region: data[0].r, Offset: int64(off), Buf: want[off : off+piece]})
		}
		slow.Store(true)
		require.NoError(t, c.Do(t.Context(), ops...))
		slow.Store(false)
		require.Empty(t, fails.count(), "the slow parity home was failed")
		requireParity(t, data, parity)

		held.Store(true)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		require.NoError(t, c.Write(ctx, data[0].r, 0, []byte("its parity home stopped answering")), "answered OK without the silent target")
		require.Equal(t, map[int]int{0: 1}, fails.count(), "the silent parity home was failed")
		require.ErrorIs(t, fails.errs[0], context.DeadlineExceeded)
	})
	t.Run("copy", func(t *testing.T) {
		const size = 16 << 20
		cfg := fwdConfig()
		cfg.ForwardTimeout = timeout
		hs := homesWith(t, cfg, 2, 1, size)
		px, err := faultproxy.Start(faultproxy.Config{
			Target: hs[1].srv.addr,
			Record: func(fromClient bool, p []byte) {
				if fromClient {
					time.Sleep(time.Duration(len(p)) * time.Second / (16 << 20))
				}
			},
		})
		require.NoError(t, err)
		defer px.Close()
		var fails failures
		link := dial(t, px.Addr(), WithConns(1), WithBusyPoll(-1))
		require.NoError(t, hs[0].srv.Forward(1, &Forwarding{Mode: ForwardCopy, Targets: []ForwardTarget{{Conn: link, Region: hs[1].r}}, OnFail: fails.onFail}))
		want := make([]byte, size)
		for i := range want {
			want[i] = byte(rand.Uint32())
		}
		c := dial(t, hs[0].srv.addr, WithBusyPoll(-1))
		require.NoError(t, c.Write(t.Context(), hs[0].r, 0, want))
		require.Empty(t, fails.count(), "the slow copy was failed")
		require.True(t, equalBytes(want, hs[1].mem), "the copy holds the write")
	})
}

// doOnce runs op at c as an exactly-once op of sess (a ticket of its own)
// and returns the ticket, which the caller releases or keeps for a retry.
func doOnce(t *testing.T, c *Client, sess *rdma.Session, op *rdma.Op) *rdma.Ticket {
	t.Helper()
	tk, err := sess.Acquire(t.Context())
	require.NoError(t, err)
	op.Once = tk
	require.NoError(t, c.Do(t.Context(), op))
	return tk
}

// TestForwardOriginNamesSegmentClient: a forwarder may speak, in a
// forwarded op's origin block, only for the clients of the segment it
// forwards: the answer of an op whose origin names another principal is
// not kept (the op is applied: a home not told of a later attacher must
// not fail its forwarder), so a peer cannot plant an answer in another
// client's reply cache, which that client's next op on its own segment
// here would get instead of running.
func TestForwardOriginNamesSegmentClient(t *testing.T) {
	cfg := ServerConfig{BusyPoll: -1}
	cfg.Identify = func(cred []byte, _ *x509.Certificate) (string, string, error) { return string(cred), "", nil }
	cfg.Forwarders = func(p string) bool { return strings.HasPrefix(p, "poold/") }
	s := startServer(t, cfg)
	_, peerSeg := s.export(t, 1, 4096)
	require.NoError(t, s.Allow(1, []string{"poold/b"}))
	require.NoError(t, s.AllowReaders(1, []string{"app"}))
	vmem, victimSeg := s.export(t, 2, 4096)
	require.NoError(t, s.Allow(2, []string{"victim"}))
	vsid := [sessionIDSize]byte{0x77}

	peer := rawConn(t, s.addr)
	_, err := peer.Write(appendHello(nil, hello{version: Version, cred: []byte("poold/b"), session: [sessionIDSize]byte{1}}))
	require.NoError(t, err)
	require.Equal(t, replyAccept, readReply(t, peer).code)
	forward := func(id uint64, seq uint32, client string) uint16 {
		org := appendOrigin(nil, &origin{key: sessionKey{name: "p:" + client, id: vsid}, slot: 3, seq: 1})
		f := reqHeader{id: id, op: opWrite, flags: reqFlagOnce | reqFlagForward, slot: 0, seq: seq, seg: 1, key: peerSeg.Key, epoch: 1, length: 1, payloadLen: uint32(len(org) + 1)}
		_, err := peer.Write(append(append(requestFrame(t, &f), org...), 'x'))
		require.NoError(t, err)
		return readResponse(t, peer).status
	}
	require.Equal(t, statusOK, forward(1, 1, "victim"), "victim may not use segment 1: applied, its answer not kept")
	require.Equal(t, statusOK, forward(2, 2, "app"), "app, a reader of segment 1, may be spoken for")

	vc := rawConn(t, s.addr)
	_, err = vc.Write(appendHello(nil, hello{version: Version, cred: []byte("victim"), session: vsid, resume: true}))
	require.NoError(t, err)
	require.Equal(t, replyAccept, readReply(t, vc).code)
	w := reqHeader{id: 1, op: opWrite, flags: reqFlagOnce, slot: 3, seq: 1, seg: 2, key: victimSeg.Key, epoch: 1, length: 4, payloadLen: 4}
	_, err = vc.Write(append(requestFrame(t, &w), "data"...))
	require.NoError(t, err)
	require.Equal(t, statusOK, readResponse(t, vc).status)
	require.Equal(t, "data", string(vmem[:4]), "the victim's write ran")
}

// TestForwardDoesNotWaitForClientSlot: a client that holds a slot of its
// session at a copy's home (an op of its own whose payload it sends
// slowly) does not hold up the forwarder's connection there, which
// carries every client's forwarded ops: the forwarded op that names that
// slot is answered, and so is the next op on the link, while the client's
// op still waits for its payload; the answer reaches the slot after.
func TestForwardDoesNotWaitForClientSlot(t *testing.T) {
	cfg := ServerConfig{BusyPoll: -1, FrameTimeout: time.Minute}
	cfg.Identify = func(cred []byte, _ *x509.Certificate) (string, string, error) { return string(cred), "", nil }
	cfg.Forwarders = func(p string) bool { return strings.HasPrefix(p, "poold/") && !strings.Contains(p[6:], "/") }
	s := startServer(t, cfg)
	_, copySeg := s.export(t, 1, 4096)
	require.NoError(t, s.Allow(1, []string{"poold/a"}))
	require.NoError(t, s.AllowReaders(1, []string{"poold/b/app"}))
	_, otherSeg := s.export(t, 2, 4096)

	sid := [sessionIDSize]byte{0xAA}
	slow := rawConn(t, s.addr)
	_, err := slow.Write(appendHello(nil, hello{version: Version, cred: []byte("poold/b/app"), session: sid}))
	require.NoError(t, err)
	require.Equal(t, replyAccept, readReply(t, slow).code)
	h := reqHeader{id: 1, op: opWrite, flags: reqFlagOnce, slot: 5, seq: 1, seg: 999, length: 1000, payloadLen: 1000}
	_, err = slow.Write(append(requestFrame(t, &h), 0)) // one payload byte, then silence
	require.NoError(t, err)
	sess := s.sessions.openForwarded(sessionKey{name: "p:poold/b/app", id: sid})
	require.Eventually(t, func() bool {
		if sess.slots[5].mu.TryLock() {
			sess.slots[5].mu.Unlock()
			return false
		}
		return true
	}, 20*time.Second, time.Millisecond, "the slow op holds slot 5")

	peer := rawConn(t, s.addr)
	_, err = peer.Write(appendHello(nil, hello{version: Version, cred: []byte("poold/a"), session: [sessionIDSize]byte{1}}))
	require.NoError(t, err)
	require.Equal(t, replyAccept, readReply(t, peer).code)
	org := appendOrigin(nil, &origin{key: sessionKey{name: "p:poold/b/app", id: sid}, slot: 5, seq: 1})
	f1 := reqHeader{id: 1, op: opWrite, flags: reqFlagOnce | reqFlagForward, slot: 0, seq: 1, seg: 1, key: copySeg.Key, epoch: 1, length: 4, payloadLen: uint32(len(org) + 4)}
	f2 := reqHeader{id: 2, op: opWrite, seg: 2, key: otherSeg.Key, epoch: 1, length: 4, payloadLen: 4}
	frames := append(append(requestFrame(t, &f1), org...), "data"...)
	frames = append(append(frames, requestFrame(t, &f2)...), "data"...)
	_, err = peer.Write(frames)
	require.NoError(t, err)
	require.NoError(t, peer.SetReadDeadline(time.Now().Add(30*time.Second))) // the slow op waits a minute
	require.Equal(t, statusOK, readResponse(t, peer).status)
	require.Equal(t, statusOK, readResponse(t, peer).status)

	// Many more forwarded answers for the held slot cost one waiting
	// goroutine, not one each; the newest is kept.
	before := runtime.NumGoroutine()
	const more = 500
	frames = nil
	for i := range uint32(more) {
		org := appendOrigin(nil, &origin{key: sessionKey{name: "p:poold/b/app", id: sid}, slot: 5, seq: i + 2})
		f := reqHeader{id: uint64(i + 3), op: opWrite, flags: reqFlagOnce | reqFlagForward, slot: 0, seq: i + 2, seg: 1, key: copySeg.Key, epoch: 1, length: 4, payloadLen: uint32(len(org) + 4)}
		frames = append(append(append(frames, requestFrame(t, &f)...), org...), "data"...)
	}
	go peer.Write(frames)
	for range more {
		require.Equal(t, statusOK, readResponse(t, peer).status)
	}
	require.Less(t, runtime.NumGoroutine()-before, 10, "goroutines waiting for one held slot")

	slow.Close() // its op ends; the newest forwarded answer reaches slot 5
	require.Eventually(t, func() bool {
		sl := &sess.slots[5]
		if !sl.mu.TryLock() {
			return false
		}
		defer sl.mu.Unlock()
		return sl.known && sl.seq == more+1
	}, 20*time.Second, time.Millisecond)
}
