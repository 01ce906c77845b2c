package pool

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// FuzzWriteLostShardRequest: a client's WriteLostShard request, as bytes,
// against an ec=4+2 segment of its own whose data shard 0 is lost and
// shard 2 unreachable (and one of another client's): it is refused with a
// sentinel the client can act on, or it names the lost data shard and 1
// to maxLostWrite bytes within it, or an aligned word of it for a
// compare-and-swap or fetch-and-add; never a panic. The seed corpus is
// testdata/fuzz/FuzzWriteLostShardRequest.
func FuzzWriteLostShardRequest(f *testing.F) {
	const size = 4 << 20
	for _, req := range []*poolv1.WriteLostShardRequest{
		{Id: 7, Shard: 0, Offset: 0, Data: []byte("x")},
		{Id: 7, Shard: 0, Offset: size/4 - 3, Data: []byte("abc")},
		{Id: 7, Shard: 1, Offset: 10, Data: []byte("home up")},
		{Id: 7, Shard: 4, Data: []byte("parity")},
		{Id: 7, Shard: 0, Offset: -1, Data: []byte("x")},
		{Id: 7, Shard: 0, Offset: 1<<63 - 1, Data: []byte("x")},
		{Id: 8, Shard: 0, Data: []byte("not mine")},
		{Id: 9, Shard: 0, Data: []byte("no such segment")},
		{Id: 7, Shard: 1 << 31, Data: nil},
		{Id: 7, Shard: 0, Offset: 64, Atomic: 4, Delta: 1},
		{Id: 7, Shard: 0, Offset: 64, Atomic: 3, Old: 1, New: 2},
		{Id: 7, Shard: 0, Offset: 60, Atomic: 4},
		{Id: 7, Shard: 0, Offset: size/4 - 8, Atomic: 2, Data: []byte("x")},
	} {
		b, err := proto.Marshal(req)
		require.NoError(f, err)
		f.Add(b)
	}
	cfg := testConfig(f)
	p := newTestPool(f, cfg)
	f.Cleanup(func() { p.close() })
	p.openSession("s", "fuzz-client", "", "fuzz", 1, 0)
	client, err := p.callerFor("s")
	require.NoError(f, err)
	homes := func() []homeRef {
		hs := make([]homeRef, 6)
		hs[0].State = poolv1.HomeState_HOME_STATE_LOST
		hs[2].State = poolv1.HomeState_HOME_STATE_UNREACHABLE
		return hs
	}
	p.mu.Lock()
	p.segs[7] = &record{ID: 7, Size: size, Owner: "fuzz-client", Redundancy: redundancy{Data: 4, Parity: 2}, Homes: homes()}
	p.segs[8] = &record{ID: 8, Size: size, Owner: "someone-else", Redundancy: redundancy{Data: 4, Parity: 2}, Homes: homes()}
	p.mu.Unlock()

	f.Fuzz(func(t *testing.T, b []byte) {
		var req poolv1.WriteLostShardRequest
		if proto.Unmarshal(b, &req) != nil {
			return // gRPC answers a malformed message before the handler
		}
		r, err := p.lostShardSubject(client, &req)
		if err != nil {
			for _, e := range []error{errs.ErrInvalid, errs.ErrOutOfRange, errs.ErrNotFound, errs.ErrAccessDenied, errs.ErrSegmentLost, errs.ErrUnavailable, errs.ErrUnaligned} {
				if errors.Is(err, e) {
					return
				}
			}
			t.Fatalf("lostShardSubject(%v) = %v, not a sentinel", &req, err)
		}
		n := lostWriteLen(&req)
		if r.ID != 7 || req.Shard != 0 || n < 1 || n > maxLostWrite || req.Offset < 0 || req.Offset+n > size/4 {
			t.Fatalf("accepted %d bytes at %d of shard %d of segment %d", n, req.Offset, req.Shard, r.ID)
		}
		if req.Atomic != 0 && (len(req.Data) > 0 || req.Offset%8 != 0 || req.Atomic != uint32(rdma.OpCompareAndSwap) && req.Atomic != uint32(rdma.OpFetchAdd)) {
			t.Fatalf("accepted atomic %d at %d with %d bytes", req.Atomic, req.Offset, len(req.Data))
		}
	})
}
