package alloc

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// fakeHomes is a redundant segment whose homes are in-process tcp data
// planes, each serving one slice of memory: the client side alone, with
// no daemon to place, forward or promote. The test plays the daemon's
// part (it fills the copies and the parity itself).
type fakeHomes struct {
	seg   *Segment
	srvs  []*tcp.Server
	homes []*poolv1.SegmentHome
}

// home is the bytes of home i at off, read through its data plane (the
// race detector sees no order between this goroutine and the server's
// through a socket, so the test never touches the memory itself).
func (f *fakeHomes) home(t *testing.T, i int, off int64, n int) []byte {
	p := make([]byte, n)
	f.do(t, i, func(cl *tcp.Client, r rdma.Region) error { return cl.Read(t.Context(), r, off, p) })
	return p
}

// put writes p at off of home i through its data plane.
func (f *fakeHomes) put(t *testing.T, i int, off int64, p []byte) {
	f.do(t, i, func(cl *tcp.Client, r rdma.Region) error { return cl.Write(t.Context(), r, off, p) })
}

// fillParity writes the parity shards of an ErasureCoded(k, m) segment,
// encoded from the first n bytes of its data homes, to its parity homes:
// the data homes' work, done by the test.
func (f *fakeHomes) fillParity(t *testing.T, k, m, n int) {
	enc, err := reedsolomon.New(k, m)
	require.NoError(t, err)
	shards := make([][]byte, k+m)
	for i := range shards {
		shards[i] = f.home(t, i, 0, n)
	}
	require.NoError(t, enc.Encode(shards))
	for i := k; i < k+m; i++ {
		f.put(t, i, 0, shards[i])
	}
}

// randomBytes is n bytes of a generator seeded with seed.
func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, seed+1))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func (f *fakeHomes) do(t *testing.T, i int, fn func(*tcp.Client, rdma.Region) error) {
	h := f.homes[i]
	cl, err := tcp.Dial(t.Context(), h.DataAddr)
	require.NoError(t, err)
	defer cl.Close()
	r := rdma.Region{Segment: h.HomeId, Epoch: h.Epoch}
	copy(r.Key[:], h.Key)
	require.NoError(t, fn(cl, r))
}

// startFakeHomes makes a segment of spec whose every home serves homeSize
// bytes with cfg, opened through a client of a real in-process daemon
// (whose Stat does not know the segment: refreshes change nothing).
func startFakeHomes(t *testing.T, spec Redundancy, homeSize int64, size int64, cfg tcp.ServerConfig) *fakeHomes {
	return startFakeHomesAs(t, spec, homeSize, size, cfg, nil, nil)
}

// startFakeHomesAs is startFakeHomes with the client's daemon API wrapped
// by api (nil: as it is) and the segment's description changed by setup
// (nil: none) before the client opens it.
func startFakeHomesAs(t *testing.T, spec Redundancy, homeSize int64, size int64, cfg tcp.ServerConfig,
	api func(poolv1.PoolClient) poolv1.PoolClient, setup func(*poolv1.Segment)) *fakeHomes {
	pcfg := pooltest.Config(t)
	pooltest.Start(t, pcfg)
	c, err := Dial(t.Context(), pcfg.Socket, WithOpTimeout(3*time.Second), WithFailoverTimeout(500*time.Millisecond), func(o *dialOptions) {
		if api != nil {
			o.api = api
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	f := &fakeHomes{}
	info := &poolv1.Segment{Id: 1 << 40, Tier: poolv1.Tier_TIER_RDMA, Size: size, Redundancy: spec.proto(), ShardChunk: 4096,
		RedundancyState: poolv1.RedundancyState_REDUNDANCY_STATE_OK}
	for i := range spec.spec.Homes() {
		srv := tcp.NewServer(cfg)
		mem := make([]byte, homeSize)
		key, err := srv.Export(uint64(100+i), mem, 1)
		require.NoError(t, err)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
		f.srvs = append(f.srvs, srv)
		info.Homes = append(info.Homes, &poolv1.SegmentHome{Node: fmt.Sprintf("h%d", i), HomeId: uint64(100 + i), DataAddr: l.Addr().String(), Key: key[:], Epoch: 1})
	}
	f.homes = info.Homes
	info.Node, info.HomeId = info.Homes[0].Node, info.Homes[0].HomeId
	if setup != nil {
		setup(info)
	}
	f.seg, err = c.open(t.Context(), "", info, allocConfig{})
	require.NoError(t, err)
	return f
}

// TestCopiesReadFailOver: reads of a Replicas(3) segment go to the
// primary; with the primary's and then the first backup's data plane
// gone, they come from the next copy without an error, and Redundancy
// names the homes.
func TestCopiesReadFailOver(t *testing.T) {
	f := startFakeHomes(t, Replicas(3), 1<<16, 1<<16, tcp.DefaultConfig())
	for i := range 3 {
		f.put(t, i, 0, bytes.Repeat([]byte{byte('a' + i)}, 1<<16))
	}
	buf := make([]byte, 4096)
	read := func(want byte) {
		t.Helper()
		n, err := f.seg.ReadAt(buf, 8192)
		require.NoError(t, err)
		require.Equal(t, 4096, n)
		require.Equal(t, bytes.Repeat([]byte{want}, 4096), buf)
	}
	read('a')
	_, err := f.seg.WriteAt([]byte("to the primary"), 0)
	require.NoError(t, err)
	require.Equal(t, "to the primary", string(f.home(t, 0, 0, 14)))
	require.Equal(t, "bbbbbbbbbbbbbb", string(f.home(t, 1, 0, 14)), "the client writes the primary only")
	v, err := f.seg.Add64(64, 5)
	require.NoError(t, err)
	require.Equal(t, binary.LittleEndian.Uint64(bytes.Repeat([]byte{'a'}, 8))+5, v)
	f.srvs[0].Close()
	read('b')
	f.srvs[1].Close()
	read('c')
	st := f.seg.Redundancy()
	require.Equal(t, "replicas=3", st.Asked.String())
	require.Equal(t, []HomeStatus{{"h0", "primary", 0, "ok"}, {"h1", "backup", 1, "ok"}, {"h2", "backup", 2, "ok"}}, st.Homes)
	require.Equal(t, "h0", f.seg.Node())
}

// TestCopiesReadFailOverFromHungHome: a primary that accepts connections
// and never answers holds a read for WithFailoverTimeout (500 ms here),
// then the read comes from the backup, well within WithOpTimeout (3 s),
// after which the read would fail; later reads skip the hung home.
func TestCopiesReadFailOverFromHungHome(t *testing.T) {
	f := startFakeHomes(t, Replicas(2), 4096, 4096, tcp.DefaultConfig())
	f.put(t, 1, 0, []byte("backup"))
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var held []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() {
		hung.Close()
		<-accepted
		for _, c := range held {
			c.Close()
		}
	})
	r := f.seg.base().(*redundant)
	info := proto.Clone(r.info).(*poolv1.Segment)
	info.Homes[0].DataAddr = hung.Addr().String()
	v, err := r.newView(info)
	require.NoError(t, err)
	r.view.Store(v)
	buf := make([]byte, 6)
	for i := range 3 {
		_, err := f.seg.ReadAt(buf, 0)
		require.NoError(t, err, "read %d", i)
		require.Equal(t, "backup", string(buf))
	}
}

// TestCodedLayoutAndDegradedRead: an ErasureCoded(4, 2) segment's bytes
// lie on the data shards as the layout says (chunk c on shard c%4 at
// c/4*4096); reads and writes that cross chunks and stripes read back;
// atomics land on the word's data shard; with the parity filled in (the
// data homes' work, done by the test) and two data homes' data planes
// gone, every byte still reads back, decoded from the others.
func TestCodedLayoutAndDegradedRead(t *testing.T) {
	const k, m, chunk, stripes = 4, 2, 4096, 4
	const size = k * chunk * stripes
	f := startFakeHomes(t, ErasureCoded(k, m), chunk*stripes, size, tcp.DefaultConfig())
	want := randomBytes(size, 1)
	for _, w := range []struct{ off, n int }{{0, size}, {100, 5000}, {chunk*5 - 3, chunk*6 + 7}, {size - 10, 10}} {
		_, err := f.seg.WriteAt(want[w.off:w.off+w.n], int64(w.off))
		require.NoError(t, err)
	}
	v, err := f.seg.Add64(chunk*6+8, 1)
	require.NoError(t, err)
	binary.LittleEndian.PutUint64(want[chunk*6+8:], binary.LittleEndian.Uint64(want[chunk*6+8:])+1)
	require.Equal(t, binary.LittleEndian.Uint64(want[chunk*6+8:]), v)
	for c := range size / chunk {
		shard, at := c%k, c/k*chunk
		require.Equal(t, want[c*chunk:(c+1)*chunk], f.home(t, shard, int64(at), chunk), "chunk %d on data shard %d at %d", c, shard, at)
	}
	got := make([]byte, size)
	_, err = f.seg.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, want, got)

	f.fillParity(t, k, m, chunk*stripes)
	f.srvs[1].Close()
	f.srvs[3].Close()
	for _, rd := range []struct{ off, n int }{{0, size}, {chunk + 17, 100}, {chunk*3 - 5, chunk*2 + 9}} {
		clear(got)
		_, err = f.seg.ReadAt(got[:rd.n], int64(rd.off))
		require.NoError(t, err, "degraded read of %d bytes at %d", rd.n, rd.off)
		require.Equal(t, want[rd.off:rd.off+rd.n], got[:rd.n], "degraded read of %d bytes at %d", rd.n, rd.off)
	}
	require.NoError(t, f.seg.ReadBatch(t.Context(), []Span{{Off: chunk, Buf: got[:chunk]}, {Off: 0, Buf: got[chunk : 2*chunk]}}))
	require.Equal(t, want[chunk:2*chunk], got[:chunk])
	require.Equal(t, want[:chunk], got[chunk:2*chunk])
	st := f.seg.Redundancy()
	require.Equal(t, "ec=4+2", st.Asked.String())
	require.Equal(t, HomeStatus{"h5", "parity", 1, "ok"}, st.Homes[5])
}

// TestRedundantNotMoved: Move refuses a redundant segment before asking
// the daemon, with ErrNotSupported, as the daemon would.
func TestRedundantNotMoved(t *testing.T) {
	f := startFakeHomes(t, Replicas(2), 4096, 4096, tcp.DefaultConfig())
	err := f.seg.c.Move(t.Context(), f.seg)
	require.ErrorIs(t, err, ErrNotSupported)
	require.ErrorContains(t, err, "it is redundant (replicas=2)")
}

// TestRefusedTicketRetried: a write whose ticket was posted before (to a
// primary that died without answering) and that the promoted primary
// refuses while it is still read-only (its daemon has not told it yet)
// is retried with the same ticket: the home does not cache the refusal,
// so it is not repeated to every retry until the operation timeout (3 s
// here), and once the home takes writes the add is applied once.
func TestRefusedTicketRetried(t *testing.T) {
	cfg := tcp.DefaultConfig()
	cfg.Identify = func([]byte, *x509.Certificate) (string, string, error) { return "app", "", nil }
	f := startFakeHomes(t, Replicas(2), 4096, 4096, cfg)
	r := f.seg.base().(*redundant)
	home := f.homes[0].HomeId
	require.NoError(t, f.srvs[0].AllowReaders(home, []string{"app"}))
	tk, err := r.c.failover.Acquire(t.Context())
	require.NoError(t, err)
	tk.Post() // as if sent to a primary that died before it answered
	op := &rdma.Op{Kind: rdma.OpFetchAdd, Offset: 0, Delta: 2, Once: tk}
	writable := time.AfterFunc(300*time.Millisecond, func() { f.srvs[0].AllowReaders(home, nil) })
	defer writable.Stop()
	require.NoError(t, r.run(t.Context(), []*rdma.Op{op}, r.atPrimary))
	require.Zero(t, op.Prev)
	require.Equal(t, uint64(2), binary.LittleEndian.Uint64(f.home(t, 0, 0, 8)), "applied once")
}

// TestCodedChunkReadAllocs: a 4 KiB read within one chunk of an
// ErasureCoded(2, 1) segment allocates no more than one of a Replicas(2)
// segment (one op at one home, on the calling goroutine), and a degraded
// one, decoded from the other two shards read in order (decodeInOrder),
// no more than five times that (buffers and op lists pooled).
func TestCodedChunkReadAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items: allocation counts are meaningless")
	}
	copies := startFakeHomes(t, Replicas(2), 1<<16, 1<<16, tcp.DefaultConfig())
	coded := startFakeHomes(t, ErasureCoded(2, 1), 1<<15, 1<<16, tcp.DefaultConfig())
	buf := make([]byte, 4096)
	allocs := func(s *Segment, off int64) float64 {
		_, err := s.ReadAt(buf, off) // dials
		require.NoError(t, err)
		return testing.AllocsPerRun(200, func() {
			if _, err := s.ReadAt(buf, off); err != nil {
				t.Error(err)
			}
		})
	}
	want := allocs(copies.seg, 8192)
	require.LessOrEqual(t, allocs(coded.seg, 8192), want, "a coded read of one chunk allocates as a read of copies")

	require.NoError(t, coded.srvs[1].Close()) // data shard 1: chunks 1, 3, ...
	degraded := allocs(coded.seg, 4096)
	require.LessOrEqual(t, degraded, 5*want, "a degraded read of one chunk with no shard to spare: three shard reads in turn (the data shard, the parity shard, the data shard again) and the decode")
}

// TestCodedChunkWriteAllocs: a 4 KiB write within one chunk of an
// ErasureCoded(2, 1) segment allocates no more than one of a Replicas(2)
// segment: one pooled op at the chunk's data home, on the calling
// goroutine (the homes here forward nothing: this is the client's part).
func TestCodedChunkWriteAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items: allocation counts are meaningless")
	}
	copies := startFakeHomes(t, Replicas(2), 1<<16, 1<<16, tcp.DefaultConfig())
	coded := startFakeHomes(t, ErasureCoded(2, 1), 1<<15, 1<<16, tcp.DefaultConfig())
	buf := make([]byte, 4096)
	allocs := func(s *Segment) float64 {
		_, err := s.WriteAt(buf, 8192) // dials
		require.NoError(t, err)
		return testing.AllocsPerRun(200, func() {
			if _, err := s.WriteAt(buf, 8192); err != nil {
				t.Error(err)
			}
		})
	}
	require.LessOrEqual(t, allocs(coded.seg), allocs(copies.seg), "a coded write of one chunk allocates as a write of copies")
}

// codedFake is an ErasureCoded(k, m) segment of fake homes with chunks of
// chunk bytes and stripes stripes, written with random bytes of seed
// (returned) and its parity filled.
func codedFake(t *testing.T, k, m, chunk, stripes int, seed uint64) (*fakeHomes, []byte) {
	size := k * chunk * stripes
	f := startFakeHomes(t, ErasureCoded(k, m), int64(chunk*stripes), int64(size), tcp.DefaultConfig())
	want := randomBytes(size, seed)
	_, err := f.seg.WriteAt(want, 0)
	require.NoError(t, err)
	f.fillParity(t, k, m, chunk*stripes)
	return f, want
}

// TestDegradedReadNextShard: a degraded read whose first pick of shards
// to decode from holds one that fails too reads another in its place
// (into the buffer slot the failed one had) and decodes the right bytes.
// ErasureCoded(2, 2), both data homes gone: a read on data shard 0
// tries shard 0, then decodes from shards 1 and 2, and, shard 1 failing,
// from 2 and 3.
func TestDegradedReadNextShard(t *testing.T) {
	const k, m, chunk, stripes = 2, 2, 4096, 2
	f, want := codedFake(t, k, m, chunk, stripes, 3)
	f.srvs[0].Close()
	f.srvs[1].Close()
	for _, c := range []int{0, 2} { // the chunks on data shard 0
		got := make([]byte, chunk-10)
		_, err := f.seg.ReadAt(got, int64(c*chunk+5))
		require.NoError(t, err, "degraded read of chunk %d", c)
		require.Equal(t, want[c*chunk+5:(c+1)*chunk-5], got, "degraded read of chunk %d", c)
	}
}

// TestDegradedReadUnderWrites: a degraded read decodes a lost data shard
// from the others while writes to the other data shard of the same
// stripes go on (their data homes apply them and forward the parity
// deltas, as a daemon's forwarding does). The lost shard's bytes never
// change, so every degraded read must return them: a decode from a data
// shard that holds a write whose parity delta has not reached the parity
// shard read with it (or the other way round) would return bytes nobody
// wrote.
//
// With ErasureCoded(2, 2) one shard more than the decode needs is left to
// check it with; with ErasureCoded(2, 1) exactly k are, and the reads are
// ordered instead.
func TestDegradedReadUnderWrites(t *testing.T) {
	for _, m := range []int{2, 1} {
		t.Run(fmt.Sprintf("ec=2+%d", m), func(t *testing.T) { degradedReadUnderWrites(t, m) })
	}
}

func degradedReadUnderWrites(t *testing.T, m int) {
	const k, chunk, stripes = 2, 4096, 2
	f, want := codedFake(t, k, m, chunk, stripes, 5)
	var targets []tcp.ForwardTarget
	for p := range m {
		h := f.homes[k+p]
		cl, err := tcp.Dial(t.Context(), h.DataAddr)
		require.NoError(t, err)
		t.Cleanup(func() { cl.Close() })
		r := rdma.Region{Segment: h.HomeId, Epoch: h.Epoch}
		copy(r.Key[:], h.Key)
		targets = append(targets, tcp.ForwardTarget{Conn: cl, Region: r})
	}
	require.NoError(t, f.srvs[1].Forward(f.homes[1].HomeId, &tcp.Forwarding{Mode: tcp.ForwardParity, Shard: 1, DataShards: k, ParityShards: m, Targets: targets}))
	require.NoError(t, f.srvs[0].Close()) // data shard 0: chunks 0 and 2

	got := make([]byte, chunk)
	read := func(i int) bool {
		c := 2 * (i % 2)
		_, err := f.seg.ReadAt(got, int64(c*chunk))
		return assert.NoError(t, err) && assert.True(t, bytes.Equal(want[c*chunk:(c+1)*chunk], got), "degraded read %d of chunk %d returned other bytes", i, c)
	}
	require.True(t, read(0) && read(1), "degraded reads with no write under way")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // writes to chunks 1 and 3, on data shard 1
		buf := make([]byte, chunk)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for j := range buf {
				buf[j] = byte(i + j)
			}
			if _, err := f.seg.WriteAt(buf, int64((1+2*(i%2))*chunk)); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for i := range 2000 {
		if !read(i) {
			break
		}
	}
	close(stop)
	wg.Wait()
}

// lostWrites is a daemon API that records WriteLostShard requests and
// answers them with err (nil: done).
type lostWrites struct {
	poolv1.PoolClient
	mu    sync.Mutex
	calls []*poolv1.WriteLostShardRequest
	err   error
	lose  bool // answer as a broken connection would
}

func (l *lostWrites) WriteLostShard(_ context.Context, req *poolv1.WriteLostShardRequest, _ ...grpc.CallOption) (*poolv1.WriteLostShardResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, proto.Clone(req).(*poolv1.WriteLostShardRequest))
	switch {
	case l.lose:
		return nil, status.Error(codes.Unavailable, "connection reset")
	case l.err != nil:
		return nil, errs.ToStatus(l.err)
	}
	return &poolv1.WriteLostShardResponse{Prev: 7}, nil
}

// sent are the requests recorded so far.
func (l *lostWrites) sent() []*poolv1.WriteLostShardRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// TestWritesToLostShard: ErasureCoded(2, 2) with data shard 0's home
// lost. A write over a chunk of shard 0 and one of shard 1 sends the
// first part to the daemon (WriteLostShard, at the offset in shard 0) and
// writes the second at shard 1's home; an atomic on shard 0 goes to the
// daemon too and returns its answer; a write the daemon cannot make fails
// at once with ErrUnavailable (asked once, not again until the
// operation's timeout), and an atomic whose answer is lost with
// ErrIndeterminate (sent once).
func TestWritesToLostShard(t *testing.T) {
	const k, m, chunk = 2, 2, 4096
	lw := &lostWrites{}
	f := startFakeHomesAs(t, ErasureCoded(k, m), 2*chunk, 2*k*chunk, tcp.DefaultConfig(),
		func(api poolv1.PoolClient) poolv1.PoolClient { lw.PoolClient = api; return lw },
		func(info *poolv1.Segment) {
			info.Homes[0].State = poolv1.HomeState_HOME_STATE_LOST
			info.RedundancyState = poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED
		})
	b := randomBytes(2*chunk, 7)
	_, err := f.seg.WriteAt(b[100:], 100) // chunk 0 (shard 0 at 0) from 100, chunk 1 (shard 1 at 0)
	require.NoError(t, err)
	sent := lw.sent()
	require.Len(t, sent, 1)
	require.Equal(t, []any{uint32(0), int64(100), b[100:chunk]}, []any{sent[0].Shard, sent[0].Offset, sent[0].Data})
	require.Equal(t, b[chunk:], f.home(t, 1, 0, chunk), "shard 1 written at its home")

	_, err = f.seg.WriteAt(b[:10], 2*chunk+5) // chunk 2: shard 0 at 4096
	require.NoError(t, err)
	sent = lw.sent()
	require.Len(t, sent, 2)
	require.Equal(t, []any{uint32(0), int64(chunk + 5), b[:10]}, []any{sent[1].Shard, sent[1].Offset, sent[1].Data})

	v, err := f.seg.Add64(2*chunk+8, 3) // shard 0 at 4104
	require.NoError(t, err)
	require.Equal(t, uint64(7+3), v, "the daemon's previous value plus the delta")
	sent = lw.sent()
	require.Len(t, sent, 3)
	require.Equal(t, []any{uint32(rdma.OpFetchAdd), int64(chunk + 8), uint64(3)}, []any{sent[2].Atomic, sent[2].Offset, sent[2].Delta})

	lw.mu.Lock()
	lw.err = fmt.Errorf("only k shards up: %w", ErrUnavailable)
	lw.mu.Unlock()
	_, err = f.seg.WriteAt(b[:10], 0)
	require.ErrorIs(t, err, ErrUnavailable)
	require.Len(t, lw.sent(), 4, "asked once")

	// An atomic whose answer is lost (no daemon's status) is indeterminate
	// and not sent again.
	lw.mu.Lock()
	lw.err = nil
	lw.lose = true
	lw.mu.Unlock()
	_, err = f.seg.CompareAndSwap64(8, 1, 2)
	require.ErrorIs(t, err, ErrIndeterminate)
	require.Len(t, lw.sent(), 5, "sent once")
}

// TestLostShardWriteNamesCause: a write to a data shard that the daemon
// cannot make says the shard's home is lost when the pool declared it
// lost, and that it does not answer now when the pool keeps it for its
// node's return (HOME_STATE_UNREACHABLE), which matches
// ErrHomeUnreachable; both match ErrUnavailable and are asked once.
func TestLostShardWriteNamesCause(t *testing.T) {
	const k, m, chunk = 2, 2, 4096
	for _, tc := range []struct {
		state  poolv1.HomeState
		answer error // the daemon's
		want   string
		not    string
	}{
		{poolv1.HomeState_HOME_STATE_LOST, fmt.Errorf("only k shards up: %w", errs.ErrTooFewHomes), "data shard is lost", "does not answer now"},
		{poolv1.HomeState_HOME_STATE_UNREACHABLE, fmt.Errorf("its home on h0 may return with its bytes; the write waits for it: %w", errs.ErrHomeUnreachable),
			"data shard does not answer now", "is lost"},
	} {
		t.Run(tc.state.String(), func(t *testing.T) {
			lw := &lostWrites{err: tc.answer}
			f := startFakeHomesAs(t, ErasureCoded(k, m), 2*chunk, 2*k*chunk, tcp.DefaultConfig(),
				func(api poolv1.PoolClient) poolv1.PoolClient { lw.PoolClient = api; return lw },
				func(info *poolv1.Segment) { info.Homes[0].State = tc.state })
			_, err := f.seg.WriteAt(make([]byte, 10), 0)
			t.Log(err)
			require.ErrorIs(t, err, ErrUnavailable)
			require.Contains(t, err.Error(), tc.want)
			require.NotContains(t, err.Error(), tc.not)
			if tc.state == poolv1.HomeState_HOME_STATE_UNREACHABLE {
				require.ErrorIs(t, err, errs.ErrHomeUnreachable)
			}
			require.Len(t, lw.sent(), 1, "asked once: the daemon's answer ends the call")
		})
	}
}

// statWrites is lostWrites whose daemon also answers Stat for the fake
// segment, with info as it is set up.
type statWrites struct {
	*lostWrites
	info *poolv1.Segment
}

func (s *statWrites) Stat(ctx context.Context, req *poolv1.StatRequest, o ...grpc.CallOption) (*poolv1.Segment, error) {
	if s.info != nil && req.Id == s.info.Id {
		return proto.Clone(s.info).(*poolv1.Segment), nil
	}
	return s.lostWrites.PoolClient.Stat(ctx, req, o...)
}

// lostShardRefusingWrites is an ErasureCoded(2, 2) segment of fake homes of
// two chunks whose data shard 0 is lost, and whose daemon refuses each
// write of it with ErrLimit (a home move of the segment finishing) while
// its Stat answers the same homes.
func lostShardRefusingWrites(t *testing.T) (*fakeHomes, *statWrites) {
	const k, m, chunk = 2, 2, 4096
	sw := &statWrites{lostWrites: &lostWrites{err: fmt.Errorf("a home move finishes: %w", ErrLimit)}}
	f := startFakeHomesAs(t, ErasureCoded(k, m), 2*chunk, 2*k*chunk, tcp.DefaultConfig(),
		func(api poolv1.PoolClient) poolv1.PoolClient { sw.PoolClient = api; return sw },
		func(info *poolv1.Segment) {
			info.Homes[0].State = poolv1.HomeState_HOME_STATE_LOST
			info.RedundancyState = poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED
			sw.info = proto.Clone(info).(*poolv1.Segment)
		})
	return f, sw
}

// TestLostShardWriteRefusalWaits: a write to a lost data shard that the
// daemon refuses with ErrLimit (a home move of the segment finishing)
// while its Stat answers the same homes is asked again after a wait that
// grows, not at once each round (each Stat gives a new view): until the
// operation's timeout it is sent a handful of times, not hundreds of
// thousands, and then fails with ErrLimit and ErrUnavailable.
func TestLostShardWriteRefusalWaits(t *testing.T) {
	f, sw := lostShardRefusingWrites(t)
	_, err := f.seg.WriteAt(make([]byte, 10), 0)
	require.ErrorIs(t, err, ErrLimit)
	require.ErrorIs(t, err, ErrUnavailable)
	// 3 s of waits from 20 ms doubling to 500 ms: about a dozen rounds.
	require.Less(t, len(sw.sent()), 100, "the refused write was sent again without a wait")
}
